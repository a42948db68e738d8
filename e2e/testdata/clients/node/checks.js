// The e2e client suite's checks with amqplib (from npm, in
// $CLIENTS_NODE_DIR/node_modules): one JSON line per check and target, see
// e2e/clients_test.go. amqplib has no transactions: no tx checks.
'use strict';

const path = require('path');
const amqp = require(path.join(process.env.CLIENTS_NODE_DIR || '/var/lib/delayproxy-ci/node', 'node_modules', 'amqplib'));

// The delays the suite asks for, in milliseconds (e2e/clients_expect_test.go).
const DELAY_INT = 300;
const DELAY_STRING = '350';
const DELAY_FLOAT = 400.7;
const DELAY_TOPIC = 300;
const DELAY_INT32 = 450;
const ARRIVAL_TIMEOUT_MS = 20000;
// How many connections closeReopen closes with confirms in flight: a reset
// after close-ok comes in a third to a half of them.
const CLOSE_ROUNDS = 10;

const ADDRS = {
  direct: process.env.CLIENT_DIRECT_ADDR,
  proxy: process.env.CLIENT_PROXY_ADDR,
  proxy32: process.env.CLIENT_PROXY32_ADDR,
};

function url(target, { password, vhost } = {}) {
  const user = encodeURIComponent(process.env.CLIENT_USER);
  const pass = encodeURIComponent(password || process.env.CLIENT_PASSWORD);
  return `amqp://${user}:${pass}@${ADDRS[target]}/${vhost || '%2f'}`;
}

function connect(target, opts) {
  return amqp.connect(url(target, opts));
}

function name(target, suffix) {
  return `${process.env.CLIENT_PREFIX}.${target}.${suffix}`;
}

function emit(check, target, result, error) {
  const line = { check, target };
  if (error !== undefined) line.error = error;
  else line.result = result;
  process.stdout.write(JSON.stringify(line) + '\n');
}

async function run(check, target, fn) {
  try {
    emit(check, target, await fn());
  } catch (e) {
    emit(check, target, undefined, `${e.name}: ${e.message}\n${e.stack}`);
  }
}

