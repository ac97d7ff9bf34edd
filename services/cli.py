"""The ``mqstore`` command line (typer). Bad input gives a one-line error and exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from libstore import FlushDiskType, StoreError
from services.demo import default_data_dir, run_demo

app = typer.Typer(add_completion=False, no_args_is_help=True, help="mqstore: a RocketMQ-style message store")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """mqstore: a RocketMQ-style message store."""


@app.command()
def demo(
    data: Annotated[Path | None, typer.Option(help="store folder (default ./data/demo; wiped first)")] = None,
    messages: Annotated[int, typer.Option(min=1, help="messages to append")] = 100_000,
    queues: Annotated[int, typer.Option(min=1, max=1024, help="queues of the demo topic")] = 16,
    size: Annotated[int, typer.Option(min=1, max=4 * 1024 * 1024, help="body size in bytes")] = 1024,
    batch: Annotated[int, typer.Option(min=1, max=4096, help="messages per put")] = 256,
    flush: Annotated[FlushDiskType, typer.Option(help="flush disk type")] = FlushDiskType.ASYNC_FLUSH,
) -> None:
    """Append generated messages, reopen the store (recovery), read everything back."""
    folder = data or default_data_dir()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        tasks = {
            "append": bar.add_task("append", total=messages),
            "read": bar.add_task("read back", total=messages),
        }
        try:
            report = run_demo(
                folder,
                messages=messages,
                queues=queues,
                body_size=size,
                batch=batch,
                flush_disk_type=flush,
                progress=lambda phase, n: bar.advance(tasks[phase], n),
            )
        except StoreError as exc:
            raise _fail(str(exc)) from None
        bar.update(tasks["read"], completed=report.verified)
    table = Table(
        title=f"libstore demo: {report.messages:,} messages x {size} B, {queues} queues, {flush.value}"
    )
    table.add_column("phase")
    table.add_column("result", justify="right")
    mb = report.bytes_appended / 1e6
    table.add_row("append", f"{report.append_rate:,.0f} msgs/s, {mb / report.append_seconds:,.1f} MB/s")
    table.add_row(
        "recovery (reopen)",
        f"{report.recovery_seconds * 1000:,.0f} ms, "
        f"{report.recovery_files_scanned} of {report.segments} segments read",
    )
    table.add_row("read back + verify", f"{report.read_rate:,.0f} msgs/s ({report.verified:,} identical)")
    console.print(table)
    console.print(f"store folder: {folder}")


def _fail(message: str) -> typer.Exit:
    err_console.print(f"error: {message}")
    return typer.Exit(2)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
