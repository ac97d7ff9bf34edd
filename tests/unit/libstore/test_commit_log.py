"""CommitLog: put/read, offsets per queue, file rolls, validation, flush policy, lifecycle."""

from __future__ import annotations

import itertools
import resource
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from libstore import (
    CommitLog,
    FlushDiskType,
    IllegalTopicError,
    Message,
    MessageIllegalError,
    MessageSysFlag,
    NotMasterError,
    PropertiesSizeExceededError,
    PutMessageStatus,
    QueueIdOutOfRangeError,
    ServiceNotAvailableError,
    StoreConfig,
    StoreLockedError,
    TopicConfig,
    TopicNotFoundError,
    durability_hooks,
)
from libstore.config import BrokerRole
from libstore.record_codec import BLANK_MAGIC_CODE, check_record, decode_record
from tests.conftest import SEGMENT


def _msgs(n: int, topic: str = "TopicA", queues: int = 4, size: int = 1000, start: int = 0) -> list[Message]:
    return [
        Message(topic, bytes([i % 251]) * size, i % queues, keys=f"k{i}", tags="t")
        for i in range(start, start + n)
    ]


def test_put_assigns_contiguous_physical_and_per_queue_offsets(open_log):
    cl: CommitLog = open_log()
    res = cl.put_messages(_msgs(10))
    assert all(r.status is PutMessageStatus.PUT_OK for r in res)
    assert res[0].phy_offset == 0
    for a, b in itertools.pairwise(res):
        assert b.phy_offset == a.phy_offset + a.size
    assert [r.queue_offset for r in res] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    more = cl.put_messages(_msgs(4, start=10))
    assert [r.queue_offset for r in more] == [2, 2, 3, 3]
    assert cl.queue_offset_of("TopicA", 0) == 4 and cl.max_offset == more[-1].next_offset


def test_read_message_returns_what_was_put(open_log):
    cl = open_log()
    msg = Message("TopicA", b"body-bytes", 2, tags="TagA", keys=["a", "b"], properties={"p": "v"}, flag=9)
    (r,) = cl.put_messages([msg])
    rec = cl.read_message(r.phy_offset, r.size)
    assert (rec.topic, rec.body, rec.queue_id, rec.flag, rec.tags, rec.keys) == (
        "TopicA",
        b"body-bytes",
        2,
        9,
        "TagA",
        ["a", "b"],
    )
    assert rec.properties["p"] == "v" and rec.msg_id == r.msg_id and rec.store_timestamp == r.store_timestamp
    assert cl.read_message(r.phy_offset).body == b"body-bytes"  # size read from the record
    assert cl.get_message(r.phy_offset, r.size)[:4] == r.size.to_bytes(4, "big")


def test_batch_crossing_a_segment_ends_the_segment_with_a_blank(open_log):
    cl = open_log()
    res = cl.put_messages(_msgs(300, size=1000))  # ~330 KB > one 256 KiB segment
    assert all(r.ok for r in res)
    first_in_second = next(r for r in res if r.phy_offset >= SEGMENT)
    assert first_in_second.phy_offset == SEGMENT
    last_in_first = max((r for r in res if r.phy_offset < SEGMENT), key=lambda r: r.phy_offset)
    blank_at = last_in_first.next_offset
    mf = cl.queue.mapped_files[0]
    req = check_record(mf.buffer, blank_at, SEGMENT)
    assert req.is_blank
    assert int.from_bytes(mf.buffer[blank_at : blank_at + 4], "big") == SEGMENT - blank_at
    assert int.from_bytes(mf.buffer[blank_at + 4 : blank_at + 8], "big", signed=True) == BLANK_MAGIC_CODE
    assert [r.queue_offset for r in res if r.phy_offset >= 0][:8] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(list(cl.iter_records(0))) == 300


