"""The engine process (API_SERVERS > 1): the model repository, live control, the batchers and the
sessions of one device, serving the front ends over a Unix socket (app/engine/wire.py).

    python -m app.engine.process SOCKET      (started by app/serve.py, never by hand)

Each front end connects, gets the model table, and sends EngineRequests (answered in any order,
by request id), Aborts, Acks and Admin calls. The table is sent again after every change; a
version leaves service only once every front end has acknowledged the table without it, so no
front end answers from it afterwards, and its batcher runs until the requests they sent it are
answered. A front end whose connection drops has its queued requests dropped. SIGTERM: stop taking
connections, drain the batchers, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
from typing import Any

from app.engine import wire
from app.engine.client import Engine
from app.engine.control import ModelControl
from app.engine.heap import fix_malloc_mmap_threshold
from app.engine.protocol import EngineRequest
from app.engine.registry import Registry
from app.observe.logs import configure_logging, flush_logs
from app.observe.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("app.engine")


def table_of(registry: Registry, serial: int) -> wire.Table:
    rows = []
    for model in registry.models.values():
        facts = None
        bundle = model.current
        if bundle is not None:
            runtime, batcher = bundle.runtime, bundle.batcher
            facts = wire.VersionFacts(
                version=bundle.version,
                path=str(bundle.path),
                digest=bundle.digest,
                variant=bundle.variant,
                variant_reason=bundle.variant_reason,
                device=bundle.device,
                threads=bundle.threads,
                load_seconds=bundle.load_seconds,
                memory_bytes=bundle.memory_bytes,
                provider=runtime.provider if runtime else None,
                providers=list(runtime.providers) if runtime else [],
                instances=runtime.instances if runtime else None,
                solo_threads=runtime.solo_threads if runtime else None,
                max_batch_tokens=batcher.max_batch_tokens if batcher else None,
                max_padding_factor=batcher.max_padding_factor if batcher else None,
            )
        rows.append(
            wire.ModelRow(
                model.name,
                model.task,
                model.status,
                model.error,
                model.reranker,
                list(model.history),
                facts,
                model.required,
            )
        )
    return wire.Table(serial, rows, dict(registry.default_names), registry.device, registry.load_finished)


class FrontEnd:
    """One connected front end: its writer, the table it acknowledged, its requests in flight."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.acked = -1
        self.acked_event = asyncio.Event()
        self.tasks: dict[int, asyncio.Task] = {}
        self.lock = asyncio.Lock()

    async def send(self, message: Any) -> None:
        async with self.lock:
            await wire.send(self.writer, message)


class EngineServer:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.registry = Registry(settings, self.metrics)
        self.engine = Engine()
        self.control = ModelControl(self.registry, self.engine, before_retire=self.publish_and_wait)
        self.front_ends: set[FrontEnd] = set()
        self.serial = itertools.count(1)
        self.last_serial = 0
        self._published = ""

    async def publish(self) -> int:
        """Send the table to every front end if it changed; its serial."""
        serial = next(self.serial)
        table = table_of(self.registry, serial)
        self.last_serial = serial
        for front in list(self.front_ends):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await front.send(table)
        return serial

    async def publish_and_wait(self) -> None:
        """Publish the table, and wait until every front end connected now has applied it (their
        requests on versions it drops are answered), up to SHUTDOWN_GRACE_S."""
        serial = await self.publish()
        deadline = asyncio.get_running_loop().time() + self.settings.shutdown_grace_s
        for front in list(self.front_ends):
            while front.acked < serial and front in self.front_ends:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    log.warning("a front end did not acknowledge the model table in time")
                    return
                front.acked_event.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(front.acked_event.wait(), left)

    async def watch(self) -> None:
        """Publish whenever the table changes (loads in the background, MODEL_POLL_S)."""
        while True:
            await asyncio.sleep(0.2)
            snapshot = repr(table_of(self.registry, 0))
            if snapshot != self._published:
                self._published = snapshot
                await self.publish()

    async def serve_front_end(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        front = FrontEnd(writer)
        self.front_ends.add(front)
        try:
            await front.send(table_of(self.registry, self.last_serial))
            while True:
                message = await wire.receive(reader)
                if isinstance(message, wire.Call) and isinstance(message.message, EngineRequest):
                    call_id = message.call_id
                    task = asyncio.create_task(self.infer(front, call_id, message.message))
                    front.tasks[call_id] = task
                    task.add_done_callback(lambda _, call_id=call_id: front.tasks.pop(call_id, None))
                elif isinstance(message, wire.Call) and isinstance(message.message, wire.Admin):
                    asyncio.create_task(self.admin(front, message.call_id, message.message))
                elif isinstance(message, wire.Abort):
                    task = front.tasks.get(message.call_id)
                    if task is not None:
                        task.cancel()
                elif isinstance(message, wire.Ack):
                    front.acked = max(front.acked, message.serial)
                    front.acked_event.set()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the front end went away, or the engine is stopping
        finally:
            self.front_ends.discard(front)
            front.acked_event.set()
            for task in list(front.tasks.values()):
                task.cancel()  # its clients are gone with it: drop their queued work
            writer.close()

    async def infer(self, front: FrontEnd, call_id: int, request: EngineRequest) -> None:
        try:
            reply: Any = await self.engine.infer(request)
        except asyncio.CancelledError:
            return
        except Exception as error:  # noqa: BLE001 - every failure goes back as its code
            reply = wire.failure_of(error)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await front.send(wire.Call(call_id, reply))

    async def admin(self, front: FrontEnd, call_id: int, call: wire.Admin) -> None:
        try:
            if call.op == "load":
                model, changed = await self.control.load(call.name)
                result: dict[str, Any] = {"name": model.name, "changed": changed}
            elif call.op == "unload":
                model, waited = await self.control.unload(call.name)
                result = {"name": model.name, "waited": waited}
            else:
                result = await self.control.poll()
            await self.publish_and_wait()  # acknowledged everywhere before the admin call answers
            message: Any = wire.AdminDone(self.last_serial, result)
        except Exception as error:  # noqa: BLE001
            message = wire.failure_of(error)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await front.send(wire.Call(call_id, message))

    async def run(self, path: str) -> None:
        self.registry.discover()
        fix_malloc_mmap_threshold(self.settings.malloc_mmap_threshold)
        server = await asyncio.start_unix_server(self.serve_front_end, path)
        os.chmod(path, 0o600)
        loader = asyncio.create_task(self.control.run())
        watcher = asyncio.create_task(self.watch())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("engine serving", extra={"socket": path, "pid": os.getpid()})
        await stop.wait()
        # The front ends drain first (app/serve.py stops them before the engine); then the batchers.
        server.close()
        for task in (loader, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.control.close()
        log.info("engine stopped")


def main(argv: list[str]) -> int:
    settings = Settings()
    configure_logging(settings.log_level)
    try:
        asyncio.run(EngineServer(settings).run(argv[0]))
    finally:
        flush_logs()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
