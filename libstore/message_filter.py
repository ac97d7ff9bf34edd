"""Tag filters: RocketMQ's TAG subscription expressions (``FilterAPI`` / ``SubscriptionData``).

An expression is ``*`` (or empty: everything) or tags joined by ``||`` (``TagA || TagB``). A pull
first compares the ConsumeQueue unit's tags code with the codes of the wanted tags (spec §3), which
needs no CommitLog read, then checks the record's exact TAGS, since different tags can share a
hash code: the broker's and the client's halves of RocketMQ's filtering, in one place.
"""

from __future__ import annotations

from libstore.errors import InvalidArgumentError
from libstore.tags import tags_code

SUB_ALL = "*"
_MAX_EXPRESSION_LENGTH = 4096


class TagFilter:
    """A parsed TAG expression; ``TagFilter("*")`` (:data:`ACCEPT_ALL`) accepts everything.

    Raises InvalidArgumentError for an expression that is not text or is absurdly long.
    """

    __slots__ = ("codes", "expression", "tags")

    def __init__(self, expression: str | None = SUB_ALL) -> None:
        if expression is not None and not isinstance(expression, str):
            raise InvalidArgumentError(f"a tag expression is text, got {type(expression).__name__}")
        if expression is not None and len(expression) > _MAX_EXPRESSION_LENGTH:
            raise InvalidArgumentError(f"tag expression longer than {_MAX_EXPRESSION_LENGTH} characters")
        text = (expression or "").strip()
        self.expression = text or SUB_ALL
        if self.expression == SUB_ALL:
            self.tags: frozenset[str] | None = None
            self.codes: frozenset[int] | None = None
            return
        tags = frozenset(t.strip() for t in text.split("||") if t.strip())
        if not tags or SUB_ALL in tags:
            self.tags = self.codes = None
            self.expression = SUB_ALL
            return
        self.tags = tags
        self.codes = frozenset(tags_code(t) for t in tags)

    @property
    def accepts_all(self) -> bool:
        return self.tags is None

    def matches_code(self, code: int) -> bool:
        """The ConsumeQueue-level check: the unit's tags code is one of the wanted tags' codes."""
        return self.codes is None or code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        """The exact check on the message's TAGS property."""
        return self.tags is None or tags in self.tags

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"


ACCEPT_ALL = TagFilter(SUB_ALL)
