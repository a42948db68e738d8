# The e2e client suite's checks with Ruby's bunny (Debian's ruby-bunny): one
# JSON line per check and target, see e2e/clients_test.go.

require "bunny"
require "json"
require "logger"
require "stringio"

# The delays the suite asks for, in milliseconds (e2e/clients_expect_test.go).
DELAY_INT = 300
DELAY_STRING = "350"
DELAY_FLOAT = 400.7
DELAY_TOPIC = 300
DELAY_INT32 = 450
DELAY_TX = 300
ARRIVAL_TIMEOUT_MS = 20_000
# How many connections close_reopen closes with confirms in flight: a reset
# after close-ok comes in a third to a half of them.
CLOSE_ROUNDS = 10

ADDRS = {
  "direct" => ENV.fetch("CLIENT_DIRECT_ADDR"),
  "proxy" => ENV.fetch("CLIENT_PROXY_ADDR"),
  "proxy32" => ENV.fetch("CLIENT_PROXY32_ADDR"),
}.freeze

# connect opens a connection to target; bunny reads the vhost "/" of a URL
# as "%2f".
def connect(target, password: nil, vhost: "%2f", log: nil)
  url = "amqp://#{ENV.fetch("CLIENT_USER")}:#{password || ENV.fetch("CLIENT_PASSWORD")}@#{ADDRS[target]}/#{vhost}"
  Bunny.new(url, logger: Logger.new(log), automatically_recover: false).tap(&:start)
end

# login_refused connects with a wrong password: bunny raises
# AuthenticationFailureError without the reply, which it logs.
def login_refused(target)
  log = StringIO.new
  r = refusal { connect(target, password: "wrong", log: log).close }
  m = /Authentication with RabbitMQ failed: (\d+) (.*)$/.match(log.string)
  m ? { code: m[1].to_i, text: m[2] } : r
end

def name(target, suffix)
  "#{ENV.fetch("CLIENT_PREFIX")}.#{target}.#{suffix}"
end

def emit(check, target, result: nil, error: nil)
  line = { check: check, target: target }
  if error
    line[:error] = error
  else
    line[:result] = result
  end
  $stdout.puts JSON.generate(line)
  $stdout.flush
end

def run(check, target)
  emit(check, target, result: yield)
rescue StandardError => e
  emit(check, target, error: "#{e.class}: #{e.message}\n#{e.backtrace.first(5).join("\n")}")
end

def now_ms
  Process.clock_gettime(Process::CLOCK_MONOTONIC, :float_millisecond)
end

# error_of is the reply code and text a refusal carried.
def error_of(e)
  close = e.respond_to?(:channel_close) ? e.channel_close : nil
  close ||= e.respond_to?(:connection_close) ? e.connection_close : nil
  return { code: close.reply_code, text: close.reply_text } if close

  { code: nil, text: "#{e.class}: #{e.message}" }
end

def refusal
  yield
  { code: nil, text: "not refused" }
rescue StandardError => e
  error_of(e)
end

# x_delay is x-delay as amq-protocol decoded it: its text and Ruby class.
def x_delay(headers)
  return [nil, nil] if headers.nil? || !headers.key?("x-delay")

  v = headers["x-delay"]
  [v.to_s, v.class.name]
end

def server(target)
  c = connect(target)
  p = c.server_properties
  r = { product: p["product"], version: p["version"], channel_max: c.channel_max }
  c.close
  r
end

def delayed_exchange(ch, target, suffix, type)
  ch.exchange(name(target, suffix), type: "x-delayed-message", durable: true,
                                    arguments: { "x-delayed-type" => type })
end

# poll takes messages from q with basic.get until every message-id of want
# arrived, and 300 ms more: message-id => [arrival ms, headers].
def poll(q, want)
  got = {}
  deadline = now_ms + ARRIVAL_TIMEOUT_MS
  quiet_until = nil
  while now_ms < deadline
    di, props, = q.pop
    if di
      got[props.message_id] = [now_ms, props.headers]
      next
    end
    if (want - got.keys).empty?
      quiet_until ||= now_ms + 300
      break if now_ms >= quiet_until
    end
    sleep 0.01
  end
  got
end

def delayed(target, cases, emit_declare)
  c = connect(target)
  ch = c.create_channel
  exchanges = {}
  decl = {}
  { "direct" => "dx", "topic" => "dt" }.each do |type, suffix|
    exchanges[suffix] = delayed_exchange(ch, target, suffix, type)
    decl[type] = "ok"
  rescue StandardError => e
    decl[type] = error_of(e).to_s
    ch = c.create_channel
  end
  emit("declare", target, result: decl) if emit_declare
  ch.confirm_select
  q = ch.queue(name(target, "dq"), exclusive: true)
  q.bind(name(target, "dx"), routing_key: "k")
  q.bind(name(target, "dt"), routing_key: "a.#")
  sent = {}
  cases.each do |check, suffix, key, headers, _|
    t0 = now_ms
    ch.basic_publish("body of #{check}", name(target, suffix), key,
                     headers: headers, message_id: check, persistent: true)
    sent[check] = [t0, ch.wait_for_confirms]
  end
  got = poll(q, cases.reject { |cs| cs[4].nil? }.map(&:first))
  cases.each do |check, _, _, _, delay|
    next if delay.nil?

    t0, confirmed = sent[check]
    at, headers = got[check]
    value, type = x_delay(headers)
    r = { confirmed: confirmed, arrived: !at.nil?, elapsed_ms: at && at - t0,
          x_delay: value, x_delay_type: type }
    r[:unroutable_arrived] = got.key?("delay_topic_unroutable") if check == "delay_topic"
    emit(check, target, result: r)
  end
  c.close