@pytest.mark.parametrize(
    "bad, error",
    [
        (Message("", b"x", 0), IllegalTopicError),
        (Message("a" * 128, b"x", 0), IllegalTopicError),
        (Message("bad topic", b"x", 0), IllegalTopicError),
        (Message("TopicA", b"x" * (64 * 1024 + 1), 0), MessageIllegalError),
        (Message("TopicA", b"x", 0, properties={"k": "v" * 33000}), PropertiesSizeExceededError),
        (Message("TopicA", b"x", 8), QueueIdOutOfRangeError),
        (Message("TopicA", b"x", -1), QueueIdOutOfRangeError),
    ],
)
def test_bad_input_raises_and_writes_nothing(open_log, bad, error):
    cl = open_log()
    cl.put_messages(_msgs(3))
    before = (cl.max_offset, cl.queue_offset_table())
    with pytest.raises(error):
        cl.put_messages([*_msgs(2, start=3), bad])
    assert (cl.max_offset, cl.queue_offset_table()) == before
    assert len(list(cl.iter_records(0))) == 3


def test_unknown_topic_without_auto_create(open_log):
    cl = open_log(auto_create_topic_enable=False)
    with pytest.raises(TopicNotFoundError):
        cl.put_messages([Message("Nope", b"x", 0)])
    cl.topic_config.create_or_update(TopicConfig("Yes", 2, 2))
    assert cl.put_messages([Message("Yes", b"x", 1)])[0].ok
    with pytest.raises(QueueIdOutOfRangeError):
        cl.put_messages([Message("Yes", b"x", 2)])


def test_auto_created_topic_is_persisted(store_config):
    cl = CommitLog.open(store_config.replace(default_topic_queue_nums=16))
    cl.put_messages([Message("Auto", b"x", 15)])
    cl.shutdown()
    cl = CommitLog.open(store_config)
    try:
        cfg = cl.topic_config.get("Auto")
        assert cfg is not None and cfg.write_queue_nums == 16
    finally:
        cl.shutdown()


def test_transaction_prepared_records_take_queue_offset_zero(open_log):
    cl = open_log()
    res = cl.put_messages(
        [
            Message("TopicA", b"a", 0),
            Message("TopicA", b"half", 0, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE),
            Message("TopicA", b"b", 0),
        ]
    )
    assert [r.queue_offset for r in res] == [0, 0, 1]
    assert cl.queue_offset_of("TopicA", 0) == 2


def test_sync_flush_acknowledges_only_flushed_bytes(open_log):
    cl = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    res = cl.put_messages(_msgs(20))
    assert all(r.ok for r in res)
    assert cl.flushed_offset >= res[-1].next_offset
    assert cl.confirm_offset == cl.flushed_offset


def test_wait_false_does_not_block_on_the_flush(open_log):
    cl = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=1)
    res = cl.put_messages([Message("TopicA", b"x", 0, properties={"WAIT": "false"})])
    assert res[0].ok


