"""What every Python client program of the e2e client suite shares.

The suite's protocol (e2e/clients_test.go): the program reads its targets
from the environment, runs each check against them and prints one JSON line
per check and target: {"check": NAME, "target": TARGET, "result": {...}}, or
{"check": NAME, "target": TARGET, "error": "..."} when the check raised.
"""

import json
import os
import sys
import time
import traceback

USER = os.environ["CLIENT_USER"]
PASSWORD = os.environ["CLIENT_PASSWORD"]
PREFIX = os.environ["CLIENT_PREFIX"]

# target -> "host:port": the broker itself, the proxy in front of it with
# --released-delay-type int64, and the one with int32.
ADDRS = {
    "direct": os.environ["CLIENT_DIRECT_ADDR"],
    "proxy": os.environ["CLIENT_PROXY_ADDR"],
    "proxy32": os.environ["CLIENT_PROXY32_ADDR"],
}

# The delays the suite asks for, in milliseconds (e2e/clients_test.go
# expects the same numbers).
DELAY_INT = 300
DELAY_STRING = "350"
DELAY_FLOAT = 400.7
DELAY_TOPIC = 300
DELAY_INT32 = 450
DELAY_TX = 300
# x-opt-delivery-delay, and x-opt-delivery-time as ms after the publish.
DT_DELAY = 300
DT_TIME = 400

# How many connections close_reopen closes with publishes in flight: a
# reset after close-ok comes in a third to a half of them (amqplib).
CLOSE_ROUNDS = 10

# How long a program waits for a delayed message before it reports it lost.
ARRIVAL_TIMEOUT = 20.0


def url(target, password=None, vhost="%2f"):
    """The AMQP URL of target; vhost "/" is written %2f."""
    return "amqp://%s:%s@%s/%s" % (USER, password or PASSWORD, ADDRS[target], vhost)


def host_port(target):
    host, port = ADDRS[target].rsplit(":", 1)
    return host, int(port)


def name(target, suffix):
    """The name of one of the program's exchanges or queues on target."""
    return "%s.%s.%s" % (PREFIX, target, suffix)


def emit(check, target, result=None, error=None):
    line = {"check": check, "target": target}
    if error is not None:
        line["error"] = error
    else:
        line["result"] = result
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def run(check, target, fn, *args):
    """Runs fn(*args) and emits its result as check on target, or the
    exception it raised."""
    try:
        emit(check, target, fn(*args))
    except Exception as e:  # reported, the other checks go on
        emit(check, target, error="%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()))


def now_ms():
    return time.monotonic() * 1000.0


def header_value(headers, key):
    """x-delay as the client decoded it: its decimal text and its type."""
    if headers is None or key not in headers:
        return None, None
    v = headers[key]
    if isinstance(v, bytes):
        v = v.decode()
    return str(v), type(headers[key]).__name__


def text(v):
    return v.decode() if isinstance(v, bytes) else v
