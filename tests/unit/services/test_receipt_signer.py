"""Signed receipt handles (services.dispatch.receipt_signer): a handle verifies only for the
group and topic it was issued for, unaltered, under the broker group's key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from libstore import ConfigError
from libstore.errors import InvalidReceiptHandleError
from services.dispatch.receipt_signer import DEFAULT_KEY_PATH, ReceiptSigner

HANDLE = "p1:0:41:7:1790000000000:1:12345:210"


def test_a_handle_verifies_only_as_issued(tmp_path: Path) -> None:
    signer = ReceiptSigner.load(tmp_path)
    signed = signer.sign("billing", "Orders", HANDLE)
    assert signer.verify("billing", "Orders", signed) == HANDLE
    forged = [
        HANDLE,  # unsigned, as handles used to be
        signed.replace(":41:", ":42:"),  # another message's offset under the same tag
        signed[:-1] + ("0" if signed[-1] != "0" else "1"),
        "",
    ]
    for text in forged:
        with pytest.raises(InvalidReceiptHandleError):
            signer.verify("billing", "Orders", text)
    for group, topic in (("other", "Orders"), ("billing", "Other")):
        with pytest.raises(InvalidReceiptHandleError):
            signer.verify(group, topic, signed)


def test_the_key_is_made_once_private_and_shared_through_a_file(tmp_path: Path) -> None:
    first = ReceiptSigner.load(tmp_path / "a")
    key_path = tmp_path / "a" / DEFAULT_KEY_PATH
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    again = ReceiptSigner.load(tmp_path / "a")  # a restart keeps its handles valid
    signed = first.sign("g", "T", HANDLE)
    assert again.verify("g", "T", signed) == HANDLE
    with pytest.raises(InvalidReceiptHandleError):  # another dispatch's own key
        ReceiptSigner.load(tmp_path / "b").verify("g", "T", signed)
    shared = ReceiptSigner.load(tmp_path / "b", key_file=key_path)  # the group's shared file
    assert shared.verify("g", "T", signed) == HANDLE
    raw = tmp_path / "raw.key"
    raw.write_bytes(os.urandom(32))
    assert ReceiptSigner.load(tmp_path / "c", raw).verify(
        "g", "T", ReceiptSigner(raw.read_bytes()).sign("g", "T", HANDLE)
    )
    short = tmp_path / "short.key"
    short.write_text("abcd")
    with pytest.raises(ConfigError, match="16 bytes"):
        ReceiptSigner.load(tmp_path / "d", short)
    with pytest.raises(ConfigError, match="cannot read"):
        ReceiptSigner.load(tmp_path / "d", tmp_path / "missing.key")
