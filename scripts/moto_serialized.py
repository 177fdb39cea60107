#!/usr/bin/env python3
"""moto's server (DynamoDB API) with every request handled alone.

moto applies a TransactWriteItems or a conditional write as a sequence of Python
steps without a lock, so two requests served on two threads can both pass their
conditions and both commit: DynamoDB itself never does that (a transaction is
serializable against every other write). The conformance suite checks exactly
that property, so the tests run moto behind one lock: one request at a time,
which makes each request atomic, as on DynamoDB and DynamoDB Local.

Two of moto's DynamoDB steps cost time in proportion to the whole table, which the
tests and the benchmark grow to thousands of items; both are replaced here by steps
that give the same answers in proportion to what a request touches:

- TransactWriteItems: moto deep-copies every table of the transaction (once per
  item of it) to roll back a cancelled transaction. Here, with requests already one
  at a time, every condition is checked first and nothing is written unless all
  hold (DynamoDB's all-or-nothing); only the items the transaction touches are
  backed up, for a write that fails after its checks passed.
- Query on a table's key: moto sorts every item of the table and keeps the
  partition's. Here it looks at the partition's items only (same filter, same order).
"""
import argparse
import copy
import threading

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.exceptions import (
    MockValidationException,
    MultipleTransactionsException,
    TooManyTransactionsException,
    TransactionCanceledException,
    TransactWriteSingleOpException,
)
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

parser = argparse.ArgumentParser()
parser.add_argument("-H", "--host", default="127.0.0.1")
parser.add_argument("-p", "--port", type=int, default=5000)
args = parser.parse_args()

def _key_of(table, op_type, op):
    if op_type == "Put":
        attrs = op["Item"]
        key = {table.hash_key_attr: attrs[table.hash_key_attr]}
        if table.range_key_attr is not None:
            key[table.range_key_attr] = attrs[table.range_key_attr]
        return key
    return op["Key"]


def _restore(backend, table_name, key, item):
    """Puts `item` (or no item) back at `key` of `table_name`."""
    table = backend.get_table(table_name)
    hash_value = DynamoType(key[table.hash_key_attr])
    range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
    if item is None:
        table.delete_item(hash_value, range_value)
    elif range_value is not None:
        table.items[hash_value][range_value] = item
    else:
        table.items[hash_value] = item


def _transact_write_items(self, transact_items):
    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    parsed, seen = [], set()
    for item in transact_items:
        if len(list(item.keys())) > 1:
            raise TransactWriteSingleOpException
        op_type, op = next(iter(item.items()))
        if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
            raise ValueError("Unsupported transaction operation")
        table_name = op["TableName"]
        key = _key_of(self.get_table(table_name), op_type, op)
        ident = (str(table_name), str(dict(sorted(key.items()))))
        if ident in seen:
            raise MultipleTransactionsException()
        seen.add(ident)
        parsed.append((op_type, op, table_name, key))
    # Every condition against the state before the transaction.
    errors = []
    for op_type, op, table_name, key in parsed:
        condition = op.get("ConditionExpression")
        current = self.get_item(table_name, key)
        if condition is not None:
            check = get_filter_expression(
                condition, op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
            )
            if not check.expr(current):
                old = None
                if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
                    old = current.to_json()["Attributes"]
                errors.append(("ConditionalCheckFailed", "The conditional request failed", old))
                continue
        errors.append((None, None, None))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    # All hold: write, with the touched items backed up.
    backups = [(t, k, copy.deepcopy(self.get_item(t, k))) for _, _, t, k in parsed]
    try:
        for op_type, op, table_name, key in parsed:
            names, values = op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
            if op_type == "Put":
                self.put_item(table_name, op["Item"], condition_expression=op.get("ConditionExpression"),
                              expression_attribute_names=names, expression_attribute_values=values)
            elif op_type == "Delete":
                self.delete_item(table_name, key, condition_expression=op.get("ConditionExpression"),
                                 expression_attribute_names=names, expression_attribute_values=values)
            elif op_type == "Update":
                self.update_item(table_name, key, update_expression=op["UpdateExpression"],
                                 condition_expression=op.get("ConditionExpression"),
                                 expression_attribute_names=names, expression_attribute_values=values)
    except Exception as e:
        for table_name, key, item in reversed(backups):
            _restore(self, table_name, key, item)
        if isinstance(e, (MultipleTransactionsException, MockValidationException)):
            raise
        failed = [(type(e).__name__, str(e), None)] + [(None, None, None)] * (len(parsed) - 1)
        raise TransactionCanceledException(failed)


dynamodb_models.DynamoDBBackend.transact_write_items = _transact_write_items

_query = Table.query


def _query_one_partition(self, hash_key, *args, **kwargs):
    # moto's backend passes index_name as the 8th positional argument.
    index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
    if index_name is not None or hash_key is None:
        return _query(self, hash_key, *args, **kwargs)
    partition = self.items.get(hash_key)
    if partition is None:
        items = []
    elif self.range_key_attr:
        items = list(partition.values())
    else:
        items = [partition]
    self.all_items = lambda: items  # shadows the method for this call only
    try:
        return _query(self, hash_key, *args, **kwargs)
    finally:
        del self.all_items


Table.query = _query_one_partition

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def serialized(environ, start_response):
    with lock:
        # Materialise the body inside the lock: the whole request is one step.
        return [b"".join(app(environ, start_response))]


run_simple(args.host, args.port, serialized, threaded=True)
