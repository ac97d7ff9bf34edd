"""Transient messages in the CommitLog (libstore.durability): stubs in the log, whole records in
memory, one read path; what a restart, retention, a cut and a full store do to them."""

from __future__ import annotations

import time

import pytest

from libstore import (
    CommitLog,
    Message,
    MessageIllegalError,
    MessageSysFlag,
    OffsetOutOfRangeError,
    PutMessageStatus,
    TopicConfig,
)
from libstore.config import BrokerRole, FlushDiskType
from libstore.durability import HOLD_VIEW_MIN_BYTES, Durability, is_stub, is_transient_value
from libstore.errors import InvalidArgumentError, SystemBusyError
from libstore.record_codec import check_record, decode_record
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder
from libstore.topic_config import TopicConfigManager

STUB = MessageSysFlag.TRANSIENT_STUB_FLAG


def _transient(i: int, topic: str = "T", **props: str) -> Message:
    return Message(
        topic,
        b"secret body %d " % i * 20,
        i % 2,
        tags=f"tag{i % 3}",
        keys=[f"k{i}"],
        properties={"DURABILITY": "1", "colour": "blue", **props},
    )


def _persistent(i: int, topic: str = "T") -> Message:
    return Message(topic, b"kept body %d" % i, i % 2, tags="tag0", keys=[f"p{i}"])


def encode_records(messages: list[Message]) -> bytes:
    """The records form of Produce, as the Python client encodes it."""
    encoder = RecordEncoder(STORE_HOST_PLACEHOLDER, max_message_size=64 * 1024)
    return bytes(encoder.encode_batch(messages, 1).buf)


def _raw_log(cl: CommitLog, res) -> bytes:
    return cl.get_message(res.phy_offset, res.size)


def test_a_transient_message_leaves_only_a_stub_in_the_log_and_reads_whole(open_log):
    cl: CommitLog = open_log()
    sent = [_transient(0), _persistent(1), _transient(2, colour="red")]
    res = cl.put_messages(sent)
    assert [r.status for r in res] == [PutMessageStatus.PUT_OK] * 3
    assert [r.queue_offset for r in res] == [0, 0, 1]
    stub = _raw_log(cl, res[0])
    assert is_stub(stub) and b"secret" not in stub and b"blue" not in stub
    req = check_record(stub, 0, len(stub), check_crc=True, decode_properties=True)
    assert req.success and req.tags == "tag0" and req.keys == ("k0",) and req.sys_flag & STUB
    assert (req.topic, req.queue_id, req.consume_queue_offset) == ("T", 0, 0)
    assert not is_stub(_raw_log(cl, res[1]))
    got = cl.read_many([(r.phy_offset, r.size) for r in res])
    records = [decode_record(raw) for raw in got]  # CRC checked: whole records
    for rec, msg, r in zip(records, sent, res, strict=True):
        assert rec.body == msg.body and rec.properties.get("colour") == msg.properties.get("colour")
        assert (rec.phy_offset, rec.queue_offset, rec.store_timestamp) == (
            r.phy_offset,
            r.queue_offset,
            r.store_timestamp,
        )
        assert not rec.sys_flag & STUB
    assert cl.read_message(res[2].phy_offset).body == sent[2].body
    assert cl.read_many([(res[0].phy_offset, 0)])[0] == got[0]  # size 0: the stub's TOTALSIZE


def test_a_transient_topic_makes_every_message_transient_and_the_property_cannot_raise_it(store_config):
    topics = TopicConfigManager(store_config.root_dir / "config" / "topics.json")
    topics.create_or_update(TopicConfig("Tmp", 2, 2, durability=Durability.TRANSIENT))
    cl = CommitLog.open(store_config, topic_config=topics)
    try:
        res = cl.put_messages(
            [Message("Tmp", b"a" * 100, 0), Message("Tmp", b"b" * 100, 1, properties={"DURABILITY": "2"})]
        )
        assert all(is_stub(_raw_log(cl, r)) for r in res)
        assert [decode_record(raw).body for raw in cl.read_many([(r.phy_offset, r.size) for r in res])] == [
            b"a" * 100,
            b"b" * 100,
        ]
    finally:
        cl.shutdown()
    assert TopicConfigManager(topics.path).get("Tmp").durability is Durability.TRANSIENT  # persisted


def test_system_topics_cannot_be_transient(store_config):
    topics = TopicConfigManager(store_config.root_dir / "topics.json")
    with pytest.raises(InvalidArgumentError, match="always persistent"):
        topics.create_or_update(TopicConfig("rmq_sys_wheel_timer", 1, 1, durability=Durability.TRANSIENT))


