#!/usr/bin/env python3
"""moto's server (DynamoDB API) with every request handled alone.

moto applies a TransactWriteItems or a conditional write as a sequence of Python
steps without a lock, so two requests served on two threads can both pass their
conditions and both commit: DynamoDB itself never does that (a transaction is
serializable against every other write). The conformance suite checks exactly
that property, so the tests run moto behind one lock: one request at a time,
which makes each request atomic, as on DynamoDB and DynamoDB Local.

    moto_serialized.py [-H HOST] [-p PORT]
"""
import argparse
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

parser = argparse.ArgumentParser()
parser.add_argument("-H", "--host", default="127.0.0.1")
parser.add_argument("-p", "--port", type=int, default=5000)
args = parser.parse_args()

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def serialized(environ, start_response):
    with lock:
        # Materialise the body inside the lock: the whole request is one step.
        return [b"".join(app(environ, start_response))]


run_simple(args.host, args.port, serialized, threaded=True)