rescue StandardError => e
  cases.each { |check, *, delay| emit(check, target, error: "#{e.class}: #{e.message}") unless delay.nil? }
end

def new_queue(ch)
  ch.queue("", exclusive: true)
end

def count_of(q)
  q.message_count
end

def get(ch)
  q = new_queue(ch)
  ch.default_exchange.publish("hello", routing_key: q.name)
  di, _, body = q.pop
  message_count = q.message_count # bunny's basic.get-ok keeps no message-count
  again, = q.pop
  { body: body, redelivered: di.redelivered?, message_count: message_count, then_empty: again.nil? }
end

def consume_ack(ch)
  q = new_queue(ch)
  %w[m1 m2 m3].each { |b| ch.default_exchange.publish(b, routing_key: q.name) }
  bodies = Queue.new
  consumer = q.subscribe(manual_ack: true) do |di, _, body|
    ch.ack(di.delivery_tag)
    bodies << body
  end
  got = []
  deadline = now_ms + 5000
  while got.size < 3 && now_ms < deadline
    begin
      got << bodies.pop(timeout: 0.1)
    rescue ThreadError
      nil
    end
    got.compact!
  end
  consumer.cancel
  { bodies: got, left: count_of(q) }
end

def reject_requeue(ch)
  q = new_queue(ch)
  ch.default_exchange.publish("r", routing_key: q.name)
  redelivered = []
  di, = q.pop(manual_ack: true)
  redelivered << di.redelivered?
  ch.reject(di.delivery_tag, true)
  di, = q.pop(manual_ack: true)
  redelivered << di.redelivered?
  ch.nack(di.delivery_tag, false, true)
  di, = q.pop(manual_ack: true)
  redelivered << di.redelivered?
  ch.ack(di.delivery_tag)
  { redelivered: redelivered, left: count_of(q) }
end

def qos(ch)
  q = new_queue(ch)
  ch.prefetch(1)
  ch.default_exchange.publish("a", routing_key: q.name)
  ch.default_exchange.publish("b", routing_key: q.name)
  got = []
  lock = Mutex.new
  q.subscribe(manual_ack: true) { |di, _, _| lock.synchronize { got << di.delivery_tag } }
  # wait_for waits until n deliveries came or seconds passed.
  wait_for = lambda do |n, seconds|
    deadline = now_ms + seconds * 1000
    sleep 0.01 while lock.synchronize { got.size } < n && now_ms < deadline
  end
  wait_for.call(1, 5)
  wait_for.call(2, 0.3) # a second one must not come before the ack
  before = lock.synchronize { got.size }
  ch.ack(got[0])
  wait_for.call(2, 5)
  after = lock.synchronize { got.size }
  got[1..].each { |tag| ch.ack(tag) }
  { before_ack: before, after_ack: after }
end

def pop_wait(q)
  deadline = now_ms + 10_000
  while now_ms < deadline
    di, props, = q.pop(manual_ack: true)
    return [di, props] if di

    sleep 0.01
  end
  raise "no message in #{q.name}"
end

def quorum(ch, target)
  q = ch.queue(name(target, "qq"), durable: true, arguments: { "x-queue-type" => "quorum" })
  ch.confirm_select
  ch.default_exchange.publish("q", routing_key: q.name)
  ch.wait_for_confirms
  counts = %w[reject nack reject ack].map do |settle|
    di, props = pop_wait(q)
    count = (props.headers || {})["x-delivery-count"]
    case settle
    when "reject" then ch.reject(di.delivery_tag, true)
    when "nack" then ch.nack(di.delivery_tag, false, true)
    else ch.ack(di.delivery_tag)
    end
    count
  end
  { counts: counts }
ensure
  q&.delete
end

def mandatory(ch, target)
  returned = Queue.new
  x = ch.default_exchange
  x.on_return { |ri, _, _| returned << ri }
  ch.confirm_select
  x.publish("m", routing_key: name(target, "nowhere"), mandatory: true)
  ch.wait_for_confirms
  ri = begin
    returned.pop(timeout: 5)
  rescue ThreadError
    nil
  end
  return { reply_code: nil } unless ri

  { reply_code: ri.reply_code, reply_text: ri.reply_text, exchange: ri.exchange, routing_key: ri.routing_key }
