#!/usr/bin/env python3
"""moto's server (DynamoDB API) with every request handled alone.

moto applies a TransactWriteItems or a conditional write as a sequence of Python
steps without a lock, so two requests served on two threads can both pass their
conditions and both commit: DynamoDB itself never does that (a transaction is
serializable against every other write). The conformance suite checks exactly
that property, so the tests run moto behind one lock: one request at a time,
which makes each request atomic, as on DynamoDB and DynamoDB Local.

moto also backs up a table before a TransactWriteItems by deep-copying it once per
item of the transaction (moto 5.2: `copy.deepcopy` inside the loop over items), so
a 40-item transaction copies the whole table 40 times. The backups are identical;
here each table is copied once per transaction, which keeps the rollback exactly
as it was and makes a transaction cost one copy instead of one per item.

    moto_serialized.py [-H HOST] [-p PORT]
"""
import argparse
import copy
import threading

import moto.dynamodb.models as dynamodb_models

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

parser = argparse.ArgumentParser()
parser.add_argument("-H", "--host", default="127.0.0.1")
parser.add_argument("-p", "--port", type=int, default=5000)
args = parser.parse_args()

class _CopyOncePerTransaction:
    """`copy` as moto's DynamoDB models see it: inside a transaction, a second deep
    copy of the same table answers the first one's result (the table is kept
    referenced, so its id cannot be reused). Anything else is copied as before."""

    memo = None

    def deepcopy(self, x, *args, **kwargs):
        if self.memo is None or not isinstance(x, dynamodb_models.Table):
            return copy.deepcopy(x, *args, **kwargs)
        if id(x) not in self.memo:
            self.memo[id(x)] = (x, copy.deepcopy(x, *args, **kwargs))
        return self.memo[id(x)][1]

    def __getattr__(self, name):
        return getattr(copy, name)


_copy_shim = _CopyOncePerTransaction()
dynamodb_models.copy = _copy_shim
_transact_write_items = dynamodb_models.DynamoDBBackend.transact_write_items


def _transact_write_items_copying_once(self, *args, **kwargs):
    _copy_shim.memo = {}
    try:
        return _transact_write_items(self, *args, **kwargs)
    finally:
        _copy_shim.memo = None


dynamodb_models.DynamoDBBackend.transact_write_items = _transact_write_items_copying_once

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def serialized(environ, start_response):
    with lock:
        # Materialise the body inside the lock: the whole request is one step.
        return [b"".join(app(environ, start_response))]


run_simple(args.host, args.port, serialized, threaded=True)
