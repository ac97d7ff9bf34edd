"""ServiceThread: a named background loop that can be woken early and drained on shutdown.

RocketMQ's ``ServiceThread`` contract: :meth:`wakeup` sets a flag; :meth:`wait_for_running`
returns at once when the flag is set, else waits up to the interval; either way it clears the
flag and calls :meth:`on_wait_end` (where request lists are swapped). Subclasses implement
:meth:`run_loop` (one iteration) and optionally :meth:`on_shutdown` (the final drain).
An exception escaping the loop is logged and handed to :meth:`on_error`; the thread then stops.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class ServiceThread:
    """Base of the store's background services (flush, commit, allocation, snapshots)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def wait_for_running(self, interval_ms: float) -> None:
        if not self._wake.is_set():
            self._wake.wait(interval_ms / 1000.0)
        self._wake.clear()
        self.on_wait_end()

    def on_wait_end(self) -> None:
        """Hook run after every wait (RocketMQ swaps request lists here)."""

    def run_loop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_shutdown(self) -> None:
        """Hook run once in the thread after the loop ends (final drain)."""

    def on_error(self, exc: BaseException) -> None:
        """Hook for an exception that escaped :meth:`run_loop`; the thread stops afterwards."""

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the loop, let it drain, and join the thread (at most ``timeout_s`` seconds)."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("%s did not stop within %.1f s", self.name, timeout_s)

    def _main(self) -> None:
        try:
            while not self._stopped.is_set():
                self.run_loop()
            self.on_shutdown()
        except BaseException as exc:
            log.exception("%s failed", self.name)
            self.on_error(exc)
