"""The ``mqstore`` PySpark data source against a real embedded suite on 127.0.0.1: batch reads
with offset bounds, a checkpointed stream stopped and restarted around new produces, and a
write that reads back."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, PythonException

from services.client import Admin, OutgoingMessage, Producer
from services.serve import Suite
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    suites = InProcessSuites()
    try:
        suite: Suite = suites.start(embedded_options(tmp_path_factory.mktemp("spark") / "data"))
        suites.wait_ready(suite)
        yield suite.address
    finally:
        suites.close()


def _produce(addr: str, topic: str, n: int, start: int = 0, queues: int | None = None) -> list[str]:
    """``n`` messages m<start>..; returns their bodies."""
    msgs = [
        OutgoingMessage(
            topic,
            f"m{i}".encode(),
            tags="even" if i % 2 == 0 else "odd",
            keys=[f"k{i}"],
            properties={"seq": str(i)},
            queue_id=i % queues if queues else -1,
        )
        for i in range(start, start + n)
    ]
    with Producer(addr) as producer:
        for i in range(0, n, 100):
            assert producer.send_batch(msgs[i : i + 100]).all_ok
    return [m.body.decode() for m in msgs]


def _read(spark: Any, addr: str, topic: str, **options: Any) -> Any:
    reader = spark.read.format("mqstore").option("endpoint", addr).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_returns_every_message_once_with_columns(spark: Any, gateway: str) -> None:
    with Admin(gateway) as admin:
        admin.create_topic("Clicks", 3)
    before = int(time.time() * 1000)
    bodies = _produce(gateway, "Clicks", 300)
    df = _read(spark, gateway, "Clicks")
    assert df.rdd.getNumPartitions() == 3  # one per queue
    rows = df.collect()
    assert sorted(r.body.decode() for r in rows) == sorted(bodies)
    assert len({r.msg_id for r in rows}) == 300
    assert {r.queue_id for r in rows} == {0, 1, 2}
    for qid in range(3):
        assert sorted(r.queue_offset for r in rows if r.queue_id == qid) == list(range(100))
    r = next(r for r in rows if r.body == b"m7")
    assert (r.topic, r.tags, r.keys, r.properties["seq"]) == ("Clicks", "odd", ["k7"], "7")
    assert r.commitlog_offset >= 0 and r.msg_id == r.properties["UNIQ_KEY"]
    assert isinstance(r.store_timestamp, dt.datetime)
    assert r.store_timestamp.timestamp() * 1000 >= before - 1000
    assert df.schema["queue_id"].dataType.simpleString() == "int"
    assert df.filter(df.tags == "even").count() == 150  # Spark SQL over the rows

    # Offset bounds per queue, smaller partitions, and a time bound.
    bounded = _read(
        spark,
        gateway,
        "Clicks",
        startingOffsets=json.dumps({"0": 10, "1": 90}),
        endingOffsets=json.dumps({"0": 20, "1": 100, "2": 5}),
        maxRecordsPerPartition=4,
    )
    assert bounded.rdd.getNumPartitions() == 3 + 3 + 2  # 10, 10 and 5 messages in 4s
    got = sorted((r.queue_id, r.queue_offset) for r in bounded.collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(90, 100)] + [
        (2, o) for o in range(5)
    ]
    later = int(time.time() * 1000) + 1
    time.sleep(0.01)
    _produce(gateway, "Clicks", 3, start=300)
    fresh = _read(spark, gateway, "Clicks", startingTimestamp=later).collect()
    assert sorted(r.body for r in fresh) == [b"m300", b"m301", b"m302"]


def test_stream_resumes_from_its_checkpoint_and_picks_up_new_queues(
    spark: Any, gateway: str, tmp_path: Path
) -> None:
    with Admin(gateway) as admin:
        admin.create_topic("Events", 2)
    _produce(gateway, "Events", 120)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def run() -> list[dict[str, Any]]:
        """One availableNow run of the query (as a restarted job would), returning its batches."""
        stream = (
            spark.readStream.format("mqstore")
            .option("endpoint", gateway)
            .option("topic", "Events")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", 50)
            .load()
            .selectExpr("queue_id", "queue_offset", "cast(body as string) as body")
        )
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return [p for p in query.recentProgress if p["numInputRows"]]

    first = run()
    assert [p["numInputRows"] for p in first] == [50, 50, 20]  # admission control
    assert run() == []  # restarted with nothing new: nothing read again
    _produce(gateway, "Events", 30, start=120)
    with Admin(gateway) as admin:  # the topic grows a queue; its messages are picked up too
        admin.create_topic("Events", 3)
    _produce(gateway, "Events", 6, start=150, queues=3)
    third = run()
    assert sum(p["numInputRows"] for p in third) == 36
    rows = spark.read.parquet(str(out)).collect()
    bodies = [r.body for r in rows]
    assert len(bodies) == len(set(bodies)) == 156  # each message exactly once across the runs
    assert {r.queue_id for r in rows} == {0, 1, 2}


def test_write_then_read_round_trips(spark: Any, gateway: str) -> None:
    with Admin(gateway) as admin:
        admin.create_topic("Exports", 2)
    data = [
        (f"row-{i}".encode(), [f"key-{i}"], "t" if i % 3 else "special", {"n": str(i)}, f"U-{i}")
        for i in range(50)
    ]
    df = spark.createDataFrame(
        data, "body binary, keys array<string>, tags string, properties map<string,string>, uniq_key string"
    ).repartition(3)
    df.write.format("mqstore").option("endpoint", gateway).option("topic", "Exports").mode("append").save()
    rows = _read(spark, gateway, "Exports").collect()
    assert sorted(r.body for r in rows) == sorted(d[0] for d in data)
    r = next(r for r in rows if r.body == b"row-3")
    assert (r.keys, r.tags, r.properties["n"], r.msg_id) == (["key-3"], "special", "3", "U-3")
    writer = df.write.format("mqstore").option("endpoint", gateway).option("topic", "Exports")
    with pytest.raises(AnalysisException, match="append-only"):  # topics are append-only
        writer.mode("overwrite").save()


def test_a_failed_write_task_is_reported(spark: Any, gateway: str) -> None:
    """Rows without a body fail their task; the error reaches the job with the reason."""
    df = spark.createDataFrame([("k1", "t"), ("k2", "t")], "keys string, tags string")
    writer = df.write.format("mqstore").option("endpoint", gateway).option("topic", "Exports2").mode("append")
    with pytest.raises(PythonException, match="needs a body column"):  # the task's error, via Spark
        writer.save()
