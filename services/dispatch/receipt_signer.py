"""Signed receipt handles: a consumer can only ack, nack or dead-letter what this broker group
delivered to its group, on the topic it was delivered for.

A pop receipt handle names its unit in plain numbers (libstore.pop_state.ReceiptHandle: queue,
offset, a sequence number that grows by one per delivery...), so without a signature a
consumer could make up the handle of a message delivered to someone else and ack it unseen.
Every handle the dispatch service hands out carries ``:<tag>``, the first 128 bits of
HMAC-SHA256(key, group NUL topic NUL handle), and every handle it is given back must carry the
right tag for the group and topic of the call (compared in constant time).

The key (32 random bytes) is one per broker group: the replicas' dispatch services must share
it, or handles issued before a failover stop verifying after it (their messages then come back
once their invisible time ends, at-least-once as for any lost ack). Give every member the same
file (``--receipt-key-file``, a Kubernetes Secret); without one, each dispatch creates its own
under its data folder (``config/receiptKey``, mode 0600) on first start.
"""

from __future__ import annotations

import hmac
import os
import secrets
from hashlib import sha256
from pathlib import Path

from libstore.errors import ConfigError, InvalidReceiptHandleError

KEY_BYTES = 32
TAG_HEX = 32  # 128 bits
DEFAULT_KEY_PATH = Path("config") / "receiptKey"


class ReceiptSigner:
    """Signs and verifies receipt handles with one ``key`` (at least 16 bytes)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigError(f"a receipt key needs at least 16 bytes, got {len(key)}")
        self._key = key

    @classmethod
    def load(cls, root: Path, key_file: Path | None = None) -> ReceiptSigner:
        """The key of ``key_file`` (the broker group's shared one: its bytes, or hex text), else
        of ``root``/config/receiptKey, created (random, mode 0600) when missing. Raises
        ConfigError for a key file that cannot be read or is too short."""
        if key_file is not None:
            try:
                raw = Path(key_file).read_bytes()
            except OSError as exc:
                raise ConfigError(f"cannot read the receipt key file {key_file}: {exc}") from None
            try:  # hex text (a trailing newline allowed), else the bytes as they are
                key = bytes.fromhex(raw.decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                key = raw
            return cls(key)
        path = Path(root) / DEFAULT_KEY_PATH
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, secrets.token_hex(KEY_BYTES).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        return cls.load(root, path)

    def _tag(self, group: str, topic: str, handle: str) -> str:
        message = f"{group}\0{topic}\0{handle}".encode()
        return hmac.new(self._key, message, sha256).hexdigest()[:TAG_HEX]

    def sign(self, group: str, topic: str, handle: str) -> str:
        """``handle`` (text) with its tag for ``group`` and ``topic``."""
        return f"{handle}:{self._tag(group, topic, handle)}"

    def verify(self, group: str, topic: str, signed: str) -> str:
        """The handle text of ``signed`` when its tag is right for ``group`` and ``topic``.
        Raises InvalidReceiptHandleError (the same message whatever is wrong)."""
        handle, sep, tag = signed.rpartition(":") if isinstance(signed, str) else ("", "", "")
        if not sep or len(tag) != TAG_HEX or not hmac.compare_digest(tag, self._tag(group, topic, handle)):
            raise InvalidReceiptHandleError(f"not a receipt handle of group {group} on topic {topic}")
        return handle
