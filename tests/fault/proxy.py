"""FaultProxy: a TCP proxy on 127.0.0.1 that the fault loop puts between a slave and its master's
replication endpoint, to stall, slow down or cut the stream. Runs on an asyncio loop of its own
thread; the control methods may be called from any thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class FaultProxy:
    """Forwards connections on ``listen_port`` to ``target`` ("host:port")."""

    def __init__(self, listen_port: int, target: str) -> None:
        self.listen_port = listen_port
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.delay_s = 0.0
        self._flowing: asyncio.Event | None = None
        self._refuse = False
        self._conns: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._conns |= {writer, up_writer}
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, up_writer):
                self._conns.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _call(self, fn: object) -> None:
        self._loop.call_soon_threadsafe(fn)  # type: ignore[arg-type]

    def stall(self) -> None:
        """Stop moving bytes (connections stay open; TCP backs up)."""
        assert self._flowing is not None
        self._call(self._flowing.clear)

    def resume(self) -> None:
        assert self._flowing is not None
        self._call(self._flowing.set)
        self.delay_s = 0.0
        self._refuse = False

    def slow(self, delay_s: float) -> None:
        """Hold each chunk ``delay_s`` before passing it on."""
        self.delay_s = delay_s

    def cut(self, refuse: bool = False) -> None:
        """Close every connection now; with ``refuse``, also refuse new ones until :meth:`resume`."""
        self._refuse = refuse

        def close_all() -> None:
            for w in list(self._conns):
                with contextlib.suppress(Exception):
                    w.transport.abort()

        self._call(close_all)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._conns):
                with contextlib.suppress(Exception):
                    w.transport.abort()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
