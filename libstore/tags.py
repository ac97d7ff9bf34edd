"""Tags codes: Java's ``String.hashCode`` as RocketMQ persists it (spec sheet §3).

The ConsumeQueue stores, per message, the hash of its whole ``TAGS`` property so that a tag
filter can reject most messages without reading the CommitLog. The IndexFile hashes keys the
same way. The value must be exact: it is written to disk and compared with Java-written data.
"""

from __future__ import annotations


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode()``: h = 31*h + c over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    if text.isascii():
        for c in text.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        units = text.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def tags_code(tags: str | None) -> int:
    """Tags code of a message: hash of the whole TAGS value, 0 when there is none (spec §3)."""
    if not tags:
        return 0
    return java_string_hash(tags)
