"""Fixtures for service tests: an embedded suite in this process, a split cluster of processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.serve import ServeOptions, Suite
from tests.service.harness import SMALL_STORE, InProcessSuites, SplitCluster


@pytest.fixture
def suites() -> Iterator[InProcessSuites]:
    s = InProcessSuites()
    yield s
    s.close()


def embedded_options(root: Path, **store: object) -> ServeOptions:
    return ServeOptions(role="embedded", data_dir=root, listen="127.0.0.1:0", store={**SMALL_STORE, **store})


@pytest.fixture
def embedded(suites: InProcessSuites, tmp_path: Path) -> Suite:
    suite = suites.start(embedded_options(tmp_path / "data"))
    suites.wait_ready(suite)
    return suite


@pytest.fixture
def split(tmp_path: Path) -> Iterator[SplitCluster]:
    cluster = SplitCluster(tmp_path / "split")
    cluster.start_all()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def split_in_process(suites: InProcessSuites, tmp_path: Path) -> str:
    """The four roles as in-process suites wired to each other; the gateway's address."""
    addr: dict[str, str] = {}
    for role in ("commitlog", "dispatch", "index", "gateway"):  # each after what it reaches
        suite = suites.start(
            ServeOptions(
                role=role,
                data_dir=tmp_path / role,
                listen="127.0.0.1:0",
                store=SMALL_STORE,
                **addr,  # commitlog=, dispatch=, index= of the roles already serving
            )
        )
        suites.wait_ready(suite)
        addr[role] = suite.address
    return addr["gateway"]


@pytest.fixture
def commitlog_alone(suites: InProcessSuites, tmp_path: Path) -> Suite:
    """A commitlog service on its own (topics made on first append), serving."""
    suite = suites.start(
        ServeOptions(
            role="commitlog",
            data_dir=tmp_path / "commitlog",
            listen="127.0.0.1:0",
            store={**SMALL_STORE, "autoCreateTopicEnable": "true"},
        )
    )
    suites.wait_ready(suite)
    return suite
