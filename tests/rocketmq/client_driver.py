"""Drives the official Apache RocketMQ 5 Python client (``rocketmq-python-client``) for the tests.

Run as a separate process: ``python tests/rocketmq/client_driver.py <scenario> '<json args>'``.
It prints one JSON object on its last stdout line. The client's generated stubs and ours
register the same protobuf names, so the client never shares a process with mqstore's code
(services.gateway.rocketmq.pb). HOME must point at a scratch folder: the client logs under
``~/logs``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


def _config(args: dict[str, Any]) -> ClientConfiguration:
    creds = Credentials(args["ak"], args["sk"]) if args.get("ak") else Credentials()
    return ClientConfiguration(
        args["endpoint"],
        creds,
        namespace=args.get("namespace", ""),
        request_timeout=args.get("request_timeout", 3),
    )


def _tls(args: dict[str, Any]) -> bool:
    """``"tls": true``: the client's TLS switch. It trusts gRPC's default roots only, which the
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH variable (set by the test) points at a custom CA."""
    return bool(args.get("tls"))


def _message(topic: str, spec: dict[str, Any]) -> Message:
    m = Message()
    m.topic = topic
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    for key in spec.get("keys") or []:
        m.keys = key  # the setter adds one key per assignment
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("deliver_at_s"):
        m.delivery_timestamp = int(spec["deliver_at_s"])
    for k, v in (spec.get("props") or {}).items():
        m.add_property(k, v)
    return m


def _view(m: Any) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "topic": m.topic,
        "namespace": m.namespace,
        "body": m.body.decode(errors="replace"),
        "attempt": m.delivery_attempt,
        "tag": m.tag,
        "keys": list(m.keys or []),
        "group": m.message_group,
        "props": dict(m.properties or {}),
        "corrupted": bool(getattr(m, "corrupted", False)),
        "born_ms": m.born_timestamp,
        "received_ms": int(time.time() * 1000),
    }


def _collect(futures: list[Any], ids: list[str], errors: list[str]) -> None:
    """Wait for send_async futures: message ids into ``ids``, failures into ``errors``."""
    for f in futures:
        try:
            ids.append(f.result(timeout=30).message_id)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")


def send(args: dict[str, Any]) -> dict[str, Any]:
    producer = Producer(_config(args), (args["topic"],), tls_enable=_tls(args))
    producer.startup()
    ids, errors = [], []
    try:
        futures = []
        for spec in args["messages"]:
            msg = _message(args["topic"], spec)
            try:
                if args.get("async"):
                    futures.append(producer.send_async(msg))
                else:
                    ids.append(producer.send(msg).message_id)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        _collect(futures, ids, errors)
    finally:
        producer.shutdown()
    return {"ids": ids, "errors": errors}


def simple(args: dict[str, Any]) -> dict[str, Any]:
    """Receive until ``expect`` messages (or ``timeout_s``); ack per ``ack`` ("all", "none").
    With ``change_first_s``, the first message's invisible time is changed, it is not acked, and
    its redelivery is awaited and acked with the new handle."""
    consumer = SimpleConsumer(
        _config(args),
        args["group"],
        {args["topic"]: FilterExpression(args.get("expr", "*"))},
        args.get("await_s", 5),
        tls_enable=_tls(args),
    )
    consumer.startup()
    got: list[dict[str, Any]] = []
    notes: dict[str, Any] = {}
    deadline = time.time() + args.get("timeout_s", 30)
    try:
        while len(got) < args["expect"] and time.time() < deadline:
            for m in consumer.receive(args.get("batch", 32), args.get("invisible_s", 20)):
                view = _view(m)
                got.append(view)
                if args.get("change_first_s") is not None and "changed" not in notes:
                    old = m.receipt_handle
                    consumer.change_invisible_duration(m, args["change_first_s"])
                    notes["changed"] = view["id"]
                    notes["handle_replaced"] = m.receipt_handle != old
                    continue
                if args.get("ack", "all") == "all":
                    try:
                        consumer.ack(m)
                        view["acked"] = True
                    except Exception as exc:
                        view["ack_error"] = f"{type(exc).__name__}: {exc}"
        if args.get("final_empty"):
            notes["final"] = [_view(m) for m in consumer.receive(32, 10)]
    finally:
        consumer.shutdown()
    return {"messages": got, **notes}


def receive_once(args: dict[str, Any]) -> dict[str, Any]:
    """One receive with ``invisible_s``: the messages' ids, or the error the client raised."""
    consumer = SimpleConsumer(
        _config(args), args["group"], {args["topic"]: FilterExpression("*")}, args.get("await_s", 2)
    )
    consumer.startup()
    try:
        try:
            got = consumer.receive(args.get("batch", 16), args["invisible_s"])
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"ids": [m.message_id for m in got]}
    finally:
        consumer.shutdown()