@pytest.mark.parametrize("value", ["0", "3", "true", "transient", " 1"])
def test_a_durability_value_other_than_1_or_2_is_refused_and_nothing_is_written(open_log, value):
    cl: CommitLog = open_log()
    before = cl.max_offset
    with pytest.raises(MessageIllegalError, match="message 1: property DURABILITY must be 1"):
        cl.put_messages([_persistent(0), Message("T", b"x", 0, properties={"DURABILITY": value})])
    assert cl.max_offset == before
    assert not is_transient_value("2") and is_transient_value("1") and not is_transient_value(None)


def test_a_client_encoded_transient_record_is_adopted_as_a_stub(open_log):
    cl: CommitLog = open_log()
    raw = encode_records([_transient(7), _persistent(8)])
    batch = cl.adopt_records(raw)
    assert sorted(batch.transient) == [0] and batch.no_wait == [0]
    assert batch.requests[0].msg_size == batch.sizes[0] and batch.requests[0].sys_flag & STUB
    res = cl.append_batch(batch).results
    assert is_stub(_raw_log(cl, res[0])) and not is_stub(_raw_log(cl, res[1]))
    assert decode_record(cl.read_many([(res[0].phy_offset, res[0].size)])[0]).body == _transient(7).body
    assert res.unwaited == frozenset({0})


def test_a_producer_cannot_set_the_stub_flag_on_a_record(open_log):
    cl: CommitLog = open_log()
    msg = _persistent(0)
    msg.sys_flag = STUB
    res = cl.append_batch(cl.adopt_records(encode_records([msg]))).results
    assert not is_stub(_raw_log(cl, res[0]))
    assert decode_record(cl.read_many([(res[0].phy_offset, res[0].size)])[0]).body == msg.body


def test_after_a_restart_transient_messages_read_as_removed_and_persistent_ones_stay(store_config):
    cl = CommitLog.open(store_config)
    res = cl.put_messages([_transient(i) if i % 2 else _persistent(i) for i in range(6)])
    cl.shutdown()
    cl = CommitLog.open(store_config)
    try:
        got = cl.read_many([(r.phy_offset, r.size) for r in res])
        assert [g is None for g in got] == [False, True] * 3
        assert [decode_record(g).body for g in got if g] == [_persistent(i).body for i in (0, 2, 4)]
        with pytest.raises(OffsetOutOfRangeError, match="no longer held"):
            cl.read_message(res[1].phy_offset)
        # Queue offsets go on after the stubs: consumers continue at the next offset.
        more = cl.put_messages([_persistent(6)])
        assert more[0].queue_offset == 3
        assert not list((store_config.root_dir / "transient").glob("*.scratch"))
    finally:
        cl.shutdown()


def test_transient_messages_are_never_waited_for_under_sync_flush(open_log):
    cl: CommitLog = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    res = cl.put_messages([_transient(0), _persistent(1)])
    assert res.unwaited == frozenset({0}) and res.status is PutMessageStatus.PUT_OK
    only = cl.put_messages([_transient(2)])
    assert only.unwaited == frozenset({0})


def test_a_full_transient_store_refuses_the_whole_batch_with_system_busy(open_log):
    cl: CommitLog = open_log(transient_store_max_bytes=4096, transient_scratch_max_bytes=0)
    cl.put_messages([_transient(i) for i in range(3)])  # ~1.3 KiB of records
    end = cl.max_offset
    with pytest.raises(SystemBusyError, match="transient store is full"):
        cl.put_messages([_persistent(9), *[_transient(i) for i in range(3, 12)]])
    assert cl.max_offset == end  # nothing written, persistent message included
    assert cl.put_messages([_persistent(10)])[0].status is PutMessageStatus.PUT_OK


def test_past_the_high_water_mark_records_are_paged_out_and_still_read(open_log):
    cl: CommitLog = open_log(transient_store_max_bytes=8192, transient_scratch_max_bytes=1 << 20)
    res = [r for b in range(8) for r in cl.put_messages([_transient(i) for i in range(b * 5, b * 5 + 5)])]
    assert cl.transient.paged_out > 0
    assert cl.transient.memory_bytes <= 8192
    got = cl.read_many([(r.phy_offset, r.size) for r in res])
    assert [decode_record(g).body for g in got] == [_transient(i).body for i in range(40)]


