"""One SparkSession for the whole test run (starting one costs ~5 s and ~0.5 GiB), on local[2]
with the mqstore data sources registered (spec sheet pyspark-datasource §2 and §5)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable  # workers: this venv (pyarrow, mqstore)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
REPO = Path(__file__).resolve().parents[2]
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from services.spark.session import spark_session

    session = spark_session(
        "local[2]",
        "mqstore-tests",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        },
    )
    yield session
    session.stop()
