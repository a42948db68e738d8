"""The e2e client suite's checks with py-amqp (python3-amqp), a program of
its own under /usr/bin/python3: see common.py and e2e/clients_test.go."""

import socket
import time

import amqp
import amqp.exceptions

from common import (ARRIVAL_TIMEOUT, CLOSE_ROUNDS, DELAY_FLOAT, DELAY_INT, DELAY_INT32,
                    DELAY_STRING, DELAY_TOPIC, DELAY_TX, ADDRS, PASSWORD, USER,
                    header_value, name, now_ms, run, text)


def connect(target, password=None, vhost="/"):
    c = amqp.Connection(ADDRS[target], userid=USER, password=password or PASSWORD,
                        virtual_host=vhost)
    c.connect()
    return c


def error_of(e):
    if isinstance(e, amqp.exceptions.AMQPError):
        return {"code": e.reply_code, "text": text(e.reply_text)}
    return {"code": None, "text": "%s: %s" % (type(e).__name__, e)}


def refusal(fn):
    try:
        fn()
    except Exception as e:
        return error_of(e)
    return {"code": None, "text": "not refused"}


def server(target):
    c = connect(target)
    try:
        p = c.server_properties
        return {"product": text(p.get("product")), "version": text(p.get("version")),
                "channel_max": c.channel_max}
    finally:
        c.close()


def msg(body, headers=None, **props):
    if headers is not None:
        props["application_headers"] = headers
    return amqp.Message(body, **props)


def headers_of(m):
    return m.properties.get("application_headers")


def poll(ch, queue, want, extra_wait=0.3):
    got = {}
    deadline = time.monotonic() + ARRIVAL_TIMEOUT
    quiet_until = None
    while time.monotonic() < deadline:
        m = ch.basic_get(queue, no_ack=True)
        if m is not None:
            got[m.properties.get("message_id")] = (now_ms(), headers_of(m))
            continue
        if want <= set(got):
            if quiet_until is None:
                quiet_until = time.monotonic() + extra_wait
            elif time.monotonic() >= quiet_until:
                break
        time.sleep(0.01)
    return got


def delayed(target, cases, emit_declare):
    c = connect(target)
    try:
        ch = c.channel()
        decl = {}
        for typ, suffix in (("direct", "dx"), ("topic", "dt")):
            try:
                ch.exchange_declare(name(target, suffix), "x-delayed-message", durable=True,
                                    auto_delete=False, arguments={"x-delayed-type": typ})
                decl[typ] = "ok"
            except Exception as e:
                decl[typ] = str(error_of(e))
                ch = c.channel()
        if emit_declare:
            run("declare", target, lambda: decl)
        ch.confirm_select()
        q = name(target, "dq")
        ch.queue_declare(q, exclusive=True)
        ch.queue_bind(q, name(target, "dx"), "k")
        ch.queue_bind(q, name(target, "dt"), "a.#")
        sent = {}
        for check, suffix, key, headers, _ in cases:
            t0 = now_ms()
            try:
                ch.basic_publish_confirm(msg(b"body of " + check.encode(), headers,
                                             message_id=check, delivery_mode=2),
                                         name(target, suffix), key)
                sent[check] = (t0, True)
            except amqp.exceptions.MessageNacked:
                sent[check] = (t0, False)
        want = {check for check, _, _, _, delay in cases if delay is not None}
        got = poll(ch, q, want)
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
    finally:
        c.close()


def new_queue(ch):
    return ch.queue_declare("", exclusive=True, auto_delete=False).queue


def count(ch, q):
    return ch.queue_declare(q, passive=True).message_count


def get(ch):
    q = new_queue(ch)
    ch.basic_publish(msg(b"hello"), "", q)
    m = ch.basic_get(q, no_ack=True)
    again = ch.basic_get(q, no_ack=True)
    return {"body": text(m.body), "redelivered": m.delivery_info["redelivered"],
            "message_count": m.delivery_info["message_count"], "then_empty": again is None}


def drain(c, seconds):
    """Dispatches what arrives for seconds."""
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
    for b in (b"m1", b"m2", b"m3"):
        ch.basic_publish(msg(b), "", q)
    bodies = []

    def on(m):
        bodies.append(text(m.body))
        ch.basic_ack(m.delivery_tag)
    tag = ch.basic_consume(q, callback=on)
    deadline = time.monotonic() + 5
    while len(bodies) < 3 and time.monotonic() < deadline:
        drain(c, 0.1)
    ch.basic_cancel(tag)
    return {"bodies": bodies, "left": count(ch, q)}


def reject_requeue(ch):
    q = new_queue(ch)
    ch.basic_publish(msg(b"r"), "", q)
    redelivered = []
    m = ch.basic_get(q)
    redelivered.append(m.delivery_info["redelivered"])
    ch.basic_reject(m.delivery_tag, requeue=True)
    m = ch.basic_get(q)
    redelivered.append(m.delivery_info["redelivered"])
    nack(ch, m.delivery_tag)
    m = ch.basic_get(q)
    redelivered.append(m.delivery_info["redelivered"])
    ch.basic_ack(m.delivery_tag)
    return {"redelivered": redelivered, "left": count(ch, q)}