end

def tx(ch)
  q = new_queue(ch)
  ch.tx_select
  ch.default_exchange.publish("rolled back", routing_key: q.name)
  ch.tx_rollback
  after_rollback = count_of(q)
  ch.default_exchange.publish("committed", routing_key: q.name)
  ch.tx_commit
  { after_rollback: after_rollback, after_commit: count_of(q) }
end

def tx_delayed(ch, target)
  q = ch.queue(name(target, "txq"), exclusive: true)
  q.bind(name(target, "dx"), routing_key: "tx")
  ch.tx_select
  t0 = nil
  %w[rolled-back committed].each do |id|
    t0 = now_ms
    ch.basic_publish("tx", name(target, "dx"), "tx", headers: { "x-delay" => DELAY_TX }, message_id: id)
    id == "rolled-back" ? ch.tx_rollback : ch.tx_commit
  end
  got = poll(q, ["committed"])
  at, headers = got["committed"]
  { committed_arrived: !at.nil?, committed_elapsed_ms: at && at - t0,
    committed_x_delay: x_delay(headers)[0], rolled_back_arrived: got.key?("rolled-back") }
end

# close_reopen closes, CLOSE_ROUNDS times, a connection with confirms in
# flight; reports the first failed close, then opens one more.
def close_reopen(target)
  close_error = nil
  CLOSE_ROUNDS.times do
    c = connect(target)
    ch = c.create_channel
    q = new_queue(ch)
    ch.confirm_select
    500.times { ch.default_exchange.publish("x" * 1000, routing_key: q.name) }
    begin
      c.close
    rescue StandardError => e
      close_error = "#{e.class}: #{e.message}"
      break
    end
  end
  c = connect(target)
  new_queue(c.create_channel)
  c.close
  { close_error: close_error, reopened: true }
end

def publish_refused(c, exchange, headers = nil)
  refusal do
    ch = c.create_channel
    ch.basic_publish("m", exchange, "k", headers: headers)
    ch.queue("", exclusive: true)
  end
end

def plain(target)
  c = connect(target)
  run("get", target) { get(c.create_channel) }
  run("consume_ack", target) { consume_ack(c.create_channel) }
  run("reject_requeue", target) { reject_requeue(c.create_channel) }
  run("qos", target) { qos(c.create_channel) }
  run("quorum", target) { quorum(c.create_channel, target) }
  run("mandatory", target) { mandatory(c.create_channel, target) }
  run("tx", target) { tx(c.create_channel) }
  run("tx_delayed", target) { tx_delayed(c.create_channel, target) } if target == "proxy"
  run("error_406_queue", target) do
    q = name(target, "eq")
    c.create_channel.queue(q, exclusive: true)
    refusal { c.create_channel.queue(q, exclusive: true, arguments: { "x-max-length" => 10 }) }
  end
  run("error_406_exchange", target) do
    ch = c.create_channel
    x = ch.direct(name(target, "px"))
    begin
      refusal { c.create_channel.fanout(name(target, "px")) }
    ensure
      x.delete
    end
  end
  run("error_404", target) { publish_refused(c, name(target, "missing")) }
  if target == "proxy"
    run("error_406_delay", target) { publish_refused(c, name(target, "dx"), { "x-delay" => "abc" }) }
    run("error_406_delayed_type", target) { refusal { delayed_exchange(c.create_channel, target, "dx", "topic") } }
  end
  c.close
  run("close_reopen", target) { close_reopen(target) }
  run("error_403", target) { login_refused(target) }
  run("error_530", target) { refusal { connect(target, vhost: "no-such-vhost").close } }
end

def cleanup(target)
  c = connect(target)
  ch = c.create_channel
  %w[dx dt].each { |s| ch.exchange_delete(name(target, s)) }
  c.close
end

CASES = [
  ["delay_int", "dx", "k", { "x-delay" => DELAY_INT }, DELAY_INT],
  ["delay_string", "dx", "k", { "x-delay" => DELAY_STRING }, DELAY_STRING.to_i],
  ["delay_float", "dx", "k", { "x-delay" => DELAY_FLOAT }, DELAY_FLOAT.to_i],
  ["delay_zero", "dx", "k", { "x-delay" => 0 }, 0],
  ["delay_missing", "dx", "k", nil, 0],
  ["delay_topic_unroutable", "dt", "b.c", { "x-delay" => DELAY_TOPIC }, nil],
  ["delay_topic", "dt", "a.b.c", { "x-delay" => DELAY_TOPIC }, DELAY_TOPIC],
].freeze

%w[direct proxy].each { |t| run("server", t) { server(t) } }
delayed("proxy", CASES, true)
delayed("proxy32", [["delay_int", "dx", "k", { "x-delay" => DELAY_INT32 }, DELAY_INT32]], false)
%w[direct proxy].each { |t| plain(t) }
%w[proxy proxy32].each { |t| cleanup(t) }
