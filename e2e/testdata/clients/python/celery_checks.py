"""The e2e client suite's checks with Celery (python3-celery): a real
worker process per target, started here with its broker URL pointed at
the target, and tasks sent to it; see celery_app.py, common.py and
e2e/clients_test.go."""

import os
import signal
import subprocess
import sys
import time

import celery.exceptions

from celery_app import make_app
from common import name, run, text

COUNTDOWN = 0.3  # seconds; the suite expects 300 ms
RESULT_TIMEOUT = 60


def start_worker(target):
    env = dict(os.environ, CELERY_TARGET=target)
    return subprocess.Popen(
        # -W ignore: no SecurityWarning for a worker run as root in CI.
        [sys.executable, "-W", "ignore", "-m", "celery", "--quiet", "-A", "celery_app:app", "worker",
         "--pool=solo", "--concurrency=1", "--loglevel=warning",
         "--without-heartbeat", "--without-mingle", "--without-gossip",
         "--hostname=%s@localhost" % name(target, "worker"),
         "-Q", name(target, "cq")],
        cwd=os.path.dirname(os.path.abspath(__file__)), env=env,
        stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr)


def stop_worker(p):
    p.send_signal(signal.SIGTERM)  # warm shutdown
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def server(app):
    with app.connection_for_write() as c:
        c.connect()
        p = c.connection.server_properties
        return {"product": text(p.get("product")), "version": text(p.get("version")),
                "channel_max": c.connection.channel_max}


def result_of(r, worker):
    """The task's result, once its worker has run it; an error as soon as
    the worker is gone."""
    deadline = time.monotonic() + RESULT_TIMEOUT
    while True:
        try:
            return r.get(timeout=1)
        except celery.exceptions.TimeoutError:
            if worker.poll() is not None:
                raise RuntimeError("the worker exited with %s" % worker.returncode)
            if time.monotonic() > deadline:
                raise


def task(app, worker):
    return {"result": result_of(app.add_task.delay(2, 3), worker)["sum"]}


def countdown(app, worker):
    sent = time.time()
    r = app.add_task.apply_async((2, 3), countdown=COUNTDOWN)
    res = result_of(r, worker)
    return {"confirmed": True, "arrived": True, "countdown_ms": int(COUNTDOWN * 1000),
            "elapsed_ms": (res["ran_at"] - sent) * 1000, "result": res["sum"],
            "x_delay": res["x_delay"], "x_delay_type": res["x_delay_type"]}


def cleanup(app, target):
    with app.connection_for_write() as c:
        ch = c.channel()
        ch.queue_delete(name(target, "cq"))
        ch.exchange_delete(name(target, "cx"))


def main():
    targets = ("direct", "proxy", "proxy32")
    apps = {t: make_app(t) for t in targets}
    workers = {t: start_worker(t) for t in targets}
    try:
        for t in ("direct", "proxy"):
            run("server", t, server, apps[t])
        for t in ("direct", "proxy"):
            run("celery_task", t, task, apps[t], workers[t])
        for t in ("proxy", "proxy32"):
            run("celery_countdown", t, countdown, apps[t], workers[t])
    finally:
        for p in workers.values():
            stop_worker(p)
        for t in targets:
            try:
                cleanup(apps[t], t)
            except Exception as e:  # the test deletes them too
                print("cleanup %s: %s" % (t, e), file=sys.stderr)


if __name__ == "__main__":
    main()
