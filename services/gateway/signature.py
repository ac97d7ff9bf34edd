"""The two request signatures the gateway accepts, and how a client makes the own API's.

RocketMQ 5 (``apache.rocketmq.v2``; spec sheet rocketmq-grpc-v2 §2)::

    x-mq-date-time: 20261124T081500Z          (the client's local time, despite the Z)
    authorization:  MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(secret, date-time)>

It covers the date only: a captured header is a credential for any call until its date leaves
the clock-skew window (use TLS). mqstore's own API (``mqstore.v1.Gateway``) signs the call
itself::

    x-mq-date-time: 20261124T081500Z          (UTC)
    authorization:  MQSTORE-HMAC-SHA256 Credential=<ak>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA256(secret, string to sign)>

    string to sign = "MQSTORE-HMAC-SHA256\\n" date-time "\\n" full method name "\\n"
                     hex SHA-256 of the serialized request bytes as sent

so a captured header is good for that one request only, within the window. Every refusal says
the same "invalid access key or signature" whatever the cause, except a missing header and a
date outside the window (neither tells anything about keys).
"""

from __future__ import annotations

import calendar
import hmac
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from hashlib import sha1, sha256
from typing import TYPE_CHECKING, Any

from libstore.errors import AuthenticationError

if TYPE_CHECKING:
    from services.gateway.acl import AccessControl, Account

V2_SCHEME = "MQv2-HMAC-SHA1"
OWN_SCHEME = "MQSTORE-HMAC-SHA256"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_REFUSED = "invalid access key or signature"


def metadata_dict(pairs: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """gRPC invocation metadata as a dict of text values (binary values as latin-1), the form
    the authenticate functions take."""
    return {k: v if isinstance(v, str) else v.decode("latin-1") for k, v in pairs or ()}


def format_date(now_s: float | None = None) -> str:
    """``now_s`` (seconds since the epoch; now when None) as a UTC ``x-mq-date-time``."""
    return time.strftime(DATE_FORMAT, time.gmtime(time.time() if now_s is None else now_s))


def request_digest(request: bytes) -> str:
    """Hex SHA-256 of a serialized request, as the own API's signature covers it."""
    return sha256(request).hexdigest()


def own_string_to_sign(date_time: str, method: str, digest: str) -> bytes:
    """What the own API's signature covers (module doc): date, method and ``digest``
    (:func:`request_digest` of the request bytes)."""
    return f"{OWN_SCHEME}\n{date_time}\n{method}\n{digest}".encode()


def sign_own_request(
    access_key: str, secret_key: str, method: str, request: bytes, now_s: float | None = None
) -> list[tuple[str, str]]:
    """The metadata that signs one own-API call: ``method`` is the full name
    (``/mqstore.v1.Gateway/Produce``), ``request`` the exact serialized bytes sent."""
    date_time = format_date(now_s)
    to_sign = own_string_to_sign(date_time, method, request_digest(request))
    mac = hmac.new(secret_key.encode(), to_sign, sha256).hexdigest()
    return [
        (DATE_HEADER, date_time),
        (
            "authorization",
            f"{OWN_SCHEME} Credential={access_key}, SignedHeaders={DATE_HEADER}, Signature={mac}",
        ),
    ]


def _fields(header: str, scheme: str) -> dict[str, str]:
    got, _, rest = header.partition(" ")
    if got != scheme:
        raise AuthenticationError(f"calls must be signed: an authorization header using {scheme}")
    out: dict[str, str] = {}
    for part in rest.split(","):
        key, _, value = part.strip().partition("=")
        out[key] = value.strip()
    if out.get("SignedHeaders", "").lower() != DATE_HEADER:
        raise AuthenticationError(f"the signature must cover {DATE_HEADER} (SignedHeaders={DATE_HEADER})")
    return out


def _date_s(text: str) -> int:
    try:
        return calendar.timegm(time.strptime(text, DATE_FORMAT))
    except ValueError:
        shown = text[:40]
        raise AuthenticationError(f"{DATE_HEADER} must look like 20260101T120000Z, got {shown!r}") from None


def _check_window(date_s: int, now_s: float, skew_s: int, offsets: tuple[int, ...]) -> None:
    """``date_s`` must be within ``skew_s`` of now as seen at one of ``offsets`` (seconds east
    of UTC). Raises AuthenticationError."""
    if not any(abs(date_s - (now_s + off)) <= skew_s for off in offsets):
        raise AuthenticationError(
            f"the signature's {DATE_HEADER} is more than {skew_s} s away from the server's clock "
            "(expired, or the clocks disagree)"
        )


def _account(acl: AccessControl, access_key: str, signed: bytes, signature: str, digest: Any) -> Account:
    """The account whose secret gives ``signature`` over ``signed``; the same refusal for an
    unknown key and a wrong signature (an unknown key still costs one HMAC)."""
    account = acl.account(access_key)
    secret = account.secret_key if account is not None else "\0unknown"
    expected = hmac.new(secret.encode(), signed, digest).hexdigest()
    if not hmac.compare_digest(expected, signature.lower()) or account is None:
        raise AuthenticationError(_REFUSED)
    return account


def local_utc_offset_s(now_s: float) -> int:
    """This server's offset from UTC at ``now_s``, seconds east."""
    offset = datetime.fromtimestamp(now_s).astimezone().utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def authenticate_v2(acl: AccessControl, metadata: Mapping[str, str], now_s: float | None = None) -> Account:
    """The account that signed a RocketMQ 5 call (``metadata``: lower-case header names).
    Raises AuthenticationError."""
    now = time.time() if now_s is None else now_s
    fields = _fields(metadata.get("authorization", ""), V2_SCHEME)
    date_time = metadata.get(DATE_HEADER, "")
    offsets = (0, local_utc_offset_s(now), *acl.client_utc_offsets)
    _check_window(_date_s(date_time), now, acl.clock_skew_s, offsets)
    return _account(acl, fields.get("Credential", ""), date_time.encode(), fields.get("Signature", ""), sha1)


def authenticate_own(
    acl: AccessControl, metadata: Mapping[str, str], method: str, digest: str, now_s: float | None = None
) -> Account:
    """The account that signed an own-API call of ``method`` whose serialized request has
    :func:`request_digest` ``digest``. Raises AuthenticationError."""
    now = time.time() if now_s is None else now_s
    fields = _fields(metadata.get("authorization", ""), OWN_SCHEME)
    date_time = metadata.get(DATE_HEADER, "")
    _check_window(_date_s(date_time), now, acl.clock_skew_s, (0,))
    to_sign = own_string_to_sign(date_time, method, digest)
    return _account(acl, fields.get("Credential", ""), to_sign, fields.get("Signature", ""), sha256)