class _HeldSyncs:
    """A durability observer that holds every fdatasync of a CommitLog segment until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def syncing(self, path: Path, start: int = 0, end: int = -1) -> object:
        if path.parent.name == "commitlog":
            self.release.wait(30)
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None


def test_each_message_of_a_batch_waits_by_its_own_wait_property(open_log, monkeypatch):
    """SYNC_FLUSH with the disk held: in one batch the messages that say WAIT=false are PUT_OK
    while those that wait time out, and the group commit is asked for no more than the end
    of the last message that waits."""
    cl = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=300)
    targets: list[int] = []
    submit = cl.submit_flush_request

    def recorded(next_offset: int, wait_store: bool = True) -> object:
        if wait_store:
            targets.append(next_offset)
        return submit(next_offset, wait_store)

    monkeypatch.setattr(cl, "submit_flush_request", recorded)
    held = _HeldSyncs()
    durability_hooks.install(held)  # type: ignore[arg-type]
    try:
        no = {"WAIT": "false"}
        batch = [
            Message("TopicA", b"a", 0, properties=no),
            Message("TopicA", b"b", 0),
            Message("TopicA", b"c", 0, properties=no),
        ]
        res = cl.put_messages(batch)
        assert [r.status for r in res] == [
            PutMessageStatus.PUT_OK,
            PutMessageStatus.FLUSH_DISK_TIMEOUT,
            PutMessageStatus.PUT_OK,
        ]
        assert all(r.phy_offset >= 0 for r in res) and not res.all_ok
        assert targets == [res[1].next_offset] and res[1].next_offset < res[2].next_offset
        started = time.monotonic()
        free = cl.put_messages([Message("TopicA", b"d", 0, properties={"WAIT": "FALSE"})] * 2)
        assert free.all_ok and time.monotonic() - started < 0.3  # nothing waited for the held disk
        assert targets == [res[1].next_offset]
    finally:
        held.release.set()
        durability_hooks.install(None)
    assert cl.put_messages(batch).all_ok


def test_slave_refuses_puts_and_shutdown_refuses_everything(open_log):
    slave = open_log(broker_role=BrokerRole.SLAVE)
    with pytest.raises(NotMasterError):
        slave.put_messages(_msgs(1))
    slave.shutdown()
    with pytest.raises(ServiceNotAvailableError):
        slave.put_messages(_msgs(1))


def test_one_process_per_store_folder(store_config: StoreConfig, open_log):
    open_log()
    with pytest.raises(StoreLockedError):
        CommitLog.open(store_config)


def test_empty_batch_is_a_no_op(open_log):
    cl = open_log()
    assert cl.put_messages([]) == []
    assert cl.max_offset == 0


def test_clean_shutdown_removes_abort_file_and_reopen_continues(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    abort = cl.root / "abort"
    assert abort.exists()
    first = cl.put_messages(_msgs(8))
    cl.shutdown()
    assert not abort.exists()
    cl = CommitLog.open(store_config)
    try:
        assert cl.last_exit_ok and cl.max_offset == first[-1].next_offset
        nxt = cl.put_messages(_msgs(4, start=8))
        assert nxt[0].phy_offset == first[-1].next_offset
        assert [r.queue_offset for r in nxt] == [2, 2, 2, 2]
    finally:
        cl.shutdown()


def test_a_second_start_starts_nothing_and_shutdown_leaves_no_service_running(store_config: StoreConfig):
    """open() starts the services; a start() after it must not start a second set that
    shutdown() cannot see (its snapshot thread wrote the checkpoint after it was closed)."""
    before = {t.ident for t in threading.enumerate()}
    cl = CommitLog.open(store_config)
    started = {t.ident for t in threading.enumerate()} - before
    cl.start()
    assert {t.ident for t in threading.enumerate()} - before == started
    cl.shutdown()
    alive = [t.name for t in threading.enumerate() if t.ident in started and t.is_alive()]
    assert started and alive == []


def test_iter_records_yields_dispatch_fields(open_log):
    cl = open_log()
    res = cl.put_messages(_msgs(5))
    reqs = list(cl.iter_records(res[1].phy_offset))
    assert [r.commit_log_offset for r in reqs] == [r.phy_offset for r in res[1:]]
    assert reqs[0].keys == ("k1",) and reqs[0].tags_code == 116  # "t".hashCode()
    assert list(cl.iter_records(res[1].phy_offset, res[3].phy_offset)) != []
    assert len(list(cl.iter_records(res[1].phy_offset, res[3].phy_offset))) == 2


def test_read_ahead_off_applies_to_every_segment(open_log, monkeypatch):
    """dataReadAheadEnable=false: madvise(MADV_RANDOM) on the segments found at load and on each
    one created afterwards."""
    from libstore.mapped_file import MappedFile

    advised: list[str] = []
    real = MappedFile.advise_random
    monkeypatch.setattr(MappedFile, "advise_random", lambda mf: (advised.append(mf.file_name), real(mf)))
    cl = open_log(data_read_ahead_enable=False)
    for _ in range(12):
        cl.put_messages(_msgs(100))
    names = [mf.file_name for mf in cl.queue.mapped_files]
    assert len(names) >= 4 and sorted(set(advised)) == names


def test_transient_store_pool_commits_before_readers_see_data(open_log):
    cl = open_log(
        transient_store_pool_enable=True, transient_store_pool_size=2, commit_interval_commit_log=10
    )
    msgs = _msgs(50)
    res = cl.put_messages(msgs)
    assert all(r.ok for r in res)
    assert cl.wait_for_confirm(res[-1].next_offset, timeout_s=10), "commit service never committed"
    assert cl.read_message(res[-1].phy_offset).body == msgs[-1].body


def test_a_thread_waiting_for_the_confirm_offset_is_notified_by_the_append(open_log):
    """wait_for_confirm is woken by the append that moves the offset (a notify), not by its
    0.5 s re-check: an append with nobody waiting skips the condition, one with a waiter not."""
    cl = open_log()
    target = cl.put_messages(_msgs(1))[-1].next_offset + 1  # past the next message's first byte
    woken: list[bool] = []
    cond = cl._confirm_cond
    real_wait = cond.wait

    def wait(timeout: float | None = None) -> bool:
        notified = real_wait(timeout)
        woken.append(notified)
        return notified

    cond.wait = wait  # type: ignore[method-assign]
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(cl.wait_for_confirm(target, timeout_s=30)))
    waiter.start()
    deadline = time.monotonic() + 30
    while not cl._confirm_waiters and time.monotonic() < deadline:
        time.sleep(0.001)
    assert cl._confirm_waiters == 1
    cl.put_messages(_msgs(1))
    waiter.join(30)
    assert result == [True]
    assert woken and woken[-1] is True, f"the waiter's last wake-up was a timeout: {woken}"
    assert cl._confirm_waiters == 0


class FileSizeLimit:
    """Lowers RLIMIT_FSIZE (a real OS limit: writes and fallocate past it fail with EFBIG) and
    puts back the (soft, hard) limits found at the start."""

    def __init__(self) -> None:
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def lower(self, max_bytes: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, self.hard))

    def restore(self) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.soft, self.hard))


@pytest.fixture
def file_size_limit():
    """A FileSizeLimit, restored afterwards. SIGXFSZ is ignored so the failure surfaces as an
    OSError."""
    limit = FileSizeLimit()
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    yield limit
    limit.restore()
    signal.signal(signal.SIGXFSZ, previous)


def test_disk_full_on_roll_fails_the_rest_of_the_batch_and_keeps_the_log_consistent(
    store_config: StoreConfig, file_size_limit: FileSizeLimit
):
    config = store_config.replace(default_topic_queue_nums=4)
    cl = CommitLog.open(config)
    first = cl.put_messages(_msgs(10))
    assert all(r.ok for r in first)
    # From now on no new segment can be allocated (each needs SEGMENT bytes); the current one
    # (and the one pre-allocated after it) still take appends: records end at least 8 bytes
    # (the END blank) before a segment's last byte, so their writes stay under the limit.
    file_size_limit.lower(SEGMENT - 1)
    results = []
    for start in range(10, 10 + 3 * SEGMENT // 1000, 50):
        results.extend(cl.put_messages(_msgs(50, start=start)))
    statuses = [r.status for r in results]
    failed_at = statuses.index(PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
    assert set(statuses[:failed_at]) == {PutMessageStatus.PUT_OK}
    assert set(statuses[failed_at:]) == {PutMessageStatus.CREATE_MAPPED_FILE_FAILED}
    assert all(r.phy_offset == -1 and not r.status.appended for r in results[failed_at:])
    acked = [*first, *results[:failed_at]]
    end = acked[-1].next_offset
    # The segment that could not be followed was closed with its blank END record.
    rolled = cl.queue.roll_next_file(end)
    assert cl.max_offset == rolled and cl.writeable
    # Space comes back: the store goes on in a new segment, queue offsets without a gap.
    file_size_limit.restore()
    (nxt,) = cl.put_messages(_msgs(1, start=10 + failed_at))
    assert nxt.ok and nxt.phy_offset == rolled
    assert nxt.queue_offset == (10 + failed_at) // 4
    cl.shutdown()
    cl = CommitLog.open(config)
    try:
        records = list(cl.iter_records(0, check_crc=True))
        assert [r.commit_log_offset for r in records] == [r.phy_offset for r in [*acked, nxt]]
    finally:
        cl.shutdown()


def test_read_many_reads_ranges_across_segments_and_marks_what_is_gone(open_log):
    cl = open_log()
    res = cl.put_messages(_msgs(600, size=1000))  # ~600 KB: three 256 KiB segments
    assert len(cl.queue.mapped_files) >= 3
    picks = [0, 250, 251, 599, 300]
    raws = cl.read_many([(res[i].phy_offset, res[i].size) for i in picks])
    assert [decode_record(r).keys for r in raws] == [[f"k{i}"] for i in picks]
    whole = cl.read_many([(res[7].phy_offset, 0)])  # size 0: the record that starts there
    assert decode_record(whole[0]).keys == ["k7"]
    end = res[599].next_offset
    assert cl.read_many([(end, 100), (10**12, 50), (res[1].phy_offset, 10**6)]) == [None, None, None]


def _client_batch(topic: str, n: int = 1, queue_id: int = -1) -> bytes:
    """Records as the Python client encodes them (QUEUEID -1: the store places them)."""
    from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder

    client = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096, 255)
    msgs = [Message(topic, b"x" * 10, queue_id, properties={"UNIQ_KEY": f"{topic}{i}"}) for i in range(n)]
    return bytes(client.encode_batch(msgs, 0, unassigned_queue_ok=True).buf)


def test_adopted_records_of_a_known_topic_skip_the_per_record_python_path(open_log, monkeypatch):
    """A topic met once is remembered with its queue count, so even a batch of one record of
    it is validated by the C run alone; a change to the topic table is seen by the next batch."""
    from libstore.record_codec import _ext
    from libstore.record_encoder import RecordEncoder

    assert _ext is not None, "make install builds libstore._codec"
    cl: CommitLog = open_log()
    cl.topic_config.create_or_update(TopicConfig("Known", 4, 4))
    slow: list[int] = []
    real = RecordEncoder._adopt_one

    def counting(self, *args, **kw):
        slow.append(args[3])
        return real(self, *args, **kw)

    monkeypatch.setattr(RecordEncoder, "_adopt_one", counting)
    first = cl.adopt_records(_client_batch("Known"))
    assert slow == [0]  # the first record of a new topic meets it in Python
    for _ in range(3):
        batch = cl.adopt_records(_client_batch("Known"))
        cl.append_batch(batch)
    assert slow == [0] and len(first.sizes) == 1
    # Fewer queues now: queue 3 is gone, and the table's change drops what was remembered.
    cl.topic_config.create_or_update(TopicConfig("Known", 2, 2))
    with pytest.raises(QueueIdOutOfRangeError, match="has 2 queues"):
        cl.adopt_records(_client_batch("Known", queue_id=3))
    placed = cl.adopt_records(_client_batch("Known", n=4))
    assert {key[1] for key in placed.queue_keys if key} <= {0, 1}
    # A topic producers may not use is refused however warm the cache is.
    with pytest.raises(MessageIllegalError):
        cl.adopt_records(_client_batch("RMQ_SYS_TRANS_HALF_TOPIC"))


def test_messages_of_a_known_topic_skip_the_per_message_python_encoder(open_log, monkeypatch):
    """append_messages remembers a topic met once, so a put of one message of it (a RocketMQ 5
    send, a pop-journal record) is encoded by the C run alone; a change to the topic table is
    seen by the next put."""
    from libstore.record_codec import _ext
    from libstore.record_encoder import RecordEncoder

    assert _ext is not None, "make install builds libstore._codec"
    cl: CommitLog = open_log()
    cl.topic_config.create_or_update(TopicConfig("Known", 4, 4))
    slow: list[str] = []
    real = RecordEncoder._encode_one

    def counting(self, out, m, *args, **kw):
        slow.append(m.topic)
        return real(self, out, m, *args, **kw)

    monkeypatch.setattr(RecordEncoder, "_encode_one", counting)
    first = cl.append_messages([Message("Known", b"x", 3, keys="k0")])
    assert slow == ["Known"]  # the first message of a new topic meets it in Python
    for i in range(3):
        cl.append_messages([Message("Known", b"x", -1, keys=f"k{i + 1}")], place_unassigned=True)
    assert slow == ["Known"] and first.results.appended == 1
    res = first.results[0]
    record = cl.read_message(res.phy_offset, res.size)
    assert (record.topic, record.queue_id, record.keys) == ("Known", 3, ["k0"])
    # Fewer queues now: queue 3 is gone, and the table's change drops what was remembered.
    cl.topic_config.create_or_update(TopicConfig("Known", 2, 2))
    with pytest.raises(QueueIdOutOfRangeError, match="has 2 queues"):
        cl.append_messages([Message("Known", b"x", 3)])
    placed = cl.append_messages([Message("Known", b"x", -1) for _ in range(4)], place_unassigned=True)
    assert {cl.read_message(r.phy_offset, r.size).queue_id for r in placed.results} == {0, 1}
