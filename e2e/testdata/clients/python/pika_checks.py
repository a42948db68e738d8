"""The e2e client suite's checks with pika (python3-pika), a program of its
own under /usr/bin/python3: see common.py and e2e/clients_test.go."""

import datetime
import decimal
import re
import time

import pika
import pika.exceptions

from common import (ARRIVAL_TIMEOUT, CLOSE_ROUNDS, DELAY_FLOAT, DELAY_INT, DELAY_INT32,
                    DELAY_STRING, DELAY_TOPIC, DELAY_TX, DT_DELAY, DT_TIME, header_value, name,
                    now_ms, run, text, url)


def connect(target, **kw):
    return pika.BlockingConnection(pika.URLParameters(url(target, **kw)))


def error_of(e):
    """The reply code and text a refusal carried, wherever pika put it."""
    while True:
        if isinstance(e, (pika.exceptions.ChannelClosed, pika.exceptions.ConnectionClosed)):
            return {"code": e.reply_code, "text": text(e.reply_text)}
        if e.args and isinstance(e.args[0], Exception):
            e = e.args[0]
            continue
        # A refused login: pika keeps only the text of the connection.close,
        # "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - ...'".
        m = e.args and re.search(r"\((\d+)\) '(.*)'$", str(e.args[0]))
        if m:
            return {"code": int(m.group(1)), "text": m.group(2)}
        return {"code": None, "text": "%s: %s" % (type(e).__name__, e)}


def server(target):
    c = connect(target)
    try:
        p = c._impl.server_properties
        return {"product": text(p.get("product")), "version": text(p.get("version")),
                "channel_max": c._impl.params.channel_max}
    finally:
        c.close()


def declare_delayed(ch, target):
    out = {}
    for typ, suffix in (("direct", "dx"), ("topic", "dt")):
        try:
            ch.exchange_declare(name(target, suffix), "x-delayed-message", durable=True,
                                arguments={"x-delayed-type": typ})
            out[typ] = "ok"
        except Exception as e:
            out[typ] = str(error_of(e))
    return out


def poll(ch, queue, want, extra_wait=0.3):
    """basic.get on queue until every message-id of want arrived (and
    extra_wait more seconds): message-id -> (arrival ms, headers)."""
    got = {}
    deadline = time.monotonic() + ARRIVAL_TIMEOUT
    quiet_until = None
    while time.monotonic() < deadline:
        method, props, _ = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            got[props.message_id] = (now_ms(), props.headers)
            continue
        if want <= set(got):
            if quiet_until is None:
                quiet_until = time.monotonic() + extra_wait
            elif time.monotonic() >= quiet_until:
                break
        time.sleep(0.01)
    return got


def delayed(target, cases, emit_declare):
    """Declares the delayed exchanges on target, publishes cases (check,
    exchange suffix, key, headers, delay) with confirms and reports each."""
    c = connect(target)
    try:
        ch = c.channel()
        decl = declare_delayed(ch, target)
        if emit_declare:
            run("declare", target, lambda: decl)
        ch.confirm_delivery()
        q = name(target, "dq")
        ch.queue_declare(q, exclusive=True)
        ch.queue_bind(q, name(target, "dx"), "k")
        ch.queue_bind(q, name(target, "dt"), "a.#")
        sent = {}
        for check, suffix, key, headers, _ in cases:
            t0 = now_ms()
            try:
                ch.basic_publish(name(target, suffix), key, b"body of " + check.encode(),
                                 pika.BasicProperties(headers=headers, message_id=check,
                                                      delivery_mode=2))
                sent[check] = (t0, True)
            except pika.exceptions.NackError:
                sent[check] = (t0, False)
            except Exception as e:
                run(check, target, lambda: (_ for _ in ()).throw(e))
                sent[check] = None
        want = {check for check, _, _, _, delay in cases if delay is not None}
        got = poll(ch, q, want)
        for check, _, _, _, delay in cases:
            if delay is None or sent[check] is None:
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