const nowMs = () => Number(process.hrtime.bigint()) / 1e6;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// within is promise's value, or onTimeout if it has not settled after ms.
function within(promise, ms, onTimeout) {
  let timer;
  const t = new Promise((r) => { timer = setTimeout(() => r(onTimeout), ms); });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

// errorOf is the reply code and text of a refusal, from amqplib's
// "... 406 (PRECONDITION-FAILED) with message "TEXT"".
function errorOf(e) {
  const m = /(\d{3}) \([A-Z-]+\) with message "(.*)"$/s.exec(e.message || '');
  if (m) return { code: Number(m[1]), text: m[2] };
  return { code: null, text: `${e.name}: ${e.message}` };
}

async function refusal(fn) {
  try {
    await fn();
  } catch (e) {
    return errorOf(e);
  }
  return { code: null, text: 'not refused' };
}

// xDelay is x-delay as amqplib decoded it: its text and JavaScript type.
function xDelay(headers) {
  if (!headers || !('x-delay' in headers)) return [null, null];
  const v = headers['x-delay'];
  return [String(v), typeof v];
}

async function server(target) {
  const c = await connect(target);
  const r = {
    product: c.connection.serverProperties.product,
    version: c.connection.serverProperties.version,
    channel_max: c.connection.channelMax,
  };
  await c.close();
  return r;
}

function declareDelayed(ch, target, suffix, type) {
  return ch.assertExchange(name(target, suffix), 'x-delayed-message', {
    durable: true, arguments: { 'x-delayed-type': type },
  });
}

// poll takes messages from queue with basic.get until every message-id of
// want arrived, and 300 ms more: message-id -> [arrival ms, headers].
async function poll(ch, queue, want) {
  const got = {};
  const deadline = nowMs() + ARRIVAL_TIMEOUT_MS;
  let quietUntil = null;
  while (nowMs() < deadline) {
    const m = await ch.get(queue, { noAck: true });
    if (m) {
      got[m.properties.messageId] = [nowMs(), m.properties.headers];
      continue;
    }
    if (want.every((id) => id in got)) {
      if (quietUntil === null) quietUntil = nowMs() + 300;
      else if (nowMs() >= quietUntil) break;
    }
    await sleep(10);
  }
  return got;
}

async function delayed(target, cases, emitDeclare) {
  const c = await connect(target);
  let ch = await c.createConfirmChannel();
  const decl = {};
  for (const [type, suffix] of [['direct', 'dx'], ['topic', 'dt']]) {
    try {
      await declareDelayed(ch, target, suffix, type);
      decl[type] = 'ok';
    } catch (e) {
      decl[type] = JSON.stringify(errorOf(e));
      ch = await c.createConfirmChannel();
    }
  }
  if (emitDeclare) emit('declare', target, decl);
  const q = name(target, 'dq');
  await ch.assertQueue(q, { exclusive: true });
  await ch.bindQueue(q, name(target, 'dx'), 'k');
  await ch.bindQueue(q, name(target, 'dt'), 'a.#');
  const sent = {};
  for (const [check, suffix, key, headers] of cases) {
    const t0 = nowMs();
    const confirmed = await new Promise((resolve) => {
      ch.publish(name(target, suffix), key, Buffer.from(`body of ${check}`),
        { headers, messageId: check, persistent: true }, (err) => resolve(!err));
    });
    sent[check] = [t0, confirmed];
  }
  const got = await poll(ch, q, cases.filter((cs) => cs[4] !== null).map((cs) => cs[0]));
  for (const [check, , , , delay] of cases) {
    if (delay === null) continue;
    const [t0, confirmed] = sent[check];
    const [at, headers] = got[check] || [null, null];
    const [value, type] = xDelay(headers);
    const r = {
      confirmed, arrived: at !== null, elapsed_ms: at === null ? null : at - t0,
      x_delay: value, x_delay_type: type,
    };
    if (check === 'delay_topic') r.unroutable_arrived = 'delay_topic_unroutable' in got;
    emit(check, target, r);
  }
  await c.close();
}

async function newQueue(ch) {
  return (await ch.assertQueue('', { exclusive: true })).queue;
}

async function countOf(ch, q) {
  return (await ch.checkQueue(q)).messageCount;
}

async function get(ch) {
  const q = await newQueue(ch);
  ch.sendToQueue(q, Buffer.from('hello'));
  const m = await ch.get(q, { noAck: true });
  const again = await ch.get(q, { noAck: true });
  return {
    body: m.content.toString(), redelivered: m.fields.redelivered,
    message_count: m.fields.messageCount, then_empty: again === false,
  };
}

async function consumeAck(ch) {
  const q = await newQueue(ch);
  for (const b of ['m1', 'm2', 'm3']) ch.sendToQueue(q, Buffer.from(b));
  const bodies = [];
  const { consumerTag } = await ch.consume(q, (m) => {
    bodies.push(m.content.toString());
    ch.ack(m);
  }, { noAck: false });
  const deadline = nowMs() + 5000;
  while (bodies.length < 3 && nowMs() < deadline) await sleep(10);
  await ch.cancel(consumerTag);
  return { bodies, left: await countOf(ch, q) };
}

async function rejectRequeue(ch) {
  const q = await newQueue(ch);
  ch.sendToQueue(q, Buffer.from('r'));
  const redelivered = [];
  let m = await ch.get(q);
  redelivered.push(m.fields.redelivered);
  ch.reject(m, true);
  m = await ch.get(q);
  redelivered.push(m.fields.redelivered);
  ch.nack(m, false, true);
  m = await ch.get(q);
  redelivered.push(m.fields.redelivered);
  ch.ack(m);
  return { redelivered, left: await countOf(ch, q) };
}

async function qos(ch) {
  const q = await newQueue(ch);
  await ch.prefetch(1);
  ch.sendToQueue(q, Buffer.from('a'));
  ch.sendToQueue(q, Buffer.from('b'));
  const got = [];
  await ch.consume(q, (m) => got.push(m), { noAck: false });
  // waitFor waits until n deliveries came or ms passed.
  const waitFor = async (n, ms) => {
    const deadline = nowMs() + ms;
    while (got.length < n && nowMs() < deadline) await sleep(10);
  };
  await waitFor(1, 5000);
  await waitFor(2, 300); // a second one must not come before the ack
  const before = got.length;
  ch.ack(got[0]);
  await waitFor(2, 5000);
  const after = got.length;
  for (const m of got.slice(1)) ch.ack(m);
  return { before_ack: before, after_ack: after };
}

async function getWait(ch, q) {
  const deadline = nowMs() + 10000;
  while (nowMs() < deadline) {
    const m = await ch.get(q);
    if (m) return m;
    await sleep(10);
  }
  throw new Error(`no message in ${q}`);
}

async function quorum(c, target) {
  const ch = await c.createConfirmChannel();
  const q = name(target, 'qq');
  await ch.assertQueue(q, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  try {
    ch.sendToQueue(q, Buffer.from('q'));
    await ch.waitForConfirms();
    const counts = [];
    for (const settle of ['reject', 'nack', 'reject', 'ack']) {
      const m = await getWait(ch, q);
      const h = m.properties.headers || {};
      counts.push('x-delivery-count' in h ? h['x-delivery-count'] : null);
      if (settle === 'reject') ch.reject(m, true);
      else if (settle === 'nack') ch.nack(m, false, true);
      else ch.ack(m);
    }
    return { counts };
  } finally {
    await ch.deleteQueue(q);
  }
}

async function mandatory(c, target) {
  const ch = await c.createConfirmChannel();
  const returned = new Promise((resolve) => ch.on('return', resolve));
  ch.publish('', name(target, 'nowhere'), Buffer.from('m'), { mandatory: true });
  await ch.waitForConfirms();
  const m = await within(returned, 5000, null);
  if (!m) return { reply_code: null };
  return {
    reply_code: m.fields.replyCode, reply_text: m.fields.replyText,
    exchange: m.fields.exchange, routing_key: m.fields.routingKey,
  };
}

// closeReopen closes, CLOSE_ROUNDS times, a connection with confirms in
// flight: each close must complete (its promise resolve, no 'error' event
// such as ECONNRESET); it reports the first that did not, then opens one
// more connection.
async function closeReopen(target) {
  let closeError = null;
  for (let round = 0; round < CLOSE_ROUNDS && closeError === null; round++) {
    const c = await connect(target);
    const failed = new Promise((resolve) => c.on('error', resolve));
    const ch = await c.createConfirmChannel();
    const q = await newQueue(ch);
    for (let i = 0; i < 500; i++) ch.sendToQueue(q, Buffer.alloc(1000, 'x'));
    const closed = c.close().then(() => 'closed', (e) => e);
    // An 'error' event (a reset) may come after close-ok: wait 50 ms more.
    const outcome = await within(Promise.race([closed.then((r) => within(failed, 50, r)), failed]), 10000, 'close did not complete in 10 s');
    if (outcome instanceof Error) closeError = `error: ${outcome.code || ''} ${outcome.message}`;
    else if (outcome !== 'closed') closeError = outcome;
  }
  const c2 = await connect(target);
  await newQueue(await c2.createChannel());
  await c2.close();
  return { close_error: closeError, reopened: true };
}

// onChannel runs fn on a new channel of c; a channel closed by the server
// also emits 'error' on it, which is what fn reports.
async function onChannel(c, fn) {
  const ch = await c.createChannel();
  ch.on('error', () => {});
  return fn(ch);
}

function publishRefused(c, exchange, headers) {
  return refusal(() => onChannel(c, async (ch) => {
    ch.publish(exchange, 'k', Buffer.from('m'), { headers });
    await ch.assertQueue('', { exclusive: true });
  }));
}

async function plain(target) {
  const c = await connect(target);
  c.on('error', () => {});
  await run('get', target, () => onChannel(c, get));
  await run('consume_ack', target, () => onChannel(c, consumeAck));
  await run('reject_requeue', target, () => onChannel(c, rejectRequeue));
  await run('qos', target, () => onChannel(c, qos));
  await run('quorum', target, () => quorum(c, target));
  await run('mandatory', target, () => mandatory(c, target));
  await run('error_406_queue', target, async () => {
    const q = name(target, 'eq');
    await onChannel(c, (ch) => ch.assertQueue(q, { exclusive: true }));
    return refusal(() => onChannel(c, (ch) => ch.assertQueue(q, { exclusive: true, arguments: { 'x-max-length': 10 } })));
  });
  await run('error_406_exchange', target, async () => {
    const x = name(target, 'px');
    const ch = await c.createChannel();
    await ch.assertExchange(x, 'direct', { durable: false });
    try {
      return await refusal(() => onChannel(c, (ch2) => ch2.assertExchange(x, 'fanout', { durable: false })));
    } finally {
      await ch.deleteExchange(x);
    }
  });
  await run('error_404', target, () => publishRefused(c, name(target, 'missing')));
  if (target === 'proxy') {
    await run('error_406_delay', target, () => publishRefused(c, name(target, 'dx'), { 'x-delay': 'abc' }));
    await run('error_406_delayed_type', target,
      () => refusal(() => onChannel(c, (ch) => declareDelayed(ch, target, 'dx', 'topic'))));
  }
  await c.close();
  await run('close_reopen', target, () => closeReopen(target));
  await run('error_403', target, () => refusal(async () => (await connect(target, { password: 'wrong' })).close()));
  await run('error_530', target, () => refusal(async () => (await connect(target, { vhost: 'no-such-vhost' })).close()));
}

async function cleanup(target) {
  const c = await connect(target);
  const ch = await c.createChannel();
  for (const s of ['dx', 'dt']) await ch.deleteExchange(name(target, s));
  await c.close();
}

async function delayedOrErrors(target, cases, emitDeclare) {
  try {
    await delayed(target, cases, emitDeclare);
  } catch (e) {
    for (const [check, , , , delay] of cases) {
      if (delay !== null) emit(check, target, undefined, `${e.name}: ${e.message}`);
    }
  }
}

const CASES = [
  ['delay_int', 'dx', 'k', { 'x-delay': DELAY_INT }, DELAY_INT],
  ['delay_string', 'dx', 'k', { 'x-delay': DELAY_STRING }, Number(DELAY_STRING)],
  ['delay_float', 'dx', 'k', { 'x-delay': DELAY_FLOAT }, Math.trunc(DELAY_FLOAT)],
  ['delay_zero', 'dx', 'k', { 'x-delay': 0 }, 0],
  ['delay_missing', 'dx', 'k', undefined, 0],
  ['delay_topic_unroutable', 'dt', 'b.c', { 'x-delay': DELAY_TOPIC }, null],
  ['delay_topic', 'dt', 'a.b.c', { 'x-delay': DELAY_TOPIC }, DELAY_TOPIC],
];

(async () => {
  for (const t of ['direct', 'proxy']) await run('server', t, () => server(t));
  await delayedOrErrors('proxy', CASES, true);
  await delayedOrErrors('proxy32', [['delay_int', 'dx', 'k', { 'x-delay': DELAY_INT32 }, DELAY_INT32]], false);
  for (const t of ['direct', 'proxy']) await plain(t);
  for (const t of ['proxy', 'proxy32']) await cleanup(t);
})().catch((e) => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
