"""Encoding CommitLog records (the layout: libstore.record_codec, spec sheet §1).

Split like RocketMQ 5's ``MessageExtEncoder``: :class:`RecordEncoder` validates and encodes a
whole batch outside the put lock (:meth:`RecordEncoder.encode_batch` from messages,
:meth:`RecordEncoder.adopt_records` from records a client encoded itself), leaving QUEUEOFFSET,
PHYSICALOFFSET and STORETIMESTAMP for :meth:`EncodedBatch.patch` or :func:`assign_offsets` under
the lock. The hot loops run in C when libstore._codec is built (``record_codec.native()``);
the Python code is their reference. Thread-safety: the encoder keeps small caches and may be
shared; :func:`assign_offsets` is a pure function of its arguments.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from libstore import record_codec
from libstore.dispatch_request import DispatchRequest
from libstore.errors import InvalidArgumentError, MessageIllegalError, QueueIdOutOfRangeError
from libstore.message import MessageConst, MessageFields, MessageSysFlag, waits_for_store
from libstore.message_id import encode_host
from libstore.record_codec import (
    _DURABILITY_ENTRY,
    _HEADERS,
    _HOST_V6_FLAGS,
    _INT,
    _SHORT,
    _STORE_TS_POSITION,
    _WAIT_ENTRY,
    BORN_HOST_POSITION,
    BORN_TIMESTAMP_POSITION,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    QUEUE_ID_POSITION,
    QUEUE_OFFSET_AND_PHY_OFFSET,
    QUEUE_OFFSET_POSITION,
    STORE_TIMESTAMP,
    SYS_FLAG_POSITION,
    _check_record,
    _properties_problem,
    _store_ts_position,
    body_crc32,
    bytes_to_properties,
    properties_to_bytes,
    record_size_of,
    validate_topic,
)


class EncodedBatch:
    """A validated, encoded batch waiting for its offsets.

    ``buf`` holds the records back to back; record *i* starts at ``positions[i]`` and is
    ``sizes[i]`` bytes (``positions`` has one more entry: the total length). ``queue_keys[i]`` is
    ``(topic, queue_id)`` or None for records that take no queue offset (tx PREPARED/ROLLBACK).
    ``store_ts_positions[i]`` is where STORETIMESTAMP sits inside record *i*. ``no_wait`` lists,
    in ascending order, the records whose message does not wait for the store (its WAIT
    property reads false, libstore.message.waits_for_store, and transient messages).
    ``transient`` maps the index of each transient message (libstore.durability) to where its
    whole record starts in ``whole_buf`` (the records as encoded; ``transient_bytes`` in all);
    ``buf`` holds its stub. ``durability_marked`` lists the records whose properties
    carry a DURABILITY entry (any value): the only ones libstore.durability reads.
    """

    __slots__ = (
        "buf",
        "durability_marked",
        "no_wait",
        "positions",
        "queue_keys",
        "requests",
        "scheduled",
        "sizes",
        "store_ts_positions",
        "topics",
        "transient",
        "transient_bytes",
        "uniq_keys",
        "whole_buf",
    )

    def __init__(self) -> None:
        self.buf = bytearray()
        self.positions: list[int] = [0]
        self.sizes: list[int] = []
        self.queue_keys: list[tuple[str, int] | None] = []
        self.store_ts_positions: list[int] = []
        self.no_wait: list[int] = []
        self.transient: dict[int, int] = {}
        self.whole_buf = bytearray()
        self.transient_bytes = 0
        self.durability_marked: list[int] = []
        # Filled for adopted (client-encoded) records: each record's topic, UNIQ_KEY and the
        # request its validation decoded (dispatch can use it instead of decoding the log again).
        self.topics: list[str] = []
        self.uniq_keys: list[str | None] = []
        self.requests: list[DispatchRequest] = []
        self.scheduled = False  # an adopted record carries a delay or timer property

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return len(self.buf)

    @property
    def wait_store(self) -> bool:
        """Whether any record's message waits for the store (False for an empty batch)."""
        return len(self.no_wait) < len(self.sizes)

    def subset(self, keep: Sequence[int]) -> EncodedBatch:
        """A batch of records ``keep`` (indexes, in order) of this one (copies their bytes)."""
        out = EncodedBatch()
        parts = []
        pos = 0
        skip = set(self.no_wait)
        marked = set(self.durability_marked)
        for k, i in enumerate(keep):
            if i in skip:
                out.no_wait.append(k)
            if i in self.transient:
                out.transient[k] = self.transient[i]
                out.transient_bytes += record_size_of(self.whole_buf, self.transient[i])
            if i in marked:
                out.durability_marked.append(k)
            start, size = self.positions[i], self.sizes[i]
            parts.append(self.buf[start : start + size])
            out.sizes.append(size)
            pos += size
            out.positions.append(pos)
            out.queue_keys.append(self.queue_keys[i])
            out.store_ts_positions.append(self.store_ts_positions[i])
            if self.topics:
                out.topics.append(self.topics[i])
                out.uniq_keys.append(self.uniq_keys[i])
                out.requests.append(self.requests[i])
        out.buf = bytearray().join(parts)
        if out.transient:
            out.whole_buf = self.whole_buf
        return out

    def patch(self, index: int, queue_offset: int, phy_offset: int, store_timestamp: int) -> None:
        """Fill QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of record ``index``."""
        pos = self.positions[index]
        QUEUE_OFFSET_AND_PHY_OFFSET.pack_into(self.buf, pos + QUEUE_OFFSET_POSITION, queue_offset, phy_offset)
        STORE_TIMESTAMP.pack_into(self.buf, pos + self.store_ts_positions[index], store_timestamp)


