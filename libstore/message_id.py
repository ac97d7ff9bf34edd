"""Message ids (rocketmq-store-format spec sheet §2).

* Offset message id: store IP (4 or 16 bytes) + store port (int32) + physical offset (int64),
  uppercase hex: 32 characters for IPv4, 56 for IPv6. Computed by the store for every record.
* Unique key (``UNIQ_KEY`` property, RocketMQ's ``MessageClientIDSetter``): client IP (4 or 16)
  + pid (int16) + a per-process random int32 (RocketMQ: the class loader's hash) + ms since the
  start of the current month (int32) + a counter (int16), uppercase hex. Producers set it; the
  index keys it as ``topic#uniqKey``.
"""

from __future__ import annotations

import calendar
import ipaddress
import os
import random
import struct
import threading
import time
from typing import NamedTuple

from libstore.errors import InvalidArgumentError

_PORT = struct.Struct(">i")
_OFFSET = struct.Struct(">q")


def encode_host(ip: str, port: int) -> bytes:
    """Socket address as RocketMQ writes it: 4 or 16 address bytes, then the port as int32.

    Raises InvalidArgumentError for a non-numeric address or a port outside 0..65535.
    """
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise InvalidArgumentError(f"not a numeric IP address: {ip!r}") from exc
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"port out of range: {port}")
    return addr.packed + _PORT.pack(port)


def decode_host(raw: bytes) -> tuple[str, int]:
    """Inverse of :func:`encode_host` for 8- or 20-byte input."""
    if len(raw) == 8:
        return str(ipaddress.IPv4Address(raw[:4])), _PORT.unpack_from(raw, 4)[0]
    if len(raw) == 20:
        return str(ipaddress.IPv6Address(raw[:16])), _PORT.unpack_from(raw, 16)[0]
    raise InvalidArgumentError(f"a socket address is 8 or 20 bytes, got {len(raw)}")


def create_message_id(store_host: bytes, phy_offset: int) -> str:
    """Offset message id from the encoded store host (8 or 20 bytes) and a physical offset."""
    return (store_host + _OFFSET.pack(phy_offset)).hex().upper()


def create_message_ids(store_host: bytes, phy_offsets: list[int]) -> list[str]:
    """:func:`create_message_id` of each offset (a Produce reply's ids): one C loop when
    libstore._codec is in use. Raises ValueError for a host of neither 8 nor 20 bytes."""
    from libstore import record_codec  # here: record_codec imports this module

    ext = record_codec.native()
    if ext is not None:
        return ext.message_ids(store_host, phy_offsets)  # type: ignore[no-any-return]
    if len(store_host) not in (8, 20):
        raise ValueError("message_ids: the store host is 8 or 20 bytes")
    return [create_message_id(store_host, offset) for offset in phy_offsets]


class MessageIdParts(NamedTuple):
    """A decoded offset message id."""

    ip: str
    port: int
    phy_offset: int


def decode_message_id(msg_id: str) -> MessageIdParts:
    """Split an offset message id into store ip, port and physical offset.

    Raises InvalidArgumentError if ``msg_id`` is not 32 or 56 hex characters.
    """
    if len(msg_id) not in (32, 56):
        raise InvalidArgumentError(f"a message id has 32 or 56 hex digits, got {len(msg_id)}: {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise InvalidArgumentError(f"message id is not hex: {msg_id!r}") from exc
    ip, port = decode_host(raw[:-8])
    return MessageIdParts(ip, port, _OFFSET.unpack_from(raw, len(raw) - 8)[0])


class UniqKeyGenerator:
    """Thread-safe generator of producer unique keys (RocketMQ ``MessageClientIDSetter`` layout).

    ``ip`` is the client's numeric address; the pid and a random int32 make keys of concurrent
    processes differ. Keys sort by time within a month.
    """

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        addr = ipaddress.ip_address(ip).packed
        pid_val = (os.getpid() if pid is None else pid) & 0xFFFF
        self._prefix = (addr + struct.pack(">Hi", pid_val, random.getrandbits(31))).hex().upper()
        self._lock = threading.Lock()
        self._counter = 0
        self._start_ms = 0
        self._next_start_ms = 0

    def next(self) -> str:
        """A new unique key (32 hex digits for an IPv4 client)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms >= self._next_start_ms:
                self._start_ms, self._next_start_ms = _month_bounds_ms(now_ms)
            self._counter = (self._counter + 1) & 0xFFFF
            counter = self._counter
            diff = (now_ms - self._start_ms) & 0xFFFFFFFF
        return self._prefix + f"{diff:08X}{counter:04X}"

    def next_many(self, n: int) -> list[str]:
        """``n`` new unique keys, as ``n`` calls of :meth:`next` at one instant would give them
        (one clock read and one lock for the batch; the 16-bit counter wraps as there). As with
        :meth:`next`, keys repeat past 65,536 in one millisecond (RocketMQ's layout); a Produce
        request carries far fewer (``maxMessagesPerRequest``)."""
        if n <= 0:
            return []
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms >= self._next_start_ms:
                self._start_ms, self._next_start_ms = _month_bounds_ms(now_ms)
            first = self._counter + 1
            self._counter = (self._counter + n) & 0xFFFF
            diff = (now_ms - self._start_ms) & 0xFFFFFFFF
        head = f"{self._prefix}{diff:08X}"
        return [f"{head}{c & 0xFFFF:04X}" for c in range(first, first + n)]


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    t = time.localtime(now_ms / 1000)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    days = calendar.monthrange(t.tm_year, t.tm_mon)[1]
    end = time.mktime((t.tm_year, t.tm_mon, days, 0, 0, 0, 0, 0, -1)) + 86400
    return int(start * 1000), int(end * 1000)
