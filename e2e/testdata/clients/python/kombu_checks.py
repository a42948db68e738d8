"""The e2e client suite's checks with kombu (python3-kombu) on its py-amqp
transport, a program of its own under /usr/bin/python3: see common.py and
e2e/clients_test.go. Where kombu has no word of its own (transactions) the
program uses the channel kombu hands out."""

import socket
import time

import amqp.exceptions
from kombu import Connection, Consumer, Exchange, Producer, Queue

from common import (ARRIVAL_TIMEOUT, CLOSE_ROUNDS, DELAY_FLOAT, DELAY_INT, DELAY_INT32,
                    DELAY_STRING, DELAY_TOPIC, DELAY_TX, PREFIX, header_value, name,
                    now_ms, run, text, url)


def connect(target, confirm=False, **kw):
    # kombu reads the vhost of amqp://host/%2f as "/".
    c = Connection(url(target, **kw), transport_options={"confirm_publish": confirm},
                   connect_timeout=10)
    c.connect()
    return c


def error_of(e):
    if isinstance(e, amqp.exceptions.AMQPError):
        return {"code": e.reply_code, "text": text(e.reply_text)}
    if e.__cause__ is not None or e.__context__ is not None:
        return error_of(e.__cause__ or e.__context__)
    return {"code": None, "text": "%s: %s" % (type(e).__name__, e)}


def refusal(fn):
    try:
        fn()
    except Exception as e:
        return error_of(e)
    return {"code": None, "text": "not refused"}


def server(target):
    with connect(target) as c:
        p = c.connection.server_properties
        return {"product": text(p.get("product")), "version": text(p.get("version")),
                "channel_max": c.connection.channel_max}


def delayed_exchange(target, suffix, typ):
    return Exchange(name(target, suffix), type="x-delayed-message", durable=True,
                    arguments={"x-delayed-type": typ})


def poll(queue, want, extra_wait=0.3):
    got = {}
    deadline = time.monotonic() + ARRIVAL_TIMEOUT
    quiet_until = None
    while time.monotonic() < deadline:
        m = queue.get(no_ack=True)
        if m is not None:
            got[m.properties.get("message_id")] = (now_ms(), m.headers)
            continue
        if want <= set(got):
            if quiet_until is None:
                quiet_until = time.monotonic() + extra_wait
            elif time.monotonic() >= quiet_until:
                break
        time.sleep(0.01)
    return got


def delayed(target, cases, emit_declare):
    with connect(target, confirm=True) as c:
        ch = c.channel()
        exchanges = {}
        decl = {}
        for typ, suffix in (("direct", "dx"), ("topic", "dt")):
            x = delayed_exchange(target, suffix, typ)
            try:
                x(ch).declare()
                decl[typ] = "ok"
            except Exception as e:
                decl[typ] = str(error_of(e))
                ch = c.channel()
            exchanges[suffix] = x
        if emit_declare:
            run("declare", target, lambda: decl)
        q = Queue(name(target, "dq"), exclusive=True, bindings=[])(ch)
        q.declare()
        q.bind_to(exchanges["dx"], "k")
        q.bind_to(exchanges["dt"], "a.#")
        producer = Producer(ch)
        sent = {}
        for check, suffix, key, headers, _ in cases:
            t0 = now_ms()
            try:
                producer.publish(b"body of " + check.encode(), exchange=exchanges[suffix],
                                 routing_key=key, headers=headers or {}, message_id=check,
                                 delivery_mode=2)
                sent[check] = (t0, True)
            except amqp.exceptions.MessageNacked:
                sent[check] = (t0, False)
        want = {check for check, _, _, _, delay in cases if delay is not None}
        got = poll(q, want)
        for check, _, _, _, delay in cases:
            if delay is None:
                continue
            t0, confirmed = sent[check]
            at, headers = got.get(check, (None, None))
            value, typ = header_value(headers, "x-delay")
            result = {"confirmed": confirmed, "arrived": at is not None,
                      "elapsed_ms": None if at is None else at - t0,
                      "x_delay": value, "x_delay_type": typ}
            if check == "delay_topic":
                result["unroutable_arrived"] = "delay_topic_unroutable" in got
            run(check, target, lambda: result)


_queues = []


def new_queue(ch):
    """A new queue of the program's, deleted at its end (or a minute after
    its last use, should the program fail before): kombu makes an
    exclusive queue auto-delete (gone when its consumer is), and its
    Consumer declares the queue again, which RabbitMQ refuses for a
    server-named amq.gen-* one."""
    q = Queue("%s.kq%d" % (PREFIX, len(_queues)), auto_delete=False,
              queue_arguments={"x-expires": 60000})(ch)
    q.declare()
    _queues.append(q.name)
    return q


