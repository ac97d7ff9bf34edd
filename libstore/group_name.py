"""Consumer group names: the rules RocketMQ's client ``Validators.checkGroup`` applies.

A group name is non-empty, at most ``maxGroupNameLength`` bytes (RocketMQ: 255,
``Validators.CHARACTER_MAX_LENGTH``) and uses only ``[A-Za-z0-9_%|-]`` (``VALID_PATTERN_STR``,
the characters of a topic name). Group names are kept in files rewritten on every flush
(consumer offsets, subscription groups) and in the pop journal, so they are bounded like topics.
"""

from __future__ import annotations

import re
from typing import Final

from libstore.errors import InvalidArgumentError

MAX_GROUP_NAME_LENGTH: Final = 255
_GROUP_RE = re.compile(r"[%|a-zA-Z0-9_-]+")


def validate_group(group: str, max_length: int = MAX_GROUP_NAME_LENGTH) -> str:
    """Return ``group`` when it is a valid consumer group name.

    Raises InvalidArgumentError naming the rule broken (empty, longer than ``max_length``
    characters, a character outside ``[A-Za-z0-9_%|-]``).
    """
    if not isinstance(group, str) or not group:
        raise InvalidArgumentError("consumer group must be a non-empty string")
    if len(group) > max_length:
        raise InvalidArgumentError(f"consumer group is {len(group)} characters, the limit is {max_length}")
    if not _GROUP_RE.fullmatch(group):
        raise InvalidArgumentError(f"consumer group {group!r} has characters outside [A-Za-z0-9_%|-]")
    return group