def test_retention_releases_the_records_of_deleted_segments(open_log):
    cl: CommitLog = open_log()
    first = cl.put_messages([_transient(i) for i in range(50)])
    while cl.queue.get_last_mapped_file().file_from_offset == 0:
        cl.put_messages([_persistent(i) for i in range(50)])
    cl.put_messages([_persistent(0)])
    second = cl.queue.get_last_mapped_file().file_from_offset
    deadline = time.monotonic() + 10
    while cl.flushed_offset < second and time.monotonic() < deadline:  # never unflushed bytes
        time.sleep(0.02)
    held = len(cl.transient)
    deleted = cl.delete_expired_segments(time.time() + 3600, force=True, batch_max=1)
    assert deleted and len(cl.transient) == held - 50
    assert cl.read_many([(first[0].phy_offset, first[0].size)]) == [None]


def test_a_demoted_master_drops_its_transient_messages(open_log):
    cl: CommitLog = open_log()
    res = cl.put_messages([_transient(0)])
    cl.set_broker_role(BrokerRole.SLAVE)
    assert len(cl.transient) == 0 and cl.read_many([(res[0].phy_offset, res[0].size)]) == [None]


def test_a_slave_holds_only_stubs_and_a_promoted_one_reads_transient_messages_as_removed(open_log, tmp_path):
    master: CommitLog = open_log()
    slave: CommitLog = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    res = master.put_messages([_transient(0), _persistent(1), _transient(2)])
    data, _ = master.read_chunk(0, master.max_offset, 1 << 20)  # what the HA stream sends
    assert b"secret" not in data and b"blue" not in data  # never replicated
    slave.append_replica(0, data)
    slave.set_broker_role(BrokerRole.ASYNC_MASTER)  # a failover
    got = slave.read_many([(r.phy_offset, r.size) for r in res])
    assert got[0] is None and got[2] is None and decode_record(got[1]).body == _persistent(1).body
    assert slave.put_messages([_persistent(4)])[0].queue_offset == 2  # queue 0 goes on after the stubs


def test_the_spark_commitlog_source_skips_stubs_in_its_messages_view_and_keeps_them_for_dispatch(
    store_config,
):
    from services.spark.commitlog_source import _records, commitlog_files, walk

    cl = CommitLog.open(store_config)
    try:
        cl.put_messages([_transient(0), _persistent(1), _transient(2)])
    finally:
        cl.shutdown()
    (segment,) = commitlog_files(store_config.commit_log_dir)
    messages = [rec for _, rec, ok in _records(segment.path, segment.base_offset) if ok]
    assert [rec.body for rec in messages] == [_persistent(1).body]
    dispatch = [req for _, req, _ in walk(segment.path, segment.base_offset)]
    assert [bool(req.sys_flag & STUB) for req in dispatch] == [True, False, True]


def test_the_store_counts_every_byte_a_held_record_keeps_alive(open_log):
    """A batch of transient messages only, of HOLD_VIEW_MIN_BYTES or more, is held without a
    copy (a view of the batch's buffer, all of it counted); a smaller one, and a transient
    message among persistent ones, are copied (the latter so that the persistent records'
    bytes are not kept alive uncounted by the view)."""
    cl: CommitLog = open_log()
    only = cl.adopt_records(encode_records([_transient(i) for i in range(40)]))
    assert len(only.whole_buf) >= HOLD_VIEW_MIN_BYTES
    small = cl.adopt_records(encode_records([_transient(i) for i in range(40, 43)]))
    assert len(small.whole_buf) < HOLD_VIEW_MIN_BYTES
    appended = {}
    for name, batch in (("only", only), ("small", small)):
        held_before = cl.transient.memory_bytes
        appended[name] = cl.append_batch(batch).results
        assert cl.transient.memory_bytes - held_before == len(batch.whole_buf) == batch.transient_bytes
    mixed = cl.adopt_records(encode_records([_persistent(50), _transient(51), _persistent(52)]))
    held_before = cl.transient.memory_bytes
    cl.append_batch(mixed)
    assert cl.transient.memory_bytes - held_before == mixed.transient_bytes < len(mixed.whole_buf)
    with pytest.raises(BufferError):  # the view pins the large all-transient batch's buffer ...
        only.whole_buf.extend(b"x")
    small.whole_buf.extend(b"x")  # ... the small one's was copied ...
    mixed.whole_buf.extend(b"x")  # ... and the mixed batch's is not held at all
    res = appended["small"]
    small.whole_buf[:] = bytes(len(small.whole_buf))  # the copy the store holds is its own
    read = [cl.read_message(o).body for o in res.phy_offsets]
    assert read == [_transient(i).body for i in range(40, 43)]