def qos(c, ch):
    q = new_queue(ch)
    ch.basic_qos(0, 1, False)
    ch.basic_publish(msg(b"a"), "", q)
    ch.basic_publish(msg(b"b"), "", q)
    tags = []
    ch.basic_consume(q, callback=lambda m: tags.append(m.delivery_tag))
    pump(c, lambda: len(tags) >= 1, 5)
    pump(c, lambda: len(tags) >= 2, 0.3)  # a second one must not come before the ack
    before = len(tags)
    ch.basic_ack(tags[0])
    pump(c, lambda: len(tags) >= 2, 5)
    after = len(tags)
    for tag in tags[1:]:
        ch.basic_ack(tag)
    return {"before_ack": before, "after_ack": after}


def nack(ch, tag):
    """py-amqp has no basic_nack (kombu rejects): reject it instead."""
    ch.basic_reject(tag, requeue=True)


def get_wait(ch, q):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = ch.basic_get(q)
        if m is not None:
            return m
        time.sleep(0.01)
    raise TimeoutError("no message in %s" % q)


def quorum(ch, target):
    q = name(target, "qq")
    ch.queue_declare(q, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    try:
        ch.basic_publish_confirm(msg(b"q"), "", q)
        counts = []
        for settle in ("reject", "nack", "reject", "ack"):
            m = get_wait(ch, q)
            counts.append((headers_of(m) or {}).get("x-delivery-count"))
            if settle == "reject":
                ch.basic_reject(m.delivery_tag, requeue=True)
            elif settle == "nack":
                nack(ch, m.delivery_tag)
            else:
                ch.basic_ack(m.delivery_tag)
        return {"counts": counts}
    finally:
        ch.queue_delete(q)


def mandatory(ch, target):
    returned = []
    ch.events["basic_return"].add(
        lambda exc, exchange, key, m: returned.append((exc, exchange, key)))
    key = name(target, "nowhere")
    ch.basic_publish_confirm(msg(b"m"), "", key, mandatory=True)
    if not returned:
        return {"reply_code": None}
    exc, exchange, key = returned[0]
    return {"reply_code": exc.reply_code, "reply_text": text(exc.reply_text),
            "exchange": exchange, "routing_key": key}


def tx(ch):
    q = new_queue(ch)
    ch.tx_select()
    ch.basic_publish(msg(b"rolled back"), "", q)
    ch.tx_rollback()
    after_rollback = count(ch, q)
    ch.basic_publish(msg(b"committed"), "", q)
    ch.tx_commit()
    return {"after_rollback": after_rollback, "after_commit": count(ch, q)}


def tx_delayed(ch, target):
    q = name(target, "txq")
    ch.queue_declare(q, exclusive=True)
    ch.queue_bind(q, name(target, "dx"), "tx")
    ch.tx_select()
    for mid in ("rolled-back", "committed"):
        t0 = now_ms()
        ch.basic_publish(msg(b"tx", {"x-delay": DELAY_TX}, message_id=mid), name(target, "dx"), "tx")
        if mid == "rolled-back":
            ch.tx_rollback()
        else:
            ch.tx_commit()
    got = poll(ch, q, {"committed"})
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
        q = new_queue(ch)
        for _ in range(500):
            ch.basic_publish(msg(b"x" * 1000), "", q)
        try:
            c.close()
        except Exception as e:
            close_error = "%s: %s" % (type(e).__name__, e)
            break
    c = connect(target)
    new_queue(c.channel())
    c.close()
    return {"close_error": close_error, "reopened": True}


def error_406_queue(c, target):
    q = name(target, "eq")
    c.channel().queue_declare(q, exclusive=True)
    return refusal(lambda: c.channel().queue_declare(q, exclusive=True,
                                                     arguments={"x-max-length": 10}))


def error_406_exchange(c, target):
    x = name(target, "px")
    ch = c.channel()
    ch.exchange_declare(x, "direct", auto_delete=False)
    try:
        return refusal(lambda: c.channel().exchange_declare(x, "fanout", auto_delete=False))
    finally:
        ch.exchange_delete(x)


def publish_refused(c, exchange, headers=None):
    def go():
        ch = c.channel()
        ch.basic_publish(msg(b"m", headers), exchange, "k")
        ch.queue_declare("", exclusive=True)
    return refusal(go)


def plain(target):
    c = connect(target)
    try:
        run("get", target, get, c.channel())
        run("consume_ack", target, consume_ack, c, c.channel())
        run("reject_requeue", target, reject_requeue, c.channel())
        run("qos", target, qos, c, c.channel())
        run("quorum", target, quorum, c.channel(), target)
        run("mandatory", target, mandatory, c.channel(), target)
        run("tx", target, tx, c.channel())
        if target == "proxy":
            run("tx_delayed", target, tx_delayed, c.channel(), target)
        run("error_406_queue", target, error_406_queue, c, target)
        run("error_406_exchange", target, error_406_exchange, c, target)
        run("error_404", target, publish_refused, c, name(target, "missing"))
        if target == "proxy":
            run("error_406_delay", target, publish_refused, c, name(target, "dx"), {"x-delay": "abc"})
            run("error_406_delayed_type", target, lambda: refusal(lambda: c.channel().exchange_declare(
                name(target, "dx"), "x-delayed-message", durable=True, auto_delete=False,
                arguments={"x-delayed-type": "topic"})))
    finally:
        c.close()
    run("close_reopen", target, close_reopen, target)
    run("error_403", target, lambda: refusal(lambda: connect(target, password="wrong").close()))
    run("error_530", target, lambda: refusal(lambda: connect(target, vhost="no-such-vhost").close()))


def cleanup(target):
    c = connect(target)
    try:
        ch = c.channel()
        for suffix in ("dx", "dt"):
            ch.exchange_delete(name(target, suffix))
    finally:
        c.close()


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