def delivery_time(target):
    """RabbitMQ 4.4's delivery-time headers through the default exchange:
    per case, whether it was confirmed, when it arrived (ms after the
    publish), and whether its headers arrived as published."""
    c = connect(target)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        q = new_queue(ch)
        start = now_ms()  # before wall: a time wall + d is d ms or more after start
        wall = int(time.time() * 1000)
        secs = wall // 1000 + 2  # a whole second, 1-2 s ahead: a timestamp ('T')
        cases = [  # name, headers, least delay in ms (None: at once)
            ("delay_int", {"x-opt-delivery-delay": DT_DELAY}, DT_DELAY),
            ("time_long", {"x-opt-delivery-time": wall + DT_TIME}, DT_TIME),
            ("time_timestamp", {"x-opt-delivery-time": datetime.datetime.fromtimestamp(secs, datetime.timezone.utc).replace(tzinfo=None)},
             secs * 1000 - wall - 1),
            ("both_time_decides", {"x-opt-delivery-time": wall + DT_TIME, "x-opt-delivery-delay": 1}, DT_TIME),
            ("time_past", {"x-opt-delivery-time": wall - 1000}, None),
            ("delay_zero", {"x-opt-delivery-delay": 0}, None),
            ("delay_negative", {"x-opt-delivery-delay": -5}, None),
            ("delay_string", {"x-opt-delivery-delay": "60000"}, None),
            ("delay_decimal", {"x-opt-delivery-delay": decimal.Decimal("60000.5")}, None),
        ]
        sent = {}
        for case, headers, _ in cases:
            # A delay counts from its publish, a time from start.
            t0 = start if "x-opt-delivery-time" in headers else now_ms()
            try:
                ch.basic_publish("", q, b"dt", pika.BasicProperties(headers=headers, message_id=case))
                sent[case] = (t0, True)
            except pika.exceptions.NackError:
                sent[case] = (t0, False)
        got = poll(ch, q, {case for case, _, _ in cases})
        out = {}
        for case, headers, delay in cases:
            t0, confirmed = sent[case]
            at, arrived_headers = got.get(case, (None, None))
            out[case] = {"confirmed": confirmed, "arrived": at is not None,
                         "elapsed_ms": None if at is None else at - t0,
                         "least_ms": delay, "headers_unchanged": arrived_headers == headers}
        return out
    finally:
        c.close()


def new_queue(ch):
    return ch.queue_declare("", exclusive=True).method.queue


def count(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


def get(ch):
    q = new_queue(ch)
    ch.basic_publish("", q, b"hello")
    method, _, body = ch.basic_get(q, auto_ack=True)
    again, _, _ = ch.basic_get(q, auto_ack=True)
    return {"body": text(body), "redelivered": method.redelivered,
            "message_count": method.message_count, "then_empty": again is None}


def consume_ack(ch):
    q = new_queue(ch)
    for b in (b"m1", b"m2", b"m3"):
        ch.basic_publish("", q, b)
    bodies = []
    for method, _, body in ch.consume(q, inactivity_timeout=5):
        if method is None:
            break
        bodies.append(text(body))
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 3:
            break
    ch.cancel()
    return {"bodies": bodies, "left": count(ch, q)}


def reject_requeue(ch):
    q = new_queue(ch)
    ch.basic_publish("", q, b"r")
    redelivered = []
    m, _, _ = ch.basic_get(q)
    redelivered.append(m.redelivered)
    ch.basic_reject(m.delivery_tag, requeue=True)
    m, _, _ = ch.basic_get(q)
    redelivered.append(m.redelivered)
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _, _ = ch.basic_get(q)
    redelivered.append(m.redelivered)
    ch.basic_ack(m.delivery_tag)
    return {"redelivered": redelivered, "left": count(ch, q)}


def qos(c, ch):
    q = new_queue(ch)
    ch.basic_qos(prefetch_count=1)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    tags = []
    ch.basic_consume(q, lambda _ch, m, _p, _b: tags.append(m.delivery_tag))

    def pump(n, seconds):
        """Dispatches until n deliveries came or seconds passed."""
        deadline = time.monotonic() + seconds
        while len(tags) < n and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.05)
    pump(1, 5)
    pump(2, 0.3)  # a second one must not come before the ack
    before = len(tags)
    ch.basic_ack(tags[0])
    pump(2, 5)
    after = len(tags)
    for tag in tags[1:]:
        ch.basic_ack(tag)
    return {"before_ack": before, "after_ack": after}


def get_wait(ch, q):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m, props, _ = ch.basic_get(q)
        if m is not None:
            return m, props
        time.sleep(0.01)
    raise TimeoutError("no message in %s" % q)


def quorum(ch, target):
    q = name(target, "qq")
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    try:
        ch.confirm_delivery()
        ch.basic_publish("", q, b"q")
        counts = []
        for settle in ("reject", "nack", "reject", "ack"):
            m, props = get_wait(ch, q)
            counts.append((props.headers or {}).get("x-delivery-count"))
            if settle == "reject":
                ch.basic_reject(m.delivery_tag, requeue=True)
            elif settle == "nack":
                ch.basic_nack(m.delivery_tag, requeue=True)
            else:
                ch.basic_ack(m.delivery_tag)
        return {"counts": counts}
    finally:
        ch.queue_delete(q)


