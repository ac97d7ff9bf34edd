"""Access control for both client protocols of the gateway: who is calling and what that
account may do. One accounts file (RocketMQ's ``plain_acl.yml`` format, YAML or JSON) serves
RocketMQ 5's MessagingService and mqstore's own Gateway API alike::

    clockSkewSeconds: 900            # optional: how far a signature's date may be from now
    clientUtcOffsets: ["+08:00"]     # optional: see "Dates" below
    accounts:
      - accessKey: app1
        secretKey: app1-secret
        admin: false                 # true: every permission, and the admin operations
        defaultTopicPerm: DENY       # for topics not listed: DENY, PUB, SUB or PUB|SUB
        defaultGroupPerm: DENY       # for groups not listed: DENY or SUB
        topicPerms: [Orders=PUB|SUB, Audit=SUB]
        groupPerms: [billing=SUB]
        certificateCommonName: app1  # optional: own-API calls over mutual TLS with this CN

Signatures (:mod:`services.gateway.signature`): RocketMQ 5 calls carry ``MQv2-HMAC-SHA1`` over
the date header; own-API calls carry ``MQSTORE-HMAC-SHA256`` over the date, the method and a
SHA-256 of the request bytes. Either is accepted only while its date lies within the clock-skew
window, and a refusal never tells an unknown key from a wrong signature. With the gateway
requiring client certificates (``--tls-client-ca``), an unsigned own-API call whose verified
certificate's common name is an account's ``certificateCommonName`` acts as that account.

Dates: mqstore's clients sign UTC. RocketMQ's official clients sign their *local* time with a
``Z`` suffix (spec sheet rocketmq-grpc-v2 §2), so a v2 date is compared with UTC and with the
server's own UTC offset, plus any offset listed in ``clientUtcOffsets`` for clients elsewhere.
Each of those is a window of its own, so a captured v2 header is accepted again when the clock
reaches the next zone's window: list only the zones clients run in.

Scope: the store's own topics (libstore.system_topics.is_reserved_topic) are readable by admins
only, and never writable by a client at all (the produce paths refuse them); a group's
``%RETRY%``/``%DLQ%`` topics are readable by whoever may consume as that group. Unlike
RocketMQ's plain ACL, ``defaultGroupPerm`` defaults to DENY: an account consumes only as the
groups it is given, so it cannot receive or ack another team's messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from libstore.errors import ConfigError, PermissionDeniedError
from libstore.system_topics import group_of_topic, is_reserved_topic

PUB = 1
SUB = 2
_PERMS = {"DENY": 0, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
DEFAULT_CLOCK_SKEW_S = 900
_OFFSET = re.compile(r"^([+-])(\d{1,2}):?(\d{2})$")


@dataclass(frozen=True)
class Account:
    """One account of the file. ``*_perm`` values are PUB/SUB bit sets."""

    access_key: str
    secret_key: str = field(repr=False)  # never in a log line
    admin: bool = False
    default_topic_perm: int = 0
    default_group_perm: int = 0
    topic_perms: Mapping[str, int] = field(default_factory=dict)
    group_perms: Mapping[str, int] = field(default_factory=dict)
    certificate_cn: str = ""

    def may_group(self, group: str) -> bool:
        """Whether this account may consume as ``group``."""
        return self.admin or bool(self.group_perms.get(group, self.default_group_perm) & SUB)

    def may(self, perm: int, topic: str = "", group: str = "") -> bool:
        """Whether this account holds ``perm`` (PUB, SUB, or PUB|SUB meaning either) on
        ``topic`` and, when ``group`` is given, may consume as it. System topics: admins only;
        ``%RETRY%g``/``%DLQ%g``: SUB for whoever may consume as ``g``, PUB for nobody."""
        if self.admin:
            return True
        if group and not self.may_group(group):
            return False
        if not topic:
            return True
        if is_reserved_topic(topic):
            return False
        owner = group_of_topic(topic)
        if owner is not None:
            return bool(perm & SUB) and self.may_group(owner)
        return bool(self.topic_perms.get(topic, self.default_topic_perm) & perm)


def _perm(text: Any, where: str) -> int:
    value = _PERMS.get(str(text).strip().upper().replace(" ", ""))
    if value is None:
        raise ConfigError(f"{where}: permission must be DENY, PUB, SUB or PUB|SUB, got {text!r}")
    return value


def _perm_list(items: Any, where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{where}: entries look like name=PUB|SUB, got {item!r}")
        out[name.strip()] = _perm(perm, where)
    return out


def parse_utc_offset(text: str) -> int:
    """``"+08:00"``, ``"-0530"`` or ``"+8:00"`` as seconds east of UTC. Raises ConfigError."""
    m = _OFFSET.match(str(text).strip())
    if not m or int(m.group(2)) > 14 or int(m.group(3)) >= 60:
        raise ConfigError(f"a UTC offset looks like +08:00 or -05:30, got {text!r}")
    seconds = int(m.group(2)) * 3600 + int(m.group(3)) * 60
    return seconds if m.group(1) == "+" else -seconds


class AccessControl:
    """The accounts of one file and the signature window.

    ``clock_skew_s``: a signature is valid while its date is within this many seconds of the
    server's clock (default 900, ±15 min). ``client_utc_offsets``: seconds east of UTC of the
    local times RocketMQ 5 clients may sign with, besides UTC and the server's own offset.
    """

    def __init__(
        self,
        accounts: list[Account],
        *,
        clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
        client_utc_offsets: tuple[int, ...] = (),
    ) -> None:
        if clock_skew_s <= 0:
            raise ConfigError(f"clockSkewSeconds must be positive, got {clock_skew_s}")
        self.accounts = {a.access_key: a for a in accounts}
        self.by_certificate = {a.certificate_cn: a for a in accounts if a.certificate_cn}
        self.clock_skew_s = clock_skew_s
        self.client_utc_offsets = client_utc_offsets

    @classmethod
    def load(cls, path: Path) -> AccessControl:
        """Read a plain_acl.yml-style file (format in the module doc). Raises ConfigError with
        the reason: unreadable, not a mapping with an ``accounts`` list, an account without
        keys, a bad permission, an access key listed twice."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read ACL file {path}: {exc}") from None
        try:
            data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except json.JSONDecodeError as exc:  # its message names the position, not the text
            raise ConfigError(f"ACL file {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
        except yaml.YAMLError as exc:
            # Only where: the parser's own message quotes the offending line, secret and all.
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"ACL file {path} is not valid YAML{where}") from None
        if not isinstance(data, dict) or not isinstance(data.get("accounts"), list):
            raise ConfigError(f"ACL file {path} must hold an 'accounts' list")
        accounts = []
        for i, raw in enumerate(data["accounts"]):
            where = f"{path} account {i + 1}"
            if not isinstance(raw, dict) or not raw.get("accessKey") or not raw.get("secretKey"):
                raise ConfigError(f"{where}: accessKey and secretKey are required")
            accounts.append(
                Account(
                    str(raw["accessKey"]),
                    str(raw["secretKey"]),
                    admin=bool(raw.get("admin", False)),
                    default_topic_perm=_perm(raw.get("defaultTopicPerm", "DENY"), where),
                    default_group_perm=_perm(raw.get("defaultGroupPerm", "DENY"), where),
                    topic_perms=_perm_list(raw.get("topicPerms"), where),
                    group_perms=_perm_list(raw.get("groupPerms"), where),
                    certificate_cn=str(raw.get("certificateCommonName") or ""),
                )
            )
        if len({a.access_key for a in accounts}) != len(accounts):
            raise ConfigError(f"ACL file {path} lists an access key twice")
        names = [a.certificate_cn for a in accounts if a.certificate_cn]
        if len(set(names)) != len(names):
            raise ConfigError(f"ACL file {path} maps one certificateCommonName to two accounts")
        try:
            skew = int(data.get("clockSkewSeconds", DEFAULT_CLOCK_SKEW_S))
        except (TypeError, ValueError):
            raise ConfigError(f"ACL file {path}: clockSkewSeconds must be a number of seconds") from None
        offsets = data.get("clientUtcOffsets") or []
        if not isinstance(offsets, list):
            raise ConfigError(f"ACL file {path}: clientUtcOffsets must be a list such as ['+08:00']")
        return cls(
            accounts,
            clock_skew_s=skew,
            client_utc_offsets=tuple(parse_utc_offset(o) for o in offsets),
        )

    def account(self, access_key: str) -> Account | None:
        """The account of ``access_key``, or None."""
        return self.accounts.get(access_key)

    def account_of_certificate(self, common_name: str) -> Account | None:
        """The account mapped to a verified client certificate's common name, or None."""
        return self.by_certificate.get(common_name) if common_name else None

    @staticmethod
    def authorize(account: Account, perm: int = 0, topic: str = "", group: str = "") -> None:
        """Require ``perm`` (PUB, SUB, PUB|SUB for either, 0 for none) on ``topic`` and
        consumption as ``group`` (see :meth:`Account.may`). Raises PermissionDeniedError."""
        if account.may(perm, topic, group):
            return
        what = {0: "consume", PUB: "publish to", SUB: "subscribe to", PUB | SUB: "use"}[perm]
        target = f" topic {topic}" if topic else ""
        extra = f" as group {group}" if group else ""
        raise PermissionDeniedError(f"access key {account.access_key!r} may not {what}{target}{extra}")

    @staticmethod
    def require_admin(account: Account, operation: str) -> None:
        """Require an admin account for ``operation``. Raises PermissionDeniedError."""
        if not account.admin:
            raise PermissionDeniedError(f"access key {account.access_key!r} may not {operation}: admin only")
