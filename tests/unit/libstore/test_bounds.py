"""The store's bounds on client-controlled input: config keys, topic count, group names, held
long polls, reads and client-encoded batches."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libstore import CommitLog, ConfigError, InvalidArgumentError, Message, MessageIllegalError, StoreConfig
from libstore.consumer_offset_manager import ConsumerOffsetManager
from libstore.errors import TooManyTopicsError, TopicNotFoundError
from libstore.group_name import validate_group
from libstore.long_polling import LongPollingService
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder
from libstore.system_topics import HALF_TOPIC
from libstore.topic_config import TopicConfig, TopicConfigManager


def test_bound_keys_load_from_rocketmq_names_and_environment() -> None:
    cfg = StoreConfig.from_sources(
        env={"MQSTORE_MAX_TOPIC_COUNT": "7", "MQSTORE_MAX_HELD_POLLS_PER_CLIENT": "3"},
        overrides={"maxMessagesPerRequest": "100", "telemetryOutboxMaxCommands": 9},
    )
    assert (cfg.max_topic_count, cfg.max_held_polls_per_client) == (7, 3)
    assert (cfg.max_messages_per_request, cfg.telemetry_outbox_max_commands) == (100, 9)
    defaults = StoreConfig()
    assert defaults.max_messages_per_request == 1024
    assert defaults.max_request_bytes == 32 * 1024 * 1024
    assert defaults.max_group_name_length == 255
    assert defaults.describe()["maxReadRangesPerCall"] == 1024


@pytest.mark.parametrize(
    "changes",
    [
        {"max_topic_count": 0},
        {"max_held_polls": 2, "max_held_polls_per_client": 3},
        {"max_read_ranges_per_call": 10},  # below maxPullBatchSize
        {"max_read_bytes_per_call": 1024},  # below the largest record
        {"max_request_bytes": 1024},  # below maxMessageSize
        {"offload_validation_bytes": -1},
    ],
)
def test_bound_keys_are_validated(changes: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        StoreConfig(**changes)  # type: ignore[arg-type]


def test_role_defaults_have_the_lowest_precedence(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("autoCreateTopicEnable=true\n")
    off = {"autoCreateTopicEnable": False}
    assert not StoreConfig.from_sources(defaults=off).auto_create_topic_enable
    assert StoreConfig.from_sources(defaults=off, conf_file=conf).auto_create_topic_enable
    assert StoreConfig.from_sources(
        defaults=off, env={"MQSTORE_AUTO_CREATE_TOPIC_ENABLE": "true"}
    ).auto_create_topic_enable


def test_topic_count_bounds_new_topics_only(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path / "topics.json", auto_create=True, max_topic_count=2)
    topics.create_or_update(TopicConfig("A"))
    assert topics.write_queue_nums("B") == 8  # auto-created
    with pytest.raises(TooManyTopicsError):
        topics.write_queue_nums("C")
    with pytest.raises(TooManyTopicsError):
        topics.create_or_update(TopicConfig("D"))
    topics.create_or_update(TopicConfig("A", 2, 2))  # an update is not a new topic
    assert topics.write_queue_nums(HALF_TOPIC) == 1  # the store's own topics do not count
    assert [t.topic_name for t in topics.list()] == sorted(["A", "B", HALF_TOPIC])


def test_dead_letter_topics_are_created_with_auto_create_off(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path / "topics.json", auto_create=False)
    with pytest.raises(TopicNotFoundError):
        topics.write_queue_nums("Orders")
    assert topics.write_queue_nums("%DLQ%billing") >= 1


@pytest.mark.parametrize("bad", ["", "g" * 256, "with space", "a@b", "é"])
def test_group_names_follow_rocketmq_rules(bad: str, tmp_path: Path) -> None:
    assert validate_group("g" * 255) == "g" * 255
    assert validate_group("%RETRY%a|b_c-1") == "%RETRY%a|b_c-1"
    with pytest.raises(InvalidArgumentError):
        validate_group(bad)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    with pytest.raises(InvalidArgumentError):
        offsets.commit_offset(bad, "Orders", 0, 1)
    with pytest.raises(InvalidArgumentError):
        offsets.commit_offset("readers", "t" * 1024 * 1024, 0, 1)
    assert offsets.groups() == []


def test_held_waits_are_bounded_and_the_rest_answer_at_once() -> None:
    polling = LongPollingService(lambda topic, queue_id: 0, max_waiters=1)

    async def scenario() -> tuple[bool, bool, int]:
        first = asyncio.create_task(polling.wait_for_messages_async("T", 0, 0, 30_000))
        while polling.waiting < 1:
            await asyncio.sleep(0.001)
        refused_queue = await polling.wait_for_messages_async("T", 1, 0, 30_000)  # not held
        refused_topic = await polling.wait_for_topic_async("T", 30_000)
        held_still = not first.done()
        polling.wake_all()
        await first
        return refused_queue, refused_topic, int(held_still)

    refused_queue, refused_topic, held_still = asyncio.run(scenario())
    assert (refused_queue, refused_topic, held_still) == (False, False, 1)
    assert polling.refused == 2
    assert polling.waiting == 0


def test_reads_are_bounded_by_bytes_and_record_size(open_log) -> None:  # type: ignore[no-untyped-def]
    log: CommitLog = open_log()
    results = log.put_messages([Message("Reads", bytes(1000), queue_id=0) for _ in range(3)])
    ranges = list(zip(results.phy_offsets, results.sizes, strict=True))
    assert all(r is not None for r in log.read_many(ranges, max_bytes=3 * ranges[0][1]))
    with pytest.raises(InvalidArgumentError):
        log.read_many(ranges, max_bytes=2 * ranges[0][1] + 1)
    # No range, and no record header, is believed past the largest record size.
    first = ranges[0]
    assert log.read_many([(first[0], 0)], max_record_size=first[1] - 1) == [None]
    assert log.read_many([first], max_record_size=first[1] - 1) == [None]
    assert log.read_many([(first[0], 0)], max_record_size=first[1])[0] is not None


def test_client_encoded_batches_are_bounded_by_record_count(open_log) -> None:  # type: ignore[no-untyped-def]
    log: CommitLog = open_log()
    encoder = RecordEncoder(STORE_HOST_PLACEHOLDER, max_message_size=1024)
    batch = encoder.encode_batch(
        [Message("Batch", b"x", queue_id=-1) for _ in range(5)], 1, unassigned_queue_ok=True
    )
    assert len(log.adopt_records(bytes(batch.buf), max_records=5).sizes) == 5
    with pytest.raises(MessageIllegalError, match="at most 4 records"):
        log.adopt_records(bytes(batch.buf), max_records=4)
