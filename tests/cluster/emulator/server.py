"""Running the emulator: a background thread with its own event loop, and a kubeconfig for it."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.emulator.cluster import ClusterEmulator
from tests.cluster.emulator.kmock_adapter import start_server


@dataclass
class EmulatorThread:
    """Runs a ClusterEmulator on 127.0.0.1 in a background thread with its own event loop."""

    emulator: ClusterEmulator = field(default_factory=ClusterEmulator)
    port: int = 0
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EmulatorThread:
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                async with self.emulator, start_server(self.emulator) as server:
                    self.port = server.port
                    ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # surfaced by start()
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure or not self.port:
            raise RuntimeError(f"emulator did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)

    def write_kubeconfig(self, path: str | Path, server: str | None = None) -> Path:
        """A kubeconfig whose only context points at this emulator (token auth, plain HTTP)."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server or self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
            ],
            "current-context": "emulator",
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path