def mandatory(ch, target):
    ch.confirm_delivery()
    key = name(target, "nowhere")
    try:
        ch.basic_publish("", key, b"m", mandatory=True)
    except pika.exceptions.UnroutableError as e:
        r = e.messages[0].method
        return {"reply_code": r.reply_code, "reply_text": r.reply_text,
                "exchange": r.exchange, "routing_key": r.routing_key}
    return {"reply_code": None}


def tx(ch):
    q = new_queue(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    ch.tx_rollback()
    after_rollback = count(ch, q)
    ch.basic_publish("", q, b"committed")
    ch.tx_commit()
    return {"after_rollback": after_rollback, "after_commit": count(ch, q)}


def tx_delayed(ch, target):
    q = name(target, "txq")
    ch.queue_declare(q, exclusive=True)
    ch.queue_bind(q, name(target, "dx"), "tx")
    ch.tx_select()
    for mid in ("rolled-back", "committed"):
        t0 = now_ms()
        ch.basic_publish(name(target, "dx"), "tx", b"tx",
                         pika.BasicProperties(headers={"x-delay": DELAY_TX}, message_id=mid))
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
            ch.basic_publish("", q, b"x" * 1000)
        try:
            c.close()
        except Exception as e:
            close_error = "%s: %s" % (type(e).__name__, e)
            break
    c = connect(target)
    new_queue(c.channel())
    c.close()
    return {"close_error": close_error, "reopened": True}


def refusal(fn):
    """Runs fn, which must end in a refusal, and returns its code and text."""
    try:
        fn()
    except Exception as e:
        return error_of(e)
    return {"code": None, "text": "not refused"}


def error_406_queue(c, target):
    q = name(target, "eq")
    c.channel().queue_declare(q, exclusive=True)
    return refusal(lambda: c.channel().queue_declare(q, exclusive=True,
                                                     arguments={"x-max-length": 10}))


def error_406_exchange(c, target):
    x = name(target, "px")
    ch = c.channel()
    ch.exchange_declare(x, "direct")
    try:
        return refusal(lambda: c.channel().exchange_declare(x, "fanout"))
    finally:
        ch.exchange_delete(x)


def error_404(c, target):
    def go():
        ch = c.channel()
        ch.basic_publish(name(target, "missing"), "k", b"m")
        ch.queue_declare("", exclusive=True)
    return refusal(go)


def error_406_delay(c, target):
    def go():
        ch = c.channel()
        ch.basic_publish(name(target, "dx"), "k", b"m",
                         pika.BasicProperties(headers={"x-delay": "abc"}))
        ch.queue_declare("", exclusive=True)
    return refusal(go)


def error_406_delayed_type(c, target):
    return refusal(lambda: c.channel().exchange_declare(
        name(target, "dx"), "x-delayed-message", durable=True,
        arguments={"x-delayed-type": "topic"}))


def connect_refused(target, **kw):
    return refusal(lambda: connect(target, **kw).close())


def plain(target):
    c = connect(target)
    try:
        run("get", target, get, c.channel())
        run("consume_ack", target, consume_ack, c.channel())
        run("reject_requeue", target, reject_requeue, c.channel())
        run("qos", target, qos, c, c.channel())
        run("quorum", target, quorum, c.channel(), target)
        run("mandatory", target, mandatory, c.channel(), target)
        run("tx", target, tx, c.channel())
        if target == "proxy":
            run("tx_delayed", target, tx_delayed, c.channel(), target)
        run("error_406_queue", target, error_406_queue, c, target)
        run("error_406_exchange", target, error_406_exchange, c, target)
        run("error_404", target, error_404, c, target)
        if target == "proxy":
            run("error_406_delay", target, error_406_delay, c, target)
            run("error_406_delayed_type", target, error_406_delayed_type, c, target)
    finally:
        c.close()
    run("close_reopen", target, close_reopen, target)
    run("error_403", target, lambda: connect_refused(target, password="wrong"))
    run("error_530", target, lambda: connect_refused(target, vhost="no-such-vhost"))


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
    # pika encodes no float: a fraction goes as a decimal ('D').
    ("delay_float", "dx", "k", {"x-delay": decimal.Decimal(str(DELAY_FLOAT))}, int(DELAY_FLOAT)),
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
    run("delivery_time", "proxy", delivery_time, "proxy")
    for target in ("direct", "proxy"):
        plain(target)
    for target in ("proxy", "proxy32"):
        cleanup(target)


if __name__ == "__main__":
    main()