def push(args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer whose listener fails the messages whose body is in ``fail`` (always) or
    ``fail_once`` (the first time) and sleeps over those in ``slow``; runs until
    ``expect`` deliveries or ``timeout_s``."""
    fail = set(args.get("fail", []))
    fail_once = set(args.get("fail_once", []))
    slow = set(args.get("slow", []))  # the listener takes ``slow_s`` over these
    deliveries: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            with lock:
                deliveries.append(_view(message))
                if len(deliveries) >= args["expect"]:
                    done.set()
            body = message.body.decode()
            if body in slow:
                time.sleep(args.get("slow_s", 5))
            if body in fail_once:
                fail_once.discard(body)
                return ConsumeResult.FAILURE
            return ConsumeResult.FAILURE if body in fail else ConsumeResult.SUCCESS

    consumer = PushConsumer(
        _config(args), args["group"], Listener(), {args["topic"]: FilterExpression(args.get("expr", "*"))}
    )
    consumer.startup()
    try:
        done.wait(args.get("timeout_s", 60))
        time.sleep(args.get("linger_s", 1.0))  # let the last acks and nacks go out
    finally:
        consumer.shutdown()
    with lock:
        return {"deliveries": list(deliveries)}


def transaction(args: dict[str, Any]) -> dict[str, Any]:
    """Send half messages and resolve them: "commit", "rollback", or "check" (left open, the
    checker answers ``check_answer`` when the server asks)."""
    checks: list[str] = []

    class Checker(TransactionChecker):
        def check(self, message: Any) -> TransactionResolution:
            checks.append(message.message_id)
            return (
                TransactionResolution.COMMIT
                if args.get("check_answer") == "commit"
                else TransactionResolution.ROLLBACK
            )

    producer = Producer(_config(args), (args["topic"],), Checker())
    producer.startup()
    ids: list[str] = []
    try:
        for spec in args["messages"]:
            txn = producer.begin_transaction()
            receipt = producer.send(_message(args["topic"], spec), txn)
            ids.append(receipt.message_id)
            if spec["action"] == "commit":
                txn.commit()
            elif spec["action"] == "rollback":
                txn.rollback()
        deadline = time.time() + args.get("wait_checks_s", 0)
        while time.time() < deadline and len(set(checks)) < args.get("expect_checks", 0):
            time.sleep(0.2)
    finally:
        producer.shutdown()
    return {"ids": ids, "checks": checks}


def consume_many(args: dict[str, Any]) -> dict[str, Any]:
    """A SimpleConsumer that acks everything it receives, riding out gateway outages (errors
    are counted, the loop goes on), until ``expect`` distinct messages were delivered and then
    nothing more came for longer than the invisible time (so the redeliveries of deliveries
    whose ack did not get through have shown up), or ``timeout_s`` passes. Progress (distinct
    messages delivered) goes to ``progress_file`` so a test can act mid-run."""
    consumer = SimpleConsumer(
        _config(args), args["group"], {args["topic"]: FilterExpression("*")}, args.get("await_s", 3)
    )
    consumer.startup()
    invisible_s = args.get("invisible_s", 5)
    deliveries: list[list[Any]] = []  # [id, attempt, ack confirmed]
    seen: set[str] = set()
    errors = 0
    started = time.time()
    deadline = started + args.get("timeout_s", 120)
    quiet_since = time.time()
    try:
        while time.time() < deadline:
            if len(seen) >= args["expect"] and time.time() - quiet_since > invisible_s + 2:
                break
            try:
                batch = consumer.receive(32, invisible_s)
            except Exception:
                errors += 1
                time.sleep(0.3)
                continue
            if batch:
                quiet_since = time.time()
            for m in batch:
                row = [m.message_id, m.delivery_attempt, False]
                deliveries.append(row)
                seen.add(m.message_id)
                try:
                    consumer.ack(m)
                    row[2] = True
                except Exception:
                    errors += 1  # maybe applied, maybe not: the store decides whether it comes back
            with open(args["progress_file"], "w") as fh:
                fh.write(str(len(seen)))
    finally:
        consumer.shutdown()
    return {"deliveries": deliveries, "errors": errors, "seconds": time.time() - started}


def send_many(args: dict[str, Any]) -> dict[str, Any]:
    """``count`` messages of ``size`` bytes through send_async, ``window`` in flight."""
    producer = Producer(_config(args), (args["topic"],))
    producer.startup()
    ids: list[str] = []
    errors: list[str] = []
    started = time.time()
    try:
        pending = []
        for i in range(args["count"]):
            m = Message()
            m.topic = args["topic"]
            m.body = (f"{i:08d}".encode() * (args.get("size", 8) // 8 + 1))[: args.get("size", 8)]
            pending.append(producer.send_async(m))
            if len(pending) >= args.get("window", 64):
                _collect(pending, ids, errors)
                pending = []
        _collect(pending, ids, errors)
    finally:
        producer.shutdown()
    return {"ids": ids, "errors": errors[:20], "seconds": time.time() - started}


def receive_many(args: dict[str, Any]) -> dict[str, Any]:
    """A SimpleConsumer that receives (batches of 32) and acks each message until ``count``
    were acked, nothing came for ``idle_s`` after the first message (other consumers of the
    group took the rest), or ``timeout_s`` passed; timed from the first message to the last.
    With ``ids``, also the ids of the messages acked and of those received (with their delivery
    attempts), in order; the acks stop at exactly ``count``, leaving the rest of the last batch
    received but not acked."""
    consumer = SimpleConsumer(
        _config(args), args["group"], {args["topic"]: FilterExpression("*")}, args.get("await_s", 1)
    )
    consumer.startup()
    acked, errors = 0, 0
    acked_ids: list[str] = []
    received: list[list[Any]] = []
    first = last = 0.0
    deadline = time.time() + args.get("timeout_s", 300)
    try:
        while acked < args["count"] and time.time() < deadline:
            try:
                batch = consumer.receive(32, args.get("invisible_s", 30))
            except Exception:
                errors += 1
                time.sleep(0.3)
                continue
            if not batch:
                if first and time.time() - last > args.get("idle_s", 3):
                    break
                continue
            first = first or time.time()
            for m in batch:
                received.append([m.message_id, m.delivery_attempt])
                if acked >= args["count"]:
                    continue
                try:
                    consumer.ack(m)
                    acked += 1
                    acked_ids.append(m.message_id)
                except Exception:
                    errors += 1
            last = time.time()
    finally:
        consumer.shutdown()
    out: dict[str, Any] = {"acked": acked, "errors": errors, "seconds": last - first}
    if args.get("ids"):
        out.update(acked_ids=acked_ids, received=received)
    return out


SCENARIOS = {
    "receive_many": receive_many,
    "consume_many": consume_many,
    "send_many": send_many,
    "send": send,
    "simple": simple,
    "receive_once": receive_once,
    "push": push,
    "transaction": transaction,
}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps(result))