_BODY_TYPES = (bytes, bytearray, memoryview)
# A caller's known_topics of encode_batch is cleared past this many topics (a store with more
# looks some of them up again, nothing worse).
_KNOWN_TOPICS_MAX = 10_000


class RecordEncoder:
    """Validates messages and encodes them into RocketMQ records (offsets left for the put lock).

    ``store_host`` is the encoded store address (8 or 20 bytes, see message_id.encode_host);
    ``max_message_size`` the largest body in bytes; ``max_topic_length`` in bytes.

    The encode loop is the producer hot path (DESIGN: no per-message work that a per-batch or
    cached step can do): topic bytes and born-host encodings are cached, and each message costs
    one header ``struct.pack``, one CRC and a handful of comparisons.
    """

    def __init__(self, store_host: bytes, max_message_size: int, max_topic_length: int = 127) -> None:
        if len(store_host) not in (8, 20):
            raise ValueError("store_host must be 8 or 20 encoded bytes")
        self.store_host = store_host
        self.max_message_size = max_message_size
        self.max_topic_length = max_topic_length
        self._store_v6 = MessageSysFlag.STOREHOSTADDRESS_V6_FLAG if len(store_host) == 20 else 0
        # topic -> (TOPICLEN + TOPIC bytes, magic code)
        self._topics: dict[str, tuple[bytes, int]] = {}
        # born host -> (encoded host, BORNHOST_V6 bit, header struct)
        self._hosts: dict[tuple[str, int] | str, tuple[bytes, int, struct.Struct]] = {}

    def _topic_prefix(self, topic: str) -> tuple[bytes, int]:
        """(TOPICLEN + TOPIC bytes, magic code) of a validated topic; raises IllegalTopicError."""
        cached = self._topics.get(topic)
        if cached is None:
            raw = validate_topic(topic, self.max_topic_length)
            if len(raw) <= 127:
                cached = (bytes((len(raw),)) + raw, MESSAGE_MAGIC_CODE)
            else:
                cached = (_SHORT.pack(len(raw)) + raw, MESSAGE_MAGIC_CODE_V2)
            if len(self._topics) > 100_000:
                self._topics.clear()
            self._topics[topic] = cached
        return cached

    def _born_host(self, host: tuple[str, int] | str) -> tuple[bytes, int, struct.Struct]:
        """(encoded born host, BORNHOST_V6 bit, header struct) of ``(ip, port)`` or ``"ip:port"``
        (``"[v6]:port"``; ``""`` is 127.0.0.1:0); raises MessageIllegalError."""
        cached = self._hosts.get(host)
        if cached is None:
            try:
                if isinstance(host, str):
                    text, sep, port_text = host.rpartition(":")
                    ip, port = (text.strip("[]"), int(port_text)) if sep else ("127.0.0.1", 0)
                    if host and not sep:
                        raise ValueError(host)
                else:
                    ip, port = host
                encoded = encode_host(ip, int(port))
            except (TypeError, ValueError, InvalidArgumentError) as exc:
                raise MessageIllegalError(
                    f"born_host must be (numeric ip, port) or 'ip:port', got {host!r}"
                ) from exc
            flag = MessageSysFlag.BORNHOST_V6_FLAG if len(encoded) == 20 else 0
            cached = (encoded, flag, _HEADERS[(len(encoded), len(self.store_host))])
            if len(self._hosts) > 100_000:
                self._hosts.clear()
            self._hosts[host] = cached
        return cached

    def encode_batch(
        self,
        messages: Sequence[MessageFields],
        now_ms: int,
        queue_nums: Callable[[str], int] | None = None,
        *,
        unassigned_queue_ok: bool = False,
        choose_queue: Callable[[str], int] | None = None,
        known_topics: dict[str, tuple[bytes, int, int]] | None = None,
    ) -> EncodedBatch:
        """Validate and encode ``messages``; nothing is written anywhere.

        A message is a :class:`~libstore.message.Message` or any object with the same attributes
        (the services hand in their mqstore.v1 protobuf messages as they arrive: ``properties``
        may be any mapping, ``born_host`` an ``"ip:port"`` string), so no per-message copy is
        made on the way in.

        ``now_ms`` replaces a zero born timestamp. ``queue_nums(topic)`` gives the topic's queue
        count for the queue id check (None: any non-negative int32). A queue id of -1 is encoded
        as -1 with ``unassigned_queue_ok`` (a client leaving the choice to the store), or placed
        by ``choose_queue(topic)`` (the messages themselves are not changed). Raises MessageIllegalError
        (or a subclass) naming the first bad message; then no message of the batch is encoded.

        ``known_topics`` (topic -> (TOPICLEN + TOPIC bytes, magic code, queue count)), when
        given, holds topics that earlier calls with the same ``queue_nums`` already met under the
        same topic table: their messages take the C path from the first one on (a batch of one
        message of a known topic runs no Python per message). Topics met here are added to it;
        the caller drops it when the table changes. Without it, topics are looked up once per
        batch.
        """
        out = EncodedBatch()
        buf = out.buf
        sizes = out.sizes
        queue_keys = out.queue_keys
        # topic -> (TOPICLEN+TOPIC, magic, write queue count): the caller's while its topic
        # table is unchanged, else this batch's only (the queue count may change between batches).
        topics: dict[str, tuple[bytes, int, int]] = {} if known_topics is None else known_topics
        if len(topics) > _KNOWN_TOPICS_MAX:
            topics.clear()
        wide_born: list[int] = []
        msgs = messages if type(messages) is list else list(messages)
        n = len(msgs)
        index = 0
        fast = record_codec._ext is not None and type(now_ms) is int
        try:
            while index < n:
                chosen = None
                if fast:
                    # The C run (libstore._codec) encodes the common messages and stops at the
                    # first one that needs this code: to refuse it, or to meet its topic or host.
                    index, chosen, error = record_codec._ext.encode_run(
                        msgs,
                        index,
                        buf,
                        sizes,
                        queue_keys,
                        wide_born,
                        out.no_wait,
                        topics,
                        self._hosts,
                        self.store_host,
                        self._store_v6,
                        self.max_message_size,
                        now_ms,
                        choose_queue,
                        unassigned_queue_ok,
                        out.durability_marked,
                    )
                    if error is not None:  # choose_queue raised for message ``index``
                        raise error
                    if index >= n:
                        break
                self._encode_one(
                    out,
                    msgs[index],
                    index,
                    wide_born,
                    topics,
                    now_ms,
                    queue_nums,
                    choose_queue,
                    unassigned_queue_ok,
                    chosen,
                )
                index += 1
        except MessageIllegalError as exc:
            raise type(exc)(f"message {index}: {exc}") from None
        except (struct.error, TypeError, AttributeError, OverflowError) as exc:
            if not isinstance(getattr(msgs[index], "body", None), _BODY_TYPES):
                raise MessageIllegalError(f"message {index}: body must be bytes") from None
            raise MessageIllegalError(f"message {index}: malformed field: {exc}") from None
        out.positions = [0, *itertools.accumulate(sizes)]
        ts_positions = [_STORE_TS_POSITION[8]] * n
        for i in wide_born:
            ts_positions[i] = _STORE_TS_POSITION[20]
        out.store_ts_positions = ts_positions
        return out

    def _encode_one(
        self,
        out: EncodedBatch,
        m: MessageFields,
        index: int,
        wide_born: list[int],
        topics: dict[str, tuple[bytes, int, int]],
        now_ms: int,
        queue_nums: Callable[[str], int] | None,
        choose_queue: Callable[[str], int] | None,
        unassigned_queue_ok: bool,
        chosen: tuple[int] | None,
    ) -> None:
        """Encode message ``index`` onto ``out`` (see :meth:`encode_batch`; ``chosen``: ``(queue
        id,)`` when already chosen for it), or raise; a message that does not wait for the store
        (libstore.message.waits_for_store) is listed in ``out.no_wait``."""
        topic = m.topic
        info = topics.get(topic)
        if info is None:
            prefix, magic = self._topic_prefix(topic)
            limit = queue_nums(topic) if queue_nums else 0x7FFFFFFF
            info = topics[topic] = (prefix, magic, limit)
        prefix, magic, limit = info
        body = m.body
        body_len = len(body)
        max_body = self.max_message_size
        queue_id = m.queue_id
        if queue_id == -1 and choose_queue is not None:
            queue_id = chosen[0] if chosen is not None else choose_queue(topic)
        if (body_len > max_body or not 0 <= queue_id < limit or not isinstance(body, _BODY_TYPES)) and not (
            unassigned_queue_ok and queue_id == -1 and body_len <= max_body and isinstance(body, _BODY_TYPES)
        ):
            _reject(m, body_len, max_body, limit)
        props = m.properties
        if props:
            prop_bytes = properties_to_bytes(props)
            if not waits_for_store(props.get(MessageConst.WAIT)):
                out.no_wait.append(index)
            if MessageConst.DURABILITY in props:
                out.durability_marked.append(index)
        else:
            prop_bytes = b""
        born = self._hosts.get(m.born_host)
        if born is None:
            born = self._born_host(m.born_host)
        born_host, born_v6, header = born
        sys_flag = (m.sys_flag & ~_HOST_V6_FLAGS) | born_v6 | self._store_v6
        prop_len = len(prop_bytes)
        total = header.size + body_len + len(prefix) + 2 + prop_len
        record = b"".join(
            (
                header.pack(
                    total,
                    magic,
                    body_crc32(body) & 0x7FFFFFFF,
                    queue_id,
                    m.flag,
                    0,
                    0,
                    sys_flag,
                    m.born_timestamp or now_ms,
                    born_host,
                    0,
                    self.store_host,
                    m.reconsume_times,
                    m.prepared_transaction_offset,
                    body_len,
                ),
                body,
                prefix,
                _SHORT.pack(prop_len),
                prop_bytes,
            )
        )
        out.buf += record
        out.sizes.append(total)
        # PREPARED (0x4) and ROLLBACK (0xC) share bit 0x4: no queue offset for them.
        no_queue_offset = sys_flag & MessageSysFlag.TRANSACTION_PREPARED_TYPE
        out.queue_keys.append(None if no_queue_offset else (topic, queue_id))
        if born_v6:
            wide_born.append(index)

    def adopt_records(
        self,
        raw: bytes | bytearray | memoryview,
        now_ms: int,
        queue_nums: Callable[[str], int] | None = None,
        *,
        choose_queue: Callable[[str], int] | None = None,
        born_host: bytes = b"",
        check_topic: Callable[[str], None] | None = None,
        check_properties: Callable[[Iterable[str]], None] | None = None,
        forbidden_properties: frozenset[str] | None = None,
        sys_flag_mask: int = -1,
        max_records: int = 0,
        known_topics: dict[str, int] | None = None,
    ) -> EncodedBatch:
        """Validate records a client encoded and make them this store's, without decoding them
        into messages (the records form of Produce: RocketMQ's layout with PHYSICALOFFSET,
        QUEUEOFFSET and STORETIMESTAMP 0, an IPv4 STOREHOST placeholder, BORNHOST 0.0.0.0:0 for
        "the caller", QUEUEID -1 for "place it").

        Each record must check out as recovery would check it (magic, lengths, body CRC), carry
        PHYSICALOFFSET 0 and the STOREHOST placeholder, and pass the put checks (topic name, body
        size, queue id within ``queue_nums(topic)``, properties as the encoder writes them: UTF-8
        ``name \\x01 value \\x02`` entries with non-empty names). QUEUEID -1 takes ``choose_queue(topic)``;
        a 0.0.0.0:0 BORNHOST takes ``born_host`` (8 encoded bytes, when given); STOREHOST becomes
        this store's and a zero BORNTIMESTAMP ``now_ms``; offsets are left for the put lock. The
        decoded requests are kept in the batch (``requests``) for dispatch. What a producer may
        put (libstore.producer_input): ``check_topic`` is called once per topic and
        ``check_properties`` with each record's property names (both raise to refuse;
        ``forbidden_properties``, when given, are the names ``check_properties`` refuses, so the
        C path can test them itself and leave the wording of the refusal to it), and
        SYSFLAG is masked in place to ``sys_flag_mask`` (the host-layout bits stay). Raises
        MessageIllegalError (or a subclass) naming the first bad record, or when there are more
        than ``max_records`` records (0: no bound); nothing is kept.

        ``known_topics`` (topic -> queue count), when given, holds topics that earlier calls with
        the same checks already met under the same topic table: their records take the C path
        from the first one on (a batch of one record of a known topic runs no Python per
        record). Topics met here are added to it. The caller drops it when the table changes.

        Thread-safety: may run on a worker thread while the store appends (it touches no state
        of the store but the topic table, which locks, and round-robin counters).
        """
        if len(self.store_host) != len(STORE_HOST_PLACEHOLDER):
            raise MessageIllegalError("client-encoded records need an IPv4 store host; send messages")
        out = EncodedBatch()
        buf = bytearray(raw)
        limit = len(buf)
        limits: dict[str, int] = {} if known_topics is None else known_topics
        # The C run (libstore._codec) takes the common records and stops at the first one that
        # needs this Python code: to refuse it, or to meet its topic.
        forbidden = frozenset() if check_properties is None else forbidden_properties
        fast = (
            record_codec._ext is not None
            and isinstance(forbidden, (set, frozenset))
            and type(born_host) is bytes
            and type(now_ms) is int
            and type(max_records) is int
            and -(2**31) <= sys_flag_mask < 2**31
        )
        pos = 0
        index = 0
        while pos < limit:
            chosen = None
            if fast:
                pos, index, chosen = record_codec._ext.adopt_run(
                    buf,
                    pos,
                    index,
                    now_ms,
                    self.store_host,
                    born_host,
                    sys_flag_mask,
                    self.max_message_size,
                    max_records,
                    forbidden,
                    limits,
                    choose_queue,
                    out,
                )
                if pos >= limit:
                    break
            pos = self._adopt_one(
                out,
                buf,
                pos,
                index,
                now_ms,
                limits,
                queue_nums,
                choose_queue,
                born_host,
                check_topic,
                check_properties,
                sys_flag_mask,
                max_records,
                chosen,
            )
            index += 1
        out.buf = buf
        return out

    def _adopt_one(
        self,
        out: EncodedBatch,
        buf: bytearray,
        pos: int,
        index: int,
        now_ms: int,
        limits: dict[str, int],
        queue_nums: Callable[[str], int] | None,
        choose_queue: Callable[[str], int] | None,
        born_host: bytes,
        check_topic: Callable[[str], None] | None,
        check_properties: Callable[[Iterable[str]], None] | None,
        sys_flag_mask: int,
        max_records: int,
        chosen: tuple[int] | None = None,
    ) -> int:
        """Adopt record ``index`` at ``pos`` into ``out`` (see :meth:`adopt_records`; ``chosen``:
        ``(queue id,)`` when already chosen for it), or raise naming it. Returns where the next
        record starts."""
        limit = len(buf)
        if max_records and index >= max_records:
            raise MessageIllegalError(f"a request carries at most {max_records} records")
        req, fields, _, props_at = _check_record(buf, pos, limit, True, 0, True)
        if not req.success or req.msg_size == 0:
            raise MessageIllegalError(f"record {index}: not a valid CommitLog record (size, magic or CRC)")
        size = req.msg_size
        if props_at < pos + size:  # the body CRC covers the body only: check them as encoding would
            problem = _properties_problem(bytes(buf[props_at : pos + size]))
            if problem:
                raise MessageIllegalError(f"record {index}: {problem}")
            if check_properties is not None:
                try:
                    check_properties(bytes_to_properties(buf[props_at : pos + size]))
                except MessageIllegalError as exc:
                    raise type(exc)(f"record {index}: {exc}") from None
        sys_flag = req.sys_flag
        masked = sys_flag & (sys_flag_mask | _HOST_V6_FLAGS)
        if masked != sys_flag:
            _INT.pack_into(buf, pos + SYS_FLAG_POSITION, masked)
            req.sys_flag = sys_flag = masked
        if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG:
            raise MessageIllegalError(f"record {index}: STOREHOST must be the IPv4 placeholder")
        topic = req.topic
        if req.queue_id == -1 and choose_queue is not None:
            req.queue_id = chosen[0] if chosen is not None else choose_queue(topic)
            _INT.pack_into(buf, pos + QUEUE_ID_POSITION, req.queue_id)
        queue_limit = limits.get(topic)
        if queue_limit is None:
            try:
                self._topic_prefix(topic)  # validates the name
                if check_topic is not None:
                    check_topic(topic)
            except MessageIllegalError as exc:
                raise type(exc)(f"record {index}: {exc}") from None
            queue_limit = limits[topic] = queue_nums(topic) if queue_nums else 0x7FFFFFFF
        if not 0 <= req.queue_id < queue_limit:
            raise QueueIdOutOfRangeError(
                f"record {index}: queue id {req.queue_id} out of range: "
                f"topic {topic!r} has {queue_limit} queues"
            )
        body_len = fields[-1]  # BODYLEN, the last field of the fixed header
        if body_len > self.max_message_size:
            raise MessageIllegalError(
                f"record {index}: body is {body_len} bytes, the limit is {self.max_message_size}"
            )
        ts_position = _store_ts_position(sys_flag)
        buf[pos + ts_position + 8 : pos + ts_position + 16] = self.store_host
        born_v4 = not sys_flag & MessageSysFlag.BORNHOST_V6_FLAG
        born_at = pos + BORN_HOST_POSITION
        if born_host and born_v4 and buf[born_at : born_at + 8] == STORE_HOST_PLACEHOLDER:
            buf[born_at : born_at + 8] = born_host
        if req.born_timestamp == 0:
            STORE_TIMESTAMP.pack_into(buf, pos + BORN_TIMESTAMP_POSITION, now_ms)
        pos += size
        out.positions.append(pos)
        out.sizes.append(size)
        out.store_ts_positions.append(ts_position)
        no_queue_offset = sys_flag & MessageSysFlag.TRANSACTION_PREPARED_TYPE  # PREPARED 0x4, ROLLBACK 0xC
        out.queue_keys.append(None if no_queue_offset else (topic, req.queue_id))
        out.topics.append(topic)
        out.uniq_keys.append(req.uniq_key)
        out.requests.append(req)
        if req.scheduled:
            out.scheduled = True
        raw = buf[props_at:pos] if props_at < pos else b""
        if _WAIT_ENTRY in raw or _DURABILITY_ENTRY in raw:  # parsed only when one may be there
            props = bytes_to_properties(raw)
            if not waits_for_store(props.get(MessageConst.WAIT)):
                out.no_wait.append(index)
            if MessageConst.DURABILITY in props:
                out.durability_marked.append(index)
        return pos