def delete_queues(c):
    ch = c.channel()
    for n in _queues:
        Queue(n)(ch).delete()
    del _queues[:]


def count(q):
    return q.queue_declare(passive=True).message_count


def get(c, ch):
    q = new_queue(ch)
    Producer(ch).publish(b"hello", routing_key=q.name)
    m = q.get(no_ack=True)
    again = q.get(no_ack=True)
    return {"body": text(m.body), "redelivered": m.delivery_info["redelivered"],
            "message_count": m.delivery_info["message_count"], "then_empty": again is None}


def drain(c, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            c.drain_events(timeout=left)
        except socket.timeout:
            return


def pump(c, done, seconds):
    """Dispatches what arrives until done() or seconds passed."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        drain(c, 0.05)


def consume_ack(c, ch):
    q = new_queue(ch)
    producer = Producer(ch)
    for b in (b"m1", b"m2", b"m3"):
        producer.publish(b, routing_key=q.name)
    bodies = []

    def on(body, m):
        bodies.append(text(m.body))
        m.ack()
    with Consumer(ch, queues=[q], callbacks=[on], accept=None):
        deadline = time.monotonic() + 5
        while len(bodies) < 3 and time.monotonic() < deadline:
            drain(c, 0.1)
    return {"bodies": bodies, "left": count(q)}


def reject_requeue(c, ch):
    q = new_queue(ch)
    Producer(ch).publish(b"r", routing_key=q.name)
    redelivered = []
    m = q.get()
    redelivered.append(m.delivery_info["redelivered"])
    m.reject(requeue=True)
    m = q.get()
    redelivered.append(m.delivery_info["redelivered"])
    m.requeue()  # kombu's requeue: basic.reject with requeue, py-amqp has no nack
    m = q.get()
    redelivered.append(m.delivery_info["redelivered"])
    m.ack()
    return {"redelivered": redelivered, "left": count(q)}


def qos(c, ch):
    q = new_queue(ch)
    producer = Producer(ch)
    producer.publish(b"a", routing_key=q.name)
    producer.publish(b"b", routing_key=q.name)
    got = []
    with Consumer(ch, queues=[q], callbacks=[lambda body, m: got.append(m)], accept=None,
                  prefetch_count=1):
        pump(c, lambda: len(got) >= 1, 5)
        pump(c, lambda: len(got) >= 2, 0.3)  # a second one must not come before the ack
        before = len(got)
        got[0].ack()
        pump(c, lambda: len(got) >= 2, 5)
        after = len(got)
        for m in got[1:]:
            m.ack()
    return {"before_ack": before, "after_ack": after}


def quorum(c, target):
    with connect(target, confirm=True) as qc:
        ch = qc.channel()
        q = Queue(name(target, "qq"), durable=True, auto_delete=False,
                  queue_arguments={"x-queue-type": "quorum"})(ch)
        q.declare()
        try:
            Producer(ch).publish(b"q", routing_key=q.name)
            counts = []
            for settle in ("reject", "requeue", "reject", "ack"):
                deadline = time.monotonic() + 10
                m = None
                while m is None and time.monotonic() < deadline:
                    m = q.get()
                    if m is None:
                        time.sleep(0.01)
                counts.append((m.headers or {}).get("x-delivery-count"))
                if settle == "reject":
                    m.reject(requeue=True)
                elif settle == "requeue":
                    m.requeue()
                else:
                    m.ack()
            return {"counts": counts}
        finally:
            q.delete()


def mandatory(c, target):
    with connect(target, confirm=True) as mc:
        returned = []
        producer = Producer(mc.channel(), on_return=lambda exc, exchange, key, m:
                            returned.append((exc, exchange, key)))
        producer.publish(b"m", routing_key=name(target, "nowhere"), mandatory=True)
        if not returned:
            return {"reply_code": None}
        exc, exchange, key = returned[0]
        return {"reply_code": exc.reply_code, "reply_text": text(exc.reply_text),
                "exchange": exchange, "routing_key": key}


def tx(c, ch):
    q = new_queue(ch)
    producer = Producer(ch)
    ch.tx_select()
    producer.publish(b"rolled back", routing_key=q.name)
    ch.tx_rollback()
    after_rollback = count(q)
    producer.publish(b"committed", routing_key=q.name)
    ch.tx_commit()
    return {"after_rollback": after_rollback, "after_commit": count(q)}


def tx_delayed(c, target):
    ch = c.channel()
    x = delayed_exchange(target, "dx", "direct")
    q = Queue(name(target, "txq"), exchange=x, routing_key="tx", exclusive=True)(ch)
    q.declare()
    producer = Producer(ch, exchange=x)
    ch.tx_select()
    for mid in ("rolled-back", "committed"):
        t0 = now_ms()
        producer.publish(b"tx", routing_key="tx", headers={"x-delay": DELAY_TX}, message_id=mid)
        if mid == "rolled-back":
            ch.tx_rollback()
        else:
            ch.tx_commit()
    got = poll(q, {"committed"})
    at, headers = got.get("committed", (None, None))
    return {"committed_arrived": at is not None,
            "committed_elapsed_ms": None if at is None else at - t0,
            "committed_x_delay": header_value(headers, "x-delay")[0],
            "rolled_back_arrived": "rolled-back" in got}


def close_reopen(target):
    """Closes, CLOSE_ROUNDS times, a connection with publishes in flight;
    reports the first failed close, then opens one more."""
    close_error = None
    for _ in range(CLOSE_ROUNDS):
        c = connect(target)
        ch = c.channel()
        q = Queue("", exclusive=True)(ch)
        q.declare()
        producer = Producer(ch)
        for _ in range(500):
            producer.publish(b"x" * 1000, routing_key=q.name)
        try:
            c.release()
        except Exception as e:
            close_error = "%s: %s" % (type(e).__name__, e)
            break
    with connect(target) as c:
        Queue("", exclusive=True)(c.channel()).declare()
    return {"close_error": close_error, "reopened": True}


def error_406_queue(c, target):
    n = name(target, "eq")
    Queue(n, exclusive=True)(c.channel()).declare()
    return refusal(lambda: Queue(n, exclusive=True, queue_arguments={"x-max-length": 10})(
        c.channel()).declare())


def error_406_exchange(c, target):
    n = name(target, "px")
    x = Exchange(n, type="direct", durable=False)(c.channel())
    x.declare()
    try:
        return refusal(lambda: Exchange(n, type="fanout", durable=False)(c.channel()).declare())
    finally:
        x.delete()


def publish_refused(c, exchange, headers=None):
    def go():
        ch = c.channel()
        Producer(ch).publish(b"m", exchange=exchange, routing_key="k", headers=headers or {})
        Queue("", exclusive=True)(ch).declare()
    return refusal(go)


def plain(target):
    with connect(target) as c:
        run("get", target, get, c, c.channel())
        run("consume_ack", target, consume_ack, c, c.channel())
        run("reject_requeue", target, reject_requeue, c, c.channel())
        run("qos", target, qos, c, c.channel())
        run("quorum", target, quorum, c, target)
        run("mandatory", target, mandatory, c, target)
        run("tx", target, tx, c, c.channel())
        if target == "proxy":
            run("tx_delayed", target, tx_delayed, c, target)
        run("error_406_queue", target, error_406_queue, c, target)
        run("error_406_exchange", target, error_406_exchange, c, target)
        run("error_404", target, publish_refused, c, name(target, "missing"))
        if target == "proxy":
            run("error_406_delay", target, publish_refused, c, name(target, "dx"), {"x-delay": "abc"})
            run("error_406_delayed_type", target, lambda: refusal(
                lambda: delayed_exchange(target, "dx", "topic")(c.channel()).declare()))
        delete_queues(c)
    run("close_reopen", target, close_reopen, target)
    run("error_403", target, lambda: refusal(lambda: connect(target, password="wrong").release()))
    run("error_530", target, lambda: refusal(lambda: connect(target, vhost="no-such-vhost").release()))


def cleanup(target):
    with connect(target) as c:
        for suffix in ("dx", "dt"):
            delayed_exchange(target, suffix, "direct")(c.channel()).delete()


DELAYED_CASES = [
    ("delay_int", "dx", "k", {"x-delay": DELAY_INT}, DELAY_INT),
    ("delay_string", "dx", "k", {"x-delay": DELAY_STRING}, int(DELAY_STRING)),
    ("delay_float", "dx", "k", {"x-delay": DELAY_FLOAT}, int(DELAY_FLOAT)),
    ("delay_zero", "dx", "k", {"x-delay": 0}, 0),
    ("delay_missing", "dx", "k", None, 0),
    ("delay_topic_unroutable", "dt", "b.c", {"x-delay": DELAY_TOPIC}, None),
    ("delay_topic", "dt", "a.b.c", {"x-delay": DELAY_TOPIC}, DELAY_TOPIC),
]


def main():
    for target in ("direct", "proxy"):
        run("server", target, server, target)
    delayed("proxy", DELAYED_CASES, True)
    delayed("proxy32", [("delay_int", "dx", "k", {"x-delay": DELAY_INT32}, DELAY_INT32)], False)
    for target in ("direct", "proxy"):
        plain(target)
    for target in ("proxy", "proxy32"):
        cleanup(target)


if __name__ == "__main__":
    main()
