"""The Celery application of the e2e client suite (celery_checks.py): one
task queue behind an exchange of the program's, delayed (x-delayed-message)
through the proxy, plain direct on RabbitMQ itself.

A worker process loads it with CELERY_TARGET set: celery -A celery_app:app.
"""

import os
import time

from celery import Celery, Task
from kombu import Exchange, Queue

from common import name, url


class CountdownAsDelay(Task):
    """A task whose countdown is an x-delay header: RabbitMQ's delayed
    exchange (here, the proxy) holds the message, not the worker."""

    def apply_async(self, args=None, kwargs=None, countdown=None, **options):
        if countdown is not None:
            headers = dict(options.pop("headers", None) or {})
            headers["x-delay"] = int(countdown * 1000)
            options["headers"] = headers
        return super().apply_async(args, kwargs, **options)


def make_app(target):
    app = Celery("celery_app", broker=url(target), backend="rpc://")
    if target == "direct":
        exchange = Exchange(name(target, "cx"), type="direct")
    else:
        exchange = Exchange(name(target, "cx"), type="x-delayed-message",
                            arguments={"x-delayed-type": "direct"})
    queue = name(target, "cq")
    app.conf.update(
        task_queues=[Queue(queue, exchange, routing_key=queue)],
        task_default_queue=queue,
        task_default_exchange=exchange.name,
        task_default_routing_key=queue,
        broker_transport_options={"confirm_publish": True},
        worker_hijack_root_logger=False,
    )

    @app.task(base=CountdownAsDelay, bind=True, name="celery_app.add")
    def add(self, x, y):
        v = self.request.get("x-delay")
        return {"sum": x + y, "ran_at": time.time(),
                "x_delay": None if v is None else str(v),
                "x_delay_type": None if v is None else type(v).__name__}

    app.add_task = add
    return app


app = make_app(os.environ["CELERY_TARGET"]) if "CELERY_TARGET" in os.environ else None
