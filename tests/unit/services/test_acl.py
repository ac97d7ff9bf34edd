"""Accounts, signatures and their window (services.gateway.acl, services.gateway.signature),
and who may end a client's Telemetry streams (services.gateway.rocketmq.sessions)."""

from __future__ import annotations

import hmac
import time
from hashlib import sha1
from pathlib import Path

import pytest

from libstore import AuthenticationError, ConfigError, PermissionDeniedError
from services.gateway.acl import PUB, SUB, AccessControl, Account, parse_utc_offset
from services.gateway.rocketmq.sessions import ClientSessions
from services.gateway.signature import (
    authenticate_own,
    authenticate_v2,
    local_utc_offset_s,
    request_digest,
    sign_own_request,
)

NOW = 1_790_000_000.0


def _acl(tmp_path: Path, extra: str = "") -> AccessControl:
    path = tmp_path / "plain_acl.yml"
    path.write_text(
        extra
        + """
accounts:
  - accessKey: app
    secretKey: app-secret
    topicPerms: [Orders=PUB|SUB]
    groupPerms: [billing=SUB]
"""
    )
    return AccessControl.load(path)


def _v2(ak: str, sk: str, stamp: str) -> dict[str, str]:
    sig = hmac.new(sk.encode(), stamp.encode(), sha1).hexdigest()
    return {
        "x-mq-date-time": stamp,
        "authorization": f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}",
    }


def _stamp(seconds: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(seconds))


def test_groups_are_denied_unless_given_and_store_topics_are_for_admins(tmp_path: Path) -> None:
    account = _acl(tmp_path).account("app")
    assert account is not None
    assert account.may(SUB, "Orders", "billing") and not account.may(SUB, "Orders", "someone-else")
    assert not account.may(SUB, "RMQ_SYS_TRANS_HALF_TOPIC") and not account.may(SUB, "rmq_sys_wheel_timer")
    assert account.may(SUB, "%DLQ%billing") and account.may(SUB, "%RETRY%billing")
    assert not account.may(PUB, "%DLQ%billing") and not account.may(SUB, "%DLQ%other")
    admin = Account("root", "s", admin=True)
    assert admin.may(SUB, "RMQ_SYS_TRANS_HALF_TOPIC", "any")
    with pytest.raises(PermissionDeniedError, match="as group someone-else"):
        AccessControl.authorize(account, SUB, "Orders", "someone-else")
    with pytest.raises(PermissionDeniedError, match="admin only"):
        AccessControl.require_admin(account, "create topics")


def test_a_v2_signature_is_good_only_within_the_window(tmp_path: Path) -> None:
    acl = _acl(tmp_path, "clockSkewSeconds: 60\n")
    local = local_utc_offset_s(NOW)
    assert authenticate_v2(acl, _v2("app", "app-secret", _stamp(NOW + local)), NOW).access_key == "app"
    assert authenticate_v2(acl, _v2("app", "app-secret", _stamp(NOW + 59)), NOW).access_key == "app"  # UTC
    for stamp in (_stamp(NOW + local + 3600), "20000101T000000Z", "not-a-date", ""):
        with pytest.raises(AuthenticationError):
            authenticate_v2(acl, _v2("app", "app-secret", stamp), NOW)


def test_a_client_in_another_time_zone_is_accepted_once_its_offset_is_listed(tmp_path: Path) -> None:
    away = local_utc_offset_s(NOW) + 5 * 3600  # neither UTC nor this server's zone
    sign = f"{'+' if away >= 0 else '-'}{abs(away) // 3600:02d}:{abs(away) % 3600 // 60:02d}"
    stamp = _stamp(NOW + away)
    with pytest.raises(AuthenticationError, match="away from the server's clock"):
        authenticate_v2(_acl(tmp_path), _v2("app", "app-secret", stamp), NOW)
    listed = _acl(tmp_path, f'clientUtcOffsets: ["{sign}"]\n')
    assert authenticate_v2(listed, _v2("app", "app-secret", stamp), NOW).access_key == "app"


