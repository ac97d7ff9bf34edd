"""Running the official RocketMQ 5 client (tests/rocketmq/client_driver.py) in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).with_name("client_driver.py")


def start_driver(
    scenario: str, args: dict[str, Any], home: Path, env_extra: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start a driver process (HOME is ``home``: the client writes its logs under ~/logs;
    ``env_extra``: more environment variables)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HOME"] = str(home)
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, str(DRIVER), scenario, json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(home),
    )


def finish_driver(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> dict[str, Any]:
    """The JSON result of a driver process; AssertionError with its stderr when it failed."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"client driver timed out\n{err[-3000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"client driver failed ({proc.returncode})\n{out[-2000:]}\n{err[-4000:]}")
    return json.loads(lines[-1])


def run_driver(
    scenario: str,
    args: dict[str, Any],
    home: Path,
    timeout_s: float = 120.0,
    env_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    return finish_driver(start_driver(scenario, args, home, env_extra), timeout_s)