def assign_offsets(
    buf: bytearray,
    positions: list[int],
    ts_positions: list[int],
    keys: list[tuple[str, int] | None],
    table: dict[tuple[str, int], int],
    start: int,
    stop: int,
    delta: int,
    store_ts: int,
    qoffs: list[int],
) -> None:
    """The put lock's loop over records ``start``..``stop``-1 of an encoded batch: each takes
    the next queue offset of its queue from ``table`` ((topic, queue id) -> next offset, 0 when
    absent; 0 and no entry for a None key, tx PREPARED/ROLLBACK), written into ``buf`` with its
    PHYSICALOFFSET (its position + ``delta``) and STORETIMESTAMP ``store_ts`` (ms), and appended
    to ``qoffs``. In C when the extension is built (a bytearray and a dict)."""
    if (
        record_codec._ext is not None
        and type(buf) is bytearray
        and type(table) is dict
        and type(positions) is list
        and type(ts_positions) is list
        and type(keys) is list
        and type(qoffs) is list
    ):
        record_codec._ext.assign_offsets(
            buf, positions, ts_positions, keys, table, start, stop, delta, store_ts, qoffs
        )
        return
    _assign_offsets_py(buf, positions, ts_positions, keys, table, start, stop, delta, store_ts, qoffs)


def _assign_offsets_py(
    buf: bytearray,
    positions: list[int],
    ts_positions: list[int],
    keys: list[tuple[str, int] | None],
    table: dict[tuple[str, int], int],
    start: int,
    stop: int,
    delta: int,
    store_ts: int,
    qoffs: list[int],
) -> None:
    """The reference :func:`assign_offsets`, in pure Python."""
    get_next = table.get
    pack_offsets = QUEUE_OFFSET_AND_PHY_OFFSET.pack_into
    pack_ts = STORE_TIMESTAMP.pack_into
    add_qoff = qoffs.append
    for k in range(start, stop):
        key = keys[k]
        if key is None:
            queue_offset = 0
        else:
            queue_offset = get_next(key, 0)
            table[key] = queue_offset + 1
        pos = positions[k]
        pack_offsets(buf, pos + QUEUE_OFFSET_POSITION, queue_offset, pos + delta)
        pack_ts(buf, pos + ts_positions[k], store_ts)
        add_qoff(queue_offset)


STORE_HOST_PLACEHOLDER: Final = bytes(8)  # 0.0.0.0:0 as STOREHOST in client-encoded records


def _reject(m: MessageFields, body_len: int, max_body: int, limit: int) -> None:
    """Raise the error that explains why ``m`` failed the encoder's quick checks."""
    if not isinstance(m.body, _BODY_TYPES):
        raise MessageIllegalError("body must be bytes")
    if body_len > max_body:
        raise MessageIllegalError(f"body is {body_len} bytes, the limit is {max_body}")
    raise QueueIdOutOfRangeError(
        f"queue id {m.queue_id!r} out of range: topic {m.topic!r} has {limit} queues"
    )
