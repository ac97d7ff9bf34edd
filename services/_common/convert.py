"""Protobuf ⇄ libstore conversions for mqstore.v1 (messages, put results, topics, views).

Bad input raises libstore errors (InvalidArgumentError, MessageIllegalError), which the server's
error mapping turns into INVALID_ARGUMENT: a malformed field never reaches the log.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from operator import itemgetter
from typing import cast

from libstore import (
    InvalidArgumentError,
    MessageConst,
    MessageRecord,
    PutMessageResults,
    PutMessageStatus,
    TopicConfig,
    TopicMessageType,
)
from libstore.durability import Durability
from libstore.message import MessageFields
from libstore.message_id import create_message_ids
from libstore.record_codec import native
from services.proto import common_pb, gateway_pb

# Value() is typed as a plain int; each is one of the enum's values by construction.
_PUT_STATUS_TO_PB = {
    s: cast("common_pb.PutStatus", common_pb.PutStatus.Value(s.name)) for s in PutMessageStatus
}
_PUT_STATUS_FROM_PB = {v: k for k, v in _PUT_STATUS_TO_PB.items()}


@functools.lru_cache(maxsize=1024)
def peer_host(peer: str) -> tuple[str, int]:
    """The caller's address from a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``);
    cached: a connection's peer string repeats on every call it makes."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, port = rest.rpartition(":")
        if port.isdigit():
            return host.strip("[]"), int(port)
    return "127.0.0.1", 0


def host_text(host: tuple[str, int] | str) -> str:
    """``(ip, port)`` as ``ip:port`` (``[ip]:port`` for IPv6), the form born hosts travel in;
    a host in that form already (a Message made from a protobuf one) as it is."""
    if isinstance(host, str):
        return host
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@functools.lru_cache(maxsize=1024)
def peer_text(peer: str) -> str:
    """The caller's address from a gRPC peer string, as :func:`host_text` (cached: a
    connection's peer string repeats on every call it makes)."""
    return host_text(peer_host(peer))


def message_to_pb(m: MessageFields) -> common_pb.Message:
    return common_pb.Message(
        topic=m.topic,
        queue_id=m.queue_id,
        body=bytes(m.body),
        properties=m.properties,
        flag=m.flag,
        sys_flag=m.sys_flag,
        born_timestamp=m.born_timestamp,
        born_host=host_text(m.born_host),
        reconsume_times=m.reconsume_times,
        prepared_transaction_offset=m.prepared_transaction_offset,
    )


def results_to_pb(results: PutMessageResults) -> common_pb.PutResults:
    """Column results on the wire, with the appended messages' offset message ids."""
    host = results.store_host
    phys = results.phy_offsets
    out = common_pb.PutResults(
        count=len(results),
        appended=results.appended,
        status=_PUT_STATUS_TO_PB[results.status],
        failed_status=_PUT_STATUS_TO_PB[results.failed_status],
        phy_offsets=phys,
        sizes=results.sizes[: results.appended],
        queue_offsets=results.queue_offsets,
        store_timestamp=results.store_timestamp,
        store_host=host,
        msg_ids=create_message_ids(host, phys) if host else [],
    )
    if results.unwaited:  # messages that said WAIT=false (most batches have none)
        out.unwaited.extend(sorted(results.unwaited))
    return out


def encode_results_reply(results: PutMessageResults) -> bytes:
    """A reply whose field 1 is ``results`` as :func:`results_to_pb` gives them (ProduceResponse,
    commitlog AppendResponse), already encoded: for a handler to return as it is
    (services._common.wire.accepts_encoded_replies). In one C call when libstore._codec is
    built, with no message object on the way (a single-message Produce spent ~12 us building
    and encoding them); else through protobuf. The two give the same bytes (tests compare them)."""
    ext = native()
    if ext is None:
        return _encode_results_pb(results)
    return ext.encode_put_results(
        len(results),
        results.appended,
        _PUT_STATUS_TO_PB[results.status],
        _PUT_STATUS_TO_PB[results.failed_status],
        results.phy_offsets,
        results.sizes[: results.appended],
        results.queue_offsets,
        results.store_timestamp,
        results.store_host,
        sorted(results.unwaited) if results.unwaited else [],
    )


def _encode_results_pb(results: PutMessageResults) -> bytes:
    """:func:`encode_results_reply` through protobuf (the reference the C encoder is held to)."""
    return gateway_pb.ProduceResponse(results=results_to_pb(results)).SerializeToString()


def results_from_pb(pb: common_pb.PutResults) -> PutMessageResults:
    out = PutMessageResults(
        pb.count,
        phy_offsets=list(pb.phy_offsets),
        sizes=list(pb.sizes),
        queue_offsets=list(pb.queue_offsets),
        store_timestamp=pb.store_timestamp,
        store_host=pb.store_host,
        failed_status=_PUT_STATUS_FROM_PB.get(pb.failed_status, PutMessageStatus.UNKNOWN_ERROR),
        unwaited=frozenset(pb.unwaited),
    )
    out.status = _PUT_STATUS_FROM_PB.get(pb.status, PutMessageStatus.UNKNOWN_ERROR)
    return out


def topic_to_pb(config: TopicConfig) -> common_pb.TopicConfig:
    return common_pb.TopicConfig(
        topic=config.topic_name,
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=config.perm,
        message_type=config.message_type.value,
        retention_hours=config.retention_hours,
        durability=config.durability.value,
    )


def topic_from_pb(pb: common_pb.TopicConfig, default_queue_nums: int = 8) -> TopicConfig:
    """A TopicConfig from the wire; zero queue counts take ``default_queue_nums``."""
    if not pb.topic:
        raise InvalidArgumentError("topic must be non-empty")
    try:
        message_type = TopicMessageType(pb.message_type or "NORMAL")
    except ValueError as exc:
        raise InvalidArgumentError(f"unknown message type {pb.message_type!r}") from exc
    try:
        durability = Durability(pb.durability or Durability.PERSISTENT.value)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"durability must be persistent or transient, got {pb.durability[:40]!r}"
        ) from exc
    write = pb.write_queue_nums or default_queue_nums
    return TopicConfig(
        topic_name=pb.topic,
        read_queue_nums=pb.read_queue_nums or write,
        write_queue_nums=write,
        perm=pb.perm or 6,
        message_type=message_type,
        retention_hours=pb.retention_hours,
        durability=durability,
    )


def record_to_view(record: MessageRecord) -> gateway_pb.MessageView:
    """A decoded record as the gateway shows it."""
    props = record.properties
    born_ip, born_port = record.born_host
    store_ip, store_port = record.store_host
    return gateway_pb.MessageView(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        phy_offset=record.phy_offset,
        msg_id=record.msg_id,
        body=record.body,
        tags=props.get(MessageConst.TAGS, ""),
        keys=record.keys,
        properties=props,
        born_timestamp=record.born_timestamp,
        store_timestamp=record.store_timestamp,
        born_host=f"{born_ip}:{born_port}",
        store_host=f"{store_ip}:{store_port}",
        reconsume_times=record.reconsume_times,
        flag=record.flag,
        sys_flag=record.sys_flag,
    )


_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


def ranges_to_columns(ranges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(offset, size) pairs as two columns, the ReadRequest's (C loops: a pull reads thousands)."""
    return list(map(_FIRST, ranges)), list(map(_SECOND, ranges))


def records_or_none(records: Sequence[bytes]) -> list[bytes | None]:
    """The wire marks a missing record with empty bytes (records are never empty)."""
    out: list[bytes | None] = list(records)
    if b"" in out:  # rare (retention, a cut): only then a Python loop
        out = [r or None for r in out]
    return out
