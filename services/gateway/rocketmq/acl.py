"""Access control for the RocketMQ 5 protocol: who is calling (the ``authorization`` header's
access key and HMAC-SHA1 signature) and what that key may do (publish to or subscribe from a
topic, consume as a group).

Accounts come from a file in RocketMQ's ``plain_acl.yml`` format (YAML or JSON)::

    accounts:
      - accessKey: app1
        secretKey: app1-secret
        admin: false                 # true: every permission
        defaultTopicPerm: DENY       # for topics not listed: DENY, PUB, SUB or PUB|SUB
        defaultGroupPerm: SUB        # for groups not listed: DENY or SUB
        topicPerms: [Orders=PUB|SUB, Audit=SUB]
        groupPerms: [billing=SUB]

The header (spec sheet rocketmq-grpc-v2 §2) is ``MQv2-HMAC-SHA1 Credential=<ak>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret, x-mq-date-time)>``. A missing or
malformed header, an unknown key or a wrong signature is UNAUTHORIZED; a known key without the
permission is FORBIDDEN (RocketMQ 5's AuthenticationException and AuthorizationException codes).
Off unless the gateway is given a file (``mqstore serve --acl-file``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha1
from pathlib import Path
from typing import Any

import yaml

from libstore.errors import ConfigError

PUB = 1
SUB = 2
_PERMS = {"DENY": 0, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
SCHEME = "MQv2-HMAC-SHA1"


class AclError(Exception):
    """Refused: ``forbidden`` False for authentication failures (UNAUTHORIZED), True for a
    missing permission (FORBIDDEN)."""

    def __init__(self, message: str, *, forbidden: bool) -> None:
        super().__init__(message)
        self.forbidden = forbidden


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: int = 0
    default_group_perm: int = SUB
    topic_perms: Mapping[str, int] = field(default_factory=dict)
    group_perms: Mapping[str, int] = field(default_factory=dict)

    def may(self, perm: int, topic: str = "", group: str = "") -> bool:
        """Whether this account has ``perm`` (PUB or SUB) on ``topic`` and, when given, may
        consume as ``group``."""
        if self.admin:
            return True
        if topic and not self.topic_perms.get(topic, self.default_topic_perm) & perm:
            return False
        return not group or bool(self.group_perms.get(group, self.default_group_perm) & SUB)


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


class AccessControl:
    """The accounts of one ACL file; :meth:`check` authenticates and authorizes a call."""

    def __init__(self, accounts: list[Account]) -> None:
        self.accounts = {a.access_key: a for a in accounts}

    @classmethod
    def load(cls, path: Path) -> AccessControl:
        """Read a plain_acl.yml-style file. Raises ConfigError with the reason."""
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read ACL file {path}: {exc}") from exc
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
                    default_group_perm=_perm(raw.get("defaultGroupPerm", "SUB"), where),
                    topic_perms=_perm_list(raw.get("topicPerms"), where),
                    group_perms=_perm_list(raw.get("groupPerms"), where),
                )
            )
        if len({a.access_key for a in accounts}) != len(accounts):
            raise ConfigError(f"ACL file {path} lists an access key twice")
        return cls(accounts)

    def authenticate(self, metadata: Mapping[str, str]) -> Account:
        """The account whose key signed this call's ``x-mq-date-time``. Raises AclError
        (UNAUTHORIZED) otherwise."""
        header = metadata.get("authorization", "")
        scheme, _, rest = header.partition(" ")
        if scheme != SCHEME:
            raise AclError(f"the authorization header must use {SCHEME}", forbidden=False)
        fields: dict[str, str] = {}
        for part in rest.split(","):
            key, _, value = part.strip().partition("=")
            fields[key] = value
        ak, signature = fields.get("Credential", ""), fields.get("Signature", "")
        account = self.accounts.get(ak)
        if account is None:
            raise AclError(f"unknown access key {ak!r}", forbidden=False)
        date_time = metadata.get("x-mq-date-time", "")
        if not date_time or fields.get("SignedHeaders", "") != "x-mq-date-time":
            raise AclError("the signed x-mq-date-time header is missing", forbidden=False)
        expected = hmac.new(account.secret_key.encode(), date_time.encode(), sha1).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            raise AclError(f"wrong signature for access key {ak!r}", forbidden=False)
        return account

    def check(self, metadata: Mapping[str, str], perm: int = 0, topic: str = "", group: str = "") -> Account:
        """Authenticate, then require ``perm`` (PUB, SUB, PUB|SUB meaning either, or 0 for
        none) on ``topic`` and consumption as ``group``. Raises AclError."""
        account = self.authenticate(metadata)
        # PUB | SUB asks for either: Account.may tests the bits it is given.
        allowed = not perm or account.may(perm, topic, group if perm == SUB else "")
        if not allowed:
            what = {PUB: "publish to", SUB: "subscribe to", PUB | SUB: "use"}[perm]
            extra = f" as group {group}" if group and perm == SUB else ""
            raise AclError(
                f"access key {account.access_key!r} may not {what} topic {topic}{extra}", forbidden=True
            )
        return account
