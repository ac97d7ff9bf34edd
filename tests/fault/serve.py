"""``mqstore serve`` with a durability recorder installed (tests/fault/powerloss.py), for the
fault loop: ``python -m tests.fault.serve <member root> <shadow root> <serve arguments>``."""

from __future__ import annotations

import sys
from pathlib import Path

from libstore import durability_hooks
from tests.fault.powerloss import DurabilityRecorder


def main() -> None:
    member_root, shadow_root, *serve_args = sys.argv[1:]
    durability_hooks.install(DurabilityRecorder(Path(member_root), Path(shadow_root)))
    from services.cli import main as cli_main

    sys.argv = ["mqstore", "--verbose", "serve", *serve_args]
    cli_main()


if __name__ == "__main__":
    main()
