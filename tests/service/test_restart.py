"""What a restart keeps on the commitlog service: a producer's retry that straddles a clean
restart is still answered with the first result (the de-duplication window is saved at
shutdown and loaded at start, services.commitlog.dedup_window)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.client import Admin, OutgoingMessage, Producer
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites


def test_a_retry_across_a_clean_restart_is_answered_with_the_first_result(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    suites = InProcessSuites()
    try:
        options = embedded_options(tmp_path / "data")
        suite = suites.start(options)
        suites.wait_ready(suite)
        with Admin(suite.address) as admin:
            admin.create_topic("Orders", 1)
        message = OutgoingMessage(
            "Orders", b"pay 10", properties={"UNIQ_KEY": "7F00000100002A9F0000000000000001"}
        )
        with Producer(suite.address) as producer:
            (first,) = producer.send_batch([message])
        suites.stop(suite)
        with caplog.at_level(logging.INFO, logger="services.embedded"):
            suite = suites.start(options)
        suites.wait_ready(suite)
        assert any("unique keys saved" in r.getMessage() for r in caplog.records)  # no scan
        with Producer(suite.address) as producer:
            (again,) = producer.send_batch([message])  # the reply was lost: the client retries
        assert (again.phy_offset, again.queue_offset) == (first.phy_offset, first.queue_offset)
        assert suite.commit_log is not None and suite.commit_log.max_offset == first.phy_offset + first.size
    finally:
        suites.close()
