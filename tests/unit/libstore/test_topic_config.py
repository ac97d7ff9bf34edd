"""TopicConfigManager: validation, auto-create, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from libstore.errors import IllegalTopicError, InvalidArgumentError, TopicNotFoundError
from libstore.topic_config import TopicConfig, TopicConfigManager, TopicMessageType


def test_create_list_delete_and_reload(tmp_path: Path):
    path = tmp_path / "config" / "topics.json"
    mgr = TopicConfigManager(path)
    mgr.create_or_update(TopicConfig("Orders", 16, 16, message_type=TopicMessageType.FIFO))
    mgr.create_or_update(TopicConfig("Audit", 1, 1, perm=4))
    assert [t.topic_name for t in mgr.list()] == ["Audit", "Orders"]
    again = TopicConfigManager(path)
    orders = again.get("Orders")
    assert (
        orders is not None and orders.write_queue_nums == 16 and orders.message_type is TopicMessageType.FIFO
    )
    audit = again.get("Audit")
    assert audit is not None and audit.readable and not audit.writeable
    assert again.delete("Audit") and not again.delete("Audit")
    assert TopicConfigManager(path).get("Audit") is None


def test_validation(tmp_path: Path):
    mgr = TopicConfigManager(tmp_path / "t.json", max_queue_nums=64)
    with pytest.raises(IllegalTopicError):
        mgr.create_or_update(TopicConfig("bad name"))
    with pytest.raises(InvalidArgumentError):
        mgr.create_or_update(TopicConfig("T", 0, 0))
    with pytest.raises(InvalidArgumentError):
        mgr.create_or_update(TopicConfig("T", 65, 65))
    with pytest.raises(InvalidArgumentError):
        mgr.create_or_update(TopicConfig("T", perm=0x40))


def test_auto_create_uses_the_default_queue_count(tmp_path: Path):
    mgr = TopicConfigManager(tmp_path / "t.json", default_queue_nums=4)
    assert mgr.write_queue_nums("New") == 4
    assert TopicConfigManager(tmp_path / "t.json").get("New") is not None
    strict = TopicConfigManager(tmp_path / "s.json", auto_create=False)
    with pytest.raises(TopicNotFoundError):
        strict.write_queue_nums("New")
