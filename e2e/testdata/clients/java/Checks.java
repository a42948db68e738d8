// The e2e client suite's checks with the RabbitMQ Java client (Debian's
// librabbitmq-client-java): one JSON line per check and target, see
// e2e/clients_test.go. The test compiles it once per run.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.AuthenticationFailureException;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public class Checks {
  // The delays the suite asks for, in milliseconds (e2e/clients_expect_test.go).
  static final int DELAY_INT = 300;
  static final String DELAY_STRING = "350";
  static final double DELAY_FLOAT = 400.7;
  static final int DELAY_TOPIC = 300;
  static final int DELAY_INT32 = 450;
  static final int DELAY_TX = 300;
  static final long ARRIVAL_TIMEOUT_MS = 20_000;
  // How many connections close_reopen closes with confirms in flight: a
  // reset after close-ok comes in a third to a half of them (amqplib).
  static final int CLOSE_ROUNDS = 10;

  static final Map<String, String> ADDRS = Map.of(
      "direct", System.getenv("CLIENT_DIRECT_ADDR"),
      "proxy", System.getenv("CLIENT_PROXY_ADDR"),
      "proxy32", System.getenv("CLIENT_PROXY32_ADDR"));

  interface Check {
    Object run() throws Exception;
  }

  static Connection connect(String target) throws Exception {
    return connect(target, System.getenv("CLIENT_PASSWORD"), "/");
  }

  static Connection connect(String target, String password, String vhost) throws Exception {
    String[] hp = ADDRS.get(target).split(":");
    ConnectionFactory f = new ConnectionFactory();
    f.setHost(hp[0]);
    f.setPort(Integer.parseInt(hp[1]));
    f.setUsername(System.getenv("CLIENT_USER"));
    f.setPassword(password);
    f.setVirtualHost(vhost);
    f.setAutomaticRecoveryEnabled(false);
    return f.newConnection();
  }

  static String name(String target, String suffix) {
    return System.getenv("CLIENT_PREFIX") + "." + target + "." + suffix;
  }

  static Map<String, Object> map(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) {
      m.put((String) kv[i], kv[i + 1]);
    }
    return m;
  }

  static void emit(String check, String target, Object result, String error) {
    Map<String, Object> line = map("check", check, "target", target);
    if (error != null) {
      line.put("error", error);
    } else {
      line.put("result", result);
    }
    System.out.println(json(line));
    System.out.flush();
  }

  static void run(String check, String target, Check c) {
    try {
      emit(check, target, c.run(), null);
    } catch (Exception e) {
      StringWriter sw = new StringWriter();
      e.printStackTrace(new PrintWriter(sw));
      emit(check, target, null, e + "\n" + sw);
    }
  }

  static String json(Object v) {
    if (v == null) {
      return "null";
    }
    if (v instanceof Boolean || v instanceof Number) {
      return v.toString();
    }
    if (v instanceof Map) {
      StringBuilder sb = new StringBuilder("{");
      for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
        if (sb.length() > 1) {
          sb.append(',');
        }
        sb.append(json(e.getKey().toString())).append(':').append(json(e.getValue()));
      }
      return sb.append('}').toString();
    }
    if (v instanceof List) {
      StringBuilder sb = new StringBuilder("[");
      for (Object o : (List<?>) v) {
        if (sb.length() > 1) {
          sb.append(',');
        }
        sb.append(json(o));
      }
      return sb.append(']').toString();
    }
    StringBuilder sb = new StringBuilder("\"");
    for (char ch : v.toString().toCharArray()) {
      if (ch == '"' || ch == '\\') {
        sb.append('\\').append(ch);
      } else if (ch < 0x20) {
        sb.append(String.format("\\u%04x", (int) ch));
      } else {
        sb.append(ch);
      }
    }
    return sb.append('"').toString();
  }

  static double nowMs() {
    return System.nanoTime() / 1e6;
  }

  // errorOf is the reply code and text of the refusal e carries.
  static Map<String, Object> errorOf(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof ShutdownSignalException) {
        Object reason = ((ShutdownSignalException) t).getReason();
        if (reason instanceof AMQP.Channel.Close) {
          AMQP.Channel.Close c = (AMQP.Channel.Close) reason;
          return map("code", c.getReplyCode(), "text", c.getReplyText());
        }
        if (reason instanceof AMQP.Connection.Close) {
          AMQP.Connection.Close c = (AMQP.Connection.Close) reason;
          return map("code", c.getReplyCode(), "text", c.getReplyText());
        }
      }
      if (t instanceof AuthenticationFailureException) {
        // The client keeps the text of the connection.close 403 only.
        return map("code", 403, "text", t.getMessage());
      }
    }
    return map("code", null, "text", e.toString());
  }

  static Map<String, Object> refusal(Check c) {
    try {
      c.run();
    } catch (Exception e) {
      return errorOf(e);
    }
    return map("code", null, "text", "not refused");
  }

  // xDelay is x-delay as the Java client decoded it: its text and class.
  static String[] xDelay(Map<String, Object> headers) {
    if (headers == null || !headers.containsKey("x-delay")) {
      return new String[] {null, null};
    }
    Object v = headers.get("x-delay");
    return new String[] {v.toString(), v.getClass().getSimpleName()};
  }

  static AMQP.BasicProperties props(Map<String, Object> headers, String messageId) {
    return new AMQP.BasicProperties.Builder().headers(headers).messageId(messageId).deliveryMode(2).build();
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static Object server(String target) throws Exception {
    try (Connection c = connect(target)) {
      Map<String, Object> p = c.getServerProperties();
      return map("product", String.valueOf(p.get("product")), "version", String.valueOf(p.get("version")),
          "channel_max", c.getChannelMax());
    }
  }

  static void declareDelayed(Channel ch, String target, String suffix, String type) throws IOException {
    ch.exchangeDeclare(name(target, suffix), "x-delayed-message", true, false,
        map("x-delayed-type", type));
  }

  // poll takes messages from queue with basic.get until every message-id of
  // want arrived, and 300 ms more: message-id -> {arrival ms, headers}.
  static Map<String, Object[]> poll(Channel ch, String queue, List<String> want) throws Exception {
    Map<String, Object[]> got = new HashMap<>();
    double deadline = nowMs() + ARRIVAL_TIMEOUT_MS;
    Double quietUntil = null;
    while (nowMs() < deadline) {
      GetResponse r = ch.basicGet(queue, true);
      if (r != null) {
        got.put(r.getProps().getMessageId(), new Object[] {nowMs(), r.getProps().getHeaders()});
        continue;
      }
      if (got.keySet().containsAll(want)) {
        if (quietUntil == null) {
          quietUntil = nowMs() + 300;
        } else if (nowMs() >= quietUntil) {
          break;
        }
      }
      Thread.sleep(10);
    }
    return got;
  }

  // One delayed publish: the check it reports, the exchange's suffix, the
  // routing key, the headers and the delay (null: it must not arrive).
  record Case(String check, String suffix, String key, Map<String, Object> headers, Integer delay) {}

  @SuppressWarnings("unchecked")
  static void delayed(String target, List<Case> cases, boolean emitDeclare) {
    try (Connection c = connect(target)) {
      Channel ch = c.createChannel();
      Map<String, Object> decl = new LinkedHashMap<>();
      for (String[] x : new String[][] {{"direct", "dx"}, {"topic", "dt"}}) {
        try {
          declareDelayed(ch, target, x[1], x[0]);
          decl.put(x[0], "ok");
        } catch (IOException e) {
          decl.put(x[0], json(errorOf(e)));
          ch = c.createChannel();
        }
      }
      if (emitDeclare) {
        emit("declare", target, decl, null);
      }
      ch.confirmSelect();
      String q = name(target, "dq");
      ch.queueDeclare(q, false, true, false, null);
      ch.queueBind(q, name(target, "dx"), "k");
      ch.queueBind(q, name(target, "dt"), "a.#");
      Map<String, Object[]> sent = new HashMap<>();
      List<String> want = new ArrayList<>();
      for (Case cs : cases) {
        double t0 = nowMs();
        ch.basicPublish(name(target, cs.suffix), cs.key, props(cs.headers, cs.check), bytes("body of " + cs.check));
        boolean confirmed;
        try {
          confirmed = ch.waitForConfirms(20_000);
        } catch (java.util.concurrent.TimeoutException e) {
          confirmed = false;
        }
        sent.put(cs.check, new Object[] {t0, confirmed});
        if (cs.delay != null) {
          want.add(cs.check);
        }
      }
      Map<String, Object[]> got = poll(ch, q, want);
      for (Case cs : cases) {
        if (cs.delay == null) {
          continue;
        }
        Object[] s = sent.get(cs.check);
        Object[] a = got.get(cs.check);
        String[] xd = xDelay(a == null ? null : (Map<String, Object>) a[1]);
        Map<String, Object> r = map("confirmed", s[1], "arrived", a != null,
            "elapsed_ms", a == null ? null : (Double) a[0] - (Double) s[0], "x_delay", xd[0], "x_delay_type", xd[1]);
        if (cs.check.equals("delay_topic")) {
          r.put("unroutable_arrived", got.containsKey("delay_topic_unroutable"));
        }
        emit(cs.check, target, r, null);
      }
    } catch (Exception e) {
      for (Case cs : cases) {
        if (cs.delay != null) {
          emit(cs.check, target, null, e.toString());
        }
      }
    }
  }

  // newQueue declares a server-named exclusive queue that outlives its
  // consumers (queueDeclare() would make it auto-delete).
  static String newQueue(Channel ch) throws IOException {
    return ch.queueDeclare("", false, true, false, null).getQueue();
  }

  static int countOf(Channel ch, String q) throws IOException {
    return ch.queueDeclarePassive(q).getMessageCount();
  }

  static Object get(Channel ch) throws Exception {
    String q = newQueue(ch);
    ch.basicPublish("", q, null, bytes("hello"));
    GetResponse r = ch.basicGet(q, true);
    GetResponse again = ch.basicGet(q, true);
    return map("body", new String(r.getBody(), StandardCharsets.UTF_8), "redelivered", r.getEnvelope().isRedeliver(),
        "message_count", r.getMessageCount(), "then_empty", again == null);
  }

  static Object consumeAck(Channel ch) throws Exception {
    String q = newQueue(ch);
    for (String b : new String[] {"m1", "m2", "m3"}) {
      ch.basicPublish("", q, null, bytes(b));
    }
    BlockingQueue<String> bodies = new LinkedBlockingQueue<>();
    String tag = ch.basicConsume(q, false, (t, d) -> {
      ch.basicAck(d.getEnvelope().getDeliveryTag(), false);
      bodies.add(new String(d.getBody(), StandardCharsets.UTF_8));
    }, t -> {});
    List<String> got = new ArrayList<>();
    double deadline = nowMs() + 5000;
    while (got.size() < 3 && nowMs() < deadline) {
      String b = bodies.poll(100, TimeUnit.MILLISECONDS);
      if (b != null) {
        got.add(b);
      }
    }
    ch.basicCancel(tag);
    return map("bodies", got, "left", countOf(ch, q));
  }

  static Object rejectRequeue(Channel ch) throws Exception {
    String q = newQueue(ch);
    ch.basicPublish("", q, null, bytes("r"));
    List<Object> redelivered = new ArrayList<>();
    GetResponse r = ch.basicGet(q, false);
    redelivered.add(r.getEnvelope().isRedeliver());
    ch.basicReject(r.getEnvelope().getDeliveryTag(), true);
    r = ch.basicGet(q, false);
    redelivered.add(r.getEnvelope().isRedeliver());
    ch.basicNack(r.getEnvelope().getDeliveryTag(), false, true);
    r = ch.basicGet(q, false);
    redelivered.add(r.getEnvelope().isRedeliver());
    ch.basicAck(r.getEnvelope().getDeliveryTag(), false);
    return map("redelivered", redelivered, "left", countOf(ch, q));
  }

  static Object qos(Channel ch) throws Exception {
    String q = newQueue(ch);
    ch.basicQos(1);
    ch.basicPublish("", q, null, bytes("a"));
    ch.basicPublish("", q, null, bytes("b"));
    BlockingQueue<Long> tags = new LinkedBlockingQueue<>();
    ch.basicConsume(q, false, (t, d) -> tags.add(d.getEnvelope().getDeliveryTag()), t -> {});
    List<Long> got = new ArrayList<>();
    Long first = tags.poll(5, TimeUnit.SECONDS);
    Thread.sleep(300); // a second one must not come before the ack
    if (first != null) {
      got.add(first);
    }
    tags.drainTo(got);
    int before = got.size();
    if (first != null) {
      ch.basicAck(first, false);
    }
    Long next = before < 2 ? tags.poll(5, TimeUnit.SECONDS) : null;
    if (next != null) {
      got.add(next);
    }
    int after = got.size();
    for (Long t : got.subList(1, got.size())) {
      ch.basicAck(t, false);
    }
    return map("before_ack", before, "after_ack", after);
  }

  static GetResponse getWait(Channel ch, String q) throws Exception {
    double deadline = nowMs() + 10_000;
    while (nowMs() < deadline) {
      GetResponse r = ch.basicGet(q, false);
      if (r != null) {
        return r;
      }
      Thread.sleep(10);
    }
    throw new IllegalStateException("no message in " + q);
  }

  static Object quorum(Channel ch, String target) throws Exception {
    String q = name(target, "qq");
    ch.queueDeclare(q, true, false, false, map("x-queue-type", "quorum"));
    try {
      ch.confirmSelect();
      ch.basicPublish("", q, null, bytes("q"));
      ch.waitForConfirmsOrDie(20_000);
      List<Object> counts = new ArrayList<>();
      for (String settle : new String[] {"reject", "nack", "reject", "ack"}) {
        GetResponse r = getWait(ch, q);
        Map<String, Object> h = r.getProps().getHeaders();
        counts.add(h == null ? null : h.get("x-delivery-count"));
        long tag = r.getEnvelope().getDeliveryTag();
        switch (settle) {
          case "reject" -> ch.basicReject(tag, true);
          case "nack" -> ch.basicNack(tag, false, true);
          default -> ch.basicAck(tag, false);
        }
      }
      return map("counts", counts);
    } finally {
      ch.queueDelete(q);
    }
  }

  static Object mandatory(Channel ch, String target) throws Exception {
    BlockingQueue<Map<String, Object>> returned = new LinkedBlockingQueue<>();
    ch.addReturnListener((code, text, exchange, key, props, body) ->
        returned.add(map("reply_code", code, "reply_text", text, "exchange", exchange, "routing_key", key)));
    ch.confirmSelect();
    ch.basicPublish("", name(target, "nowhere"), true, null, bytes("m"));
    ch.waitForConfirms(20_000);
    Map<String, Object> r = returned.poll(5, TimeUnit.SECONDS);
    return r != null ? r : map("reply_code", null);
  }

  static Object tx(Channel ch) throws Exception {
    String q = newQueue(ch);
    ch.txSelect();
    ch.basicPublish("", q, null, bytes("rolled back"));
    ch.txRollback();
    int afterRollback = countOf(ch, q);
    ch.basicPublish("", q, null, bytes("committed"));
    ch.txCommit();
    return map("after_rollback", afterRollback, "after_commit", countOf(ch, q));
  }

  @SuppressWarnings("unchecked")
  static Object txDelayed(Channel ch, String target) throws Exception {
    String q = name(target, "txq");
    ch.queueDeclare(q, false, true, false, null);
    ch.queueBind(q, name(target, "dx"), "tx");
    ch.txSelect();
    double t0 = 0;
    for (String id : new String[] {"rolled-back", "committed"}) {
      t0 = nowMs();
      ch.basicPublish(name(target, "dx"), "tx", props(map("x-delay", DELAY_TX), id), bytes("tx"));
      if (id.equals("rolled-back")) {
        ch.txRollback();
      } else {
        ch.txCommit();
      }
    }
    Map<String, Object[]> got = poll(ch, q, List.of("committed"));
    Object[] a = got.get("committed");
    return map("committed_arrived", a != null, "committed_elapsed_ms", a == null ? null : (Double) a[0] - t0,
        "committed_x_delay", xDelay(a == null ? null : (Map<String, Object>) a[1])[0],
        "rolled_back_arrived", got.containsKey("rolled-back"));
  }

  // closeReopen closes, CLOSE_ROUNDS times, a connection with confirms in
  // flight; it reports the first close that failed, then opens one more.
  static Object closeReopen(String target) throws Exception {
    String closeError = null;
    for (int round = 0; round < CLOSE_ROUNDS && closeError == null; round++) {
      Connection c = connect(target);
      Channel ch = c.createChannel();
      String q = newQueue(ch);
      ch.confirmSelect();
      for (int i = 0; i < 500; i++) {
        ch.basicPublish("", q, null, new byte[1000]);
      }
      try {
        c.close();
      } catch (Exception e) {
        closeError = e.toString();
      }
    }
    try (Connection c = connect(target)) {
      newQueue(c.createChannel());
    }
    return map("close_error", closeError, "reopened", true);
  }

  static Object publishRefused(Connection c, String exchange, Map<String, Object> headers) {
    return refusal(() -> {
      Channel ch = c.createChannel();
      ch.basicPublish(exchange, "k", props(headers, null), bytes("m"));
      return newQueue(ch);
    });
  }

  static void plain(String target) throws Exception {
    try (Connection c = connect(target)) {
      run("get", target, () -> get(c.createChannel()));
      run("consume_ack", target, () -> consumeAck(c.createChannel()));
      run("reject_requeue", target, () -> rejectRequeue(c.createChannel()));
      run("qos", target, () -> qos(c.createChannel()));
      run("quorum", target, () -> quorum(c.createChannel(), target));
      run("mandatory", target, () -> mandatory(c.createChannel(), target));
      run("tx", target, () -> tx(c.createChannel()));
      if (target.equals("proxy")) {
        run("tx_delayed", target, () -> txDelayed(c.createChannel(), target));
      }
      run("error_406_queue", target, () -> {
        String q = name(target, "eq");
        c.createChannel().queueDeclare(q, false, true, false, null);
        return refusal(() -> c.createChannel().queueDeclare(q, false, true, false, map("x-max-length", 10)));
      });
      run("error_406_exchange", target, () -> {
        String x = name(target, "px");
        Channel ch = c.createChannel();
        ch.exchangeDeclare(x, "direct");
        try {
          return refusal(() -> c.createChannel().exchangeDeclare(x, "fanout"));
        } finally {
          ch.exchangeDelete(x);
        }
      });
      run("error_404", target, () -> publishRefused(c, name(target, "missing"), null));
      if (target.equals("proxy")) {
        run("error_406_delay", target, () -> publishRefused(c, name(target, "dx"), map("x-delay", "abc")));
        run("error_406_delayed_type", target, () -> refusal(() -> {
          declareDelayed(c.createChannel(), target, "dx", "topic");
          return null;
        }));
      }
    }
    run("close_reopen", target, () -> closeReopen(target));
    run("error_403", target, () -> refusal(() -> {
      connect(target, "wrong", "/").close();
      return null;
    }));
    run("error_530", target, () -> refusal(() -> {
      connect(target, System.getenv("CLIENT_PASSWORD"), "no-such-vhost").close();
      return null;
    }));
  }

  static void cleanup(String target) throws Exception {
    try (Connection c = connect(target)) {
      Channel ch = c.createChannel();
      for (String s : new String[] {"dx", "dt"}) {
        ch.exchangeDelete(name(target, s));
      }
    }
  }

  public static void main(String[] args) throws Exception {
    List<Case> cases = Arrays.asList(
        new Case("delay_int", "dx", "k", map("x-delay", DELAY_INT), DELAY_INT),
        new Case("delay_string", "dx", "k", map("x-delay", DELAY_STRING), Integer.parseInt(DELAY_STRING)),
        new Case("delay_float", "dx", "k", map("x-delay", DELAY_FLOAT), (int) DELAY_FLOAT),
        new Case("delay_zero", "dx", "k", map("x-delay", 0), 0),
        new Case("delay_missing", "dx", "k", null, 0),
        new Case("delay_topic_unroutable", "dt", "b.c", map("x-delay", DELAY_TOPIC), null),
        new Case("delay_topic", "dt", "a.b.c", map("x-delay", DELAY_TOPIC), DELAY_TOPIC));
    for (String t : new String[] {"direct", "proxy"}) {
      run("server", t, () -> server(t));
    }
    delayed("proxy", cases, true);
    delayed("proxy32", List.of(new Case("delay_int", "dx", "k", map("x-delay", DELAY_INT32), DELAY_INT32)), false);
    for (String t : new String[] {"direct", "proxy"}) {
      plain(t);
    }
    for (String t : new String[] {"proxy", "proxy32"}) {
      cleanup(t);
    }
  }
}
