"""A batch that only partly fits before the disk fills (services.commitlog.local): the records
appended are acknowledged with their offsets, the rest refused with CREATE_MAPPED_FILE_FAILED."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from libstore import CommitLog, DiskFullError, PutMessageStatus
from libstore.mapped_file import MappedFile
from services.client import OutgoingMessage, Producer
from services.commitlog.dedup_window import DedupWindow
from services.commitlog.local import LocalCommitLog
from tests.conftest import SEGMENT


def test_a_batch_cut_short_by_a_full_disk_answers_the_appended_part(
    open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(default_topic_queue_nums=1)
    queue = log.queue
    assert queue is not None
    body = b"x" * 1000
    records = Producer("127.0.0.1:1")._request([OutgoingMessage("T", body) for _ in range(400)]).records
    real_create = queue._create

    def full_after_the_first(offset: int) -> MappedFile | None:
        if offset >= SEGMENT:
            raise DiskFullError("no space left for the next segment")
        return real_create(offset)

    monkeypatch.setattr(queue, "_create", full_after_the_first)
    port = LocalCommitLog(log, DedupWindow())
    results = asyncio.run(port.append_records(records))
    assert 0 < results.appended < 400 and len(results) == 400
    assert results.status is PutMessageStatus.PUT_OK
    assert results.failed_status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert results[results.appended].status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    for i in (0, results.appended - 1):
        assert log.read_message(results.phy_offsets[i]).body == body
    assert results.queue_offsets[: results.appended] == list(range(results.appended))
