"""The mqstore CLI against a running suite: a produce/consume/query round, and bad input giving a
one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from libstore import BrokerRole
from services.cli import initial_broker_role
from services.serve import Suite
from tests.service.harness import REPO, refusing_address


def mqstore(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_produce_consume_query_progress_and_stats(embedded: Suite, tmp_path: Path):
    gw = embedded.address
    created = mqstore("topic", "create", "CliTopic", "--queues", "4", "-a", gw)
    assert created.returncode == 0 and "4 queues" in created.stdout
    sent = mqstore(
        "produce", "--topic", "CliTopic", "--count", "200", "--size", "64", "--key-prefix", "cli", "-a", gw
    )
    assert sent.returncode == 0, sent.stderr
    assert "sent 200 messages" in sent.stdout
    lines = mqstore(
        "produce", "--topic", "CliTopic", "--stdin", "--tags", "line", "-a", gw, stdin="alpha\nbeta\n"
    )
    assert lines.returncode == 0 and "sent 2 messages" in lines.stdout
    out = tmp_path / "consumed.jsonl"
    got = mqstore(
        "consume",
        "--group",
        "cli",
        "--topic",
        "CliTopic",
        "--output",
        str(out),
        "--idle-exit-ms",
        "1500",
        "-a",
        gw,
    )
    assert got.returncode == 0, got.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 202 and {r["body"] for r in rows if r["tags"] == "line"} == {"alpha", "beta"}
    found = mqstore("query", "--topic", "CliTopic", "--key", "cli-42", "-a", gw)
    assert found.returncode == 0 and "cli-42" in found.stdout
    progress = mqstore("progress", "--group", "cli", "--topic", "CliTopic", "-a", gw)
    assert progress.returncode == 0 and "lag 0" in progress.stdout
    stats = mqstore("stats", "-a", gw)
    assert stats.returncode == 0 and "CommitLog max offset" in stats.stdout
    assert "disk used (as df)" in stats.stdout and "last cleanup" in stats.stdout
    listed = mqstore("topic", "list", "-a", gw)
    assert "CliTopic" in listed.stdout


def test_topic_retention_update_and_delete(embedded: Suite) -> None:
    gw = embedded.address
    created = mqstore("topic", "create", "Keep3d", "--queues", "2", "--retention-hours", "72", "-a", gw)
    assert created.returncode == 0 and "retention 72 h" in created.stdout
    updated = mqstore("topic", "update", "Keep3d", "--retention-hours", "1.5", "-a", gw)
    assert updated.returncode == 0 and "2 queues" in updated.stdout and "retention 1.5 h" in updated.stdout
    listed = mqstore("topic", "list", "-a", gw)
    assert any("Keep3d" in line and "1.5 h" in line for line in listed.stdout.splitlines())
    back = mqstore("topic", "update", "Keep3d", "--retention-hours", "0", "-a", gw)
    assert back.returncode == 0 and "store retention" in back.stdout
    volatile = mqstore("topic", "update", "Keep3d", "--durability", "transient", "-a", gw)
    assert volatile.returncode == 0 and "2 queues" in volatile.stdout and "transient" in volatile.stdout
    rows = mqstore("topic", "list", "-a", gw).stdout.splitlines()
    assert any("Keep3d" in line and "transient" in line for line in rows)
    assert "durability must be persistent or transient" in _one_line_error(
        mqstore("topic", "create", "Odd", "--durability", "fleeting", "-a", gw)
    )
    assert "retention_hours must be within" in _one_line_error(
        mqstore("topic", "create", "Forever", "--retention-hours", "1e9", "-a", gw)
    )
    deleted = mqstore("topic", "delete", "Keep3d", "-a", gw)
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    again = mqstore("topic", "delete", "Keep3d", "-a", gw)
    assert again.returncode == 1 and "does not exist" in again.stdout
    assert "Keep3d" not in mqstore("topic", "list", "-a", gw).stdout
    missing = mqstore("topic", "update", "Nope", "--retention-hours", "1", "-a", gw)
    assert missing.returncode == 1 and "does not exist" in missing.stdout
    assert "system topic" in _one_line_error(mqstore("topic", "delete", "rmq_sys_wheel_timer", "-a", gw))


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_bad_input_is_one_line_and_a_non_zero_exit(embedded: Suite):
    gw = embedded.address
    assert "exactly one of" in _one_line_error(mqstore("query", "--topic", "T", "-a", gw))
    assert "does not exist" in _one_line_error(mqstore("query", "--topic", "Nope", "--key", "k", "-a", gw))
    assert "topic" in _one_line_error(mqstore("produce", "--topic", "bad topic", "--count", "1", "-a", gw))
    assert "unknown role" in _one_line_error(mqstore("serve", "--role", "bogus"))
    assert "key=value" in _one_line_error(mqstore("serve", "--set", "nonsense"))
    with refusing_address() as nobody:
        down = mqstore("stats", "-a", nobody)
        assert down.returncode == 1 and f"{nobody} is not available" in _one_line_error(down)
        assert "cannot read" in _one_line_error(
            mqstore("produce", "--topic", "T", "--file", "/no/such/file", "-a", gw)
        )
        assert "host:port" in _one_line_error(mqstore("ha", "demote", "--master", "nonsense", "-c", nobody))
        assert "ASYNC_MASTER or SYNC_MASTER" in _one_line_error(mqstore("ha", "promote", "--role", "SLAVE"))
        ha_down = mqstore("ha", "state", "-c", nobody)
        assert ha_down.returncode == 1 and "not available" in _one_line_error(ha_down)
    assert "--ha-peers" in _one_line_error(mqstore("serve", "--role", "commitlog", "--ha-peers", "a,b"))
    assert "--master-role takes" in _one_line_error(mqstore("serve", "--master-role", "SLAVE"))
    # A member that names its peers hands them its addresses before it binds: no port 0 there.
    peer = ["serve", "--role", "commitlog", "--ha-peers", "127.0.0.1:20911"]
    assert "--listen 127.0.0.1:0: with --ha-peers" in _one_line_error(
        mqstore(*peer, "--listen", "127.0.0.1:0")
    )
    assert "--ha-listen 127.0.0.1:0" in _one_line_error(
        mqstore(*peer, "--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:10911")
    )
    assert "holds no CommitLog file" in _one_line_error(mqstore("spark", "verify", str(REPO / "k8s")))


def test_master_role_picks_the_start_role_by_broker_id() -> None:
    """One StatefulSet pod template for a broker group: id 0 starts as the master role given,
    the others as SLAVE; an explicit --broker-role wins; without either, the store setting."""
    assert initial_broker_role(None, BrokerRole.SYNC_MASTER, 0) is BrokerRole.SYNC_MASTER
    assert initial_broker_role(None, BrokerRole.SYNC_MASTER, None) is BrokerRole.SYNC_MASTER
    assert initial_broker_role(None, BrokerRole.ASYNC_MASTER, 1) is BrokerRole.SLAVE
    assert initial_broker_role(BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER, 1) is BrokerRole.ASYNC_MASTER
    assert initial_broker_role(None, None, 1) is None


def test_stats_report_what_recovery_moved_to_quarantine(suites, tmp_path: Path):
    """A record damaged while the store was down: the restart cuts the log there, moves the
    rest aside, and ``mqstore stats`` says where and how much."""
    from libstore.mapped_file import offset_to_file_name
    from services.client import Admin, OutgoingMessage, Producer
    from tests.service.conftest import embedded_options

    root = tmp_path / "data"
    options = embedded_options(root)
    suite = suites.start(options)
    suites.wait_ready(suite)
    with Admin(suite.address) as admin:
        admin.create_topic("Q", 2)
    with Producer(suite.address) as producer:
        results = producer.send_batch([OutgoingMessage("Q", b"v" * 500) for _ in range(100)])
    suites.stop(suite)
    bad = results.phy_offsets[60]
    with open(root / "commitlog" / "commitlog" / offset_to_file_name(0), "r+b") as fh:
        fh.seek(bad + 300)
        fh.write(b"\xff")
    # A clean restart checks only the last record (config/cleanEnd.json); without that file it
    # validates the last segments, as after a shutdown by an older version.
    (root / "commitlog" / "config" / "cleanEnd.json").unlink()
    suite = suites.start(options)
    suites.wait_ready(suite)
    stats = mqstore("stats", "-a", suite.address)
    assert stats.returncode == 0, stats.stderr
    quarantine = root / "commitlog" / "quarantine"
    (event,) = quarantine.iterdir()
    (piece,) = event.iterdir()
    assert (
        int(piece.name) == bad and piece.stat().st_size == results.phy_offsets[99] + results.sizes[99] - bad
    )
    assert f"1 files, {piece.stat().st_size:,} bytes in {quarantine}" in " ".join(stats.stdout.split())
    with Admin(suite.address) as admin:
        assert admin.store_stats().commit_log_max_offset == bad
