"""SparkSession for mqstore's data sources and jobs, and a progress display of running stages.

:func:`spark_session` starts (or joins) a session with both data sources registered:
``mqstore`` (services.spark.source) and ``mqstore-commitlog`` (services.spark.commitlog_source).
Local runs (``local[*]``, the default) need what the spec sheet pyspark-datasource §5 lists:
Java 17 on PATH or JAVA_HOME, ``SPARK_LOCAL_IP`` (set to 127.0.0.1 here unless given) and
``PYSPARK_PYTHON`` (this interpreter unless given: Spark's workers otherwise run whatever
``python3`` is first on PATH, which may lack pyarrow and mqstore). On a cluster (``--master``), the
executors need the same Python environment with mqstore installed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

QUIET_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
}


def spark_session(
    master: str = "local[*]", app_name: str = "mqstore", conf: Mapping[str, str] | None = None
) -> Any:
    """A SparkSession on ``master`` with the mqstore data sources registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**QUIET_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark: Any) -> None:
    from services.spark.commitlog_source import CommitLogDataSource
    from services.spark.source import MqstoreDataSource

    spark.dataSource.register(MqstoreDataSource)
    spark.dataSource.register(CommitLogDataSource)


@contextmanager
def stage_progress(spark: Any, description: str, enabled: bool = True) -> Iterator[None]:
    """Show the tasks done of the running Spark stages (rich, on stderr) while the block runs."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    tasks: dict[int, Any] = {}

    def poll() -> None:
        while not stop.wait(0.3):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is None:
                    continue
                if stage_id not in tasks:
                    tasks[stage_id] = progress.add_task(
                        f"{description}: stage {stage_id}", total=info.numTasks
                    )
                progress.update(tasks[stage_id], completed=info.numCompletedTasks, total=info.numTasks)
        for task in progress.tasks:  # stages that ended between two polls
            progress.update(task.id, completed=task.total)

    with progress:
        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
