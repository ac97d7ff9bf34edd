"""Spark over the store (issue "The data pipeline on Spark"): batch-read throughput of a topic
through the ``mqstore`` data source (gateway Pulls, records decoded in the Spark tasks) and of
its CommitLog files through the ``mqstore-commitlog`` reader, and the rebuild job's time.

An embedded suite (bench.service_bench.running_suite, ASYNC_FLUSH, one topic of 16 queues) is
filled with ``messages`` 1 KiB messages by the services benchmark's produce workers; Spark runs
``local[2]`` in this process's JVM. Each read is a full scan written to Spark's ``noop`` sink
(every row materialized as Arrow, nothing stored), timed end to end, planning included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bench import service_bench
from bench.service_bench import BODY, TOPIC, running_suite


@dataclass
class SparkRow:
    name: str
    rows: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.rows_per_s * BODY / 1e6


def run(root: Path, messages: int = 1_000_000) -> tuple[list[SparkRow], dict[str, str]]:
    """(rows, notes): data source read, CommitLog-file read, rebuild."""
    from libstore import StoreConfig
    from services.client import Admin
    from services.spark import jobs
    from services.spark.session import spark_session

    out: list[SparkRow] = []

    def timed(name: str, rows_of: object, t0: float) -> None:
        out.append(SparkRow(name, int(rows_of), time.perf_counter() - t0))  # type: ignore[call-overload]

    with running_suite(root, "embedded", "ASYNC_FLUSH") as address:
        half = messages // 2
        service_bench.produce(address, processes=2, per_process=half, batch=256, inflight=4)
        (commitlog,) = {p.parent for p in root.rglob("commitlog/*") if p.name.isdigit()}
        files = sorted(p for p in commitlog.iterdir() if p.name.isdigit())
        spark = spark_session("local[2]", "mqstore-bench", {"spark.sql.shuffle.partitions": "2"})
        try:
            spark.range(10).count()  # JVM warm-up outside the clocks
            topic = spark.read.format("mqstore").option("endpoint", address).option("topic", TOPIC)
            with Admin(address) as admin:  # measure reads, not dispatch and index catching up
                while True:
                    st = admin.store_stats()
                    if min(st.dispatch_offset, st.index_offset) >= st.confirm_offset:
                        break
                    time.sleep(0.5)
                n = sum(q.max_offset - q.min_offset for q in admin.queue_offsets(TOPIC))
            t0 = time.perf_counter()
            topic.load().write.format("noop").mode("overwrite").save()
            timed("data source `mqstore` (16 queues, via the gateway)", n, t0)
            t0 = time.perf_counter()
            files_df = spark.read.format("mqstore-commitlog").load(str(commitlog))
            files_df.write.format("noop").mode("overwrite").save()
            timed(f"CommitLog files `mqstore-commitlog` ({len(files)} files)", n, t0)
            t0 = time.perf_counter()
            report = jobs.rebuild(
                spark, commitlog, root / "rebuilt", StoreConfig(store_path_root_dir=str(root))
            )
            timed("rebuild job (ConsumeQueues + IndexFiles)", report.records, t0)
        finally:
            spark.stop()
    notes = {"messages": f"{n:,}", "commitlog_files": str(len(files))}
    return out, notes