def test_unknown_keys_and_wrong_secrets_get_the_same_answer(tmp_path: Path) -> None:
    acl = _acl(tmp_path)
    stamp = _stamp(NOW)
    messages = set()
    for ak, sk in (("nobody", "app-secret"), ("app", "guess")):
        with pytest.raises(AuthenticationError) as v2:
            authenticate_v2(acl, _v2(ak, sk, stamp), NOW)
        with pytest.raises(AuthenticationError) as own:
            md = dict(sign_own_request(ak, sk, "/mqstore.v1.Gateway/Pull", b"req", now_s=NOW))
            authenticate_own(acl, md, "/mqstore.v1.Gateway/Pull", request_digest(b"req"), NOW)
        messages |= {str(v2.value), str(own.value)}
    assert messages == {"invalid access key or signature"}


def test_an_own_api_signature_binds_method_request_and_date(tmp_path: Path) -> None:
    acl = _acl(tmp_path)
    method = "/mqstore.v1.Gateway/Produce"
    md = dict(sign_own_request("app", "app-secret", method, b"request", now_s=NOW))
    assert authenticate_own(acl, md, method, request_digest(b"request"), NOW).access_key == "app"
    for other_method, body, now in (
        ("/mqstore.v1.Gateway/Pull", b"request", NOW),
        (method, b"requesT", NOW),
        (method, b"request", NOW + 901),
    ):
        with pytest.raises(AuthenticationError):
            authenticate_own(acl, md, other_method, request_digest(body), now)
    v2_header = _v2("app", "app-secret", _stamp(NOW))  # the date-only scheme is not enough here
    with pytest.raises(AuthenticationError, match="MQSTORE-HMAC-SHA256"):
        authenticate_own(acl, v2_header, method, request_digest(b"request"), NOW)


def test_bad_settings_are_refused_with_the_reason(tmp_path: Path) -> None:
    assert parse_utc_offset("+08:00") == 8 * 3600 and parse_utc_offset("-0530") == -(5 * 3600 + 1800)
    for bad in ("8", "+15:00", "+08:75", "UTC"):
        with pytest.raises(ConfigError):
            parse_utc_offset(bad)
    with pytest.raises(ConfigError, match="clockSkewSeconds"):
        _acl(tmp_path, "clockSkewSeconds: soon\n")
    with pytest.raises(ConfigError, match="clientUtcOffsets"):
        _acl(tmp_path, "clientUtcOffsets: '+08:00'\n")


def test_a_termination_ends_only_the_streams_its_account_opened() -> None:
    sessions = ClientSessions()
    victim = sessions.open("client-1", owner="app")
    assert sessions.drop("client-1", owner="intruder") == 0
    assert sessions.has_client("client-1") and victim.outbox.empty()
    assert sessions.drop("client-1", owner="app") == 1
    assert not sessions.has_client("client-1") and victim.outbox.get_nowait() is None


def test_secrets_stay_out_of_reprs_and_errors(tmp_path: Path) -> None:
    acl = _acl(tmp_path)
    assert "app-secret" not in repr(acl.account("app"))
    bad = tmp_path / "broken.yml"
    bad.write_text('accounts:\n  - accessKey: app\n    secretKey: "TOPSECRET-abc123\n    admin: true\n')
    with pytest.raises(ConfigError) as info:
        AccessControl.load(bad)
    assert "TOPSECRET" not in str(info.value) and "not valid YAML" in str(info.value)


def test_another_accounts_streams_under_a_client_id_do_not_use_up_its_share() -> None:
    from libstore.errors import TooManyRequestsError

    sessions = ClientSessions(max_streams=2)
    for _ in range(2):
        sessions.open("client-1", owner="intruder")
    with pytest.raises(TooManyRequestsError):
        sessions.open("client-1", owner="intruder")
    assert sessions.open("client-1", owner="app").owner == "app"  # the real client still gets in
