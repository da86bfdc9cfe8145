"""A front end's side of the engine process (API_SERVERS > 1): the engine client over its socket,
the read-only model table its messages replace, and the admin API's calls to it.

The table: each engine Table message is applied in order, off the connection's reader (applying
waits for this process's requests on versions it drops, and their replies come over the same
connection). A newly serving version gets this process's own manifest, tokenizer and service (the
engine holds the sessions); a dropped one leaves the response cache; then the Ack. The engine
retires a version only when every front end acknowledged, so none answers from it afterwards.
If the connection drops, every request waiting on the engine fails (503) and /ready says so; the
supervisor (app/serve.py) exits then, for the orchestrator to restart the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.engine import wire
from app.engine.batch_types import Schedule
from app.engine.protocol import EngineReply, EngineRequest
from app.engine.table import Bundle, Model, ModelTable
from app.errors import ModelUnavailable
from app.settings import Settings
from export.bundle import load_bundle_manifest
from processing.tokenizer import TextTokenizer

log = logging.getLogger("app.remote")


class RemoteEngine:
    def __init__(self, path: str, table: FrontTable):
        self.path = path
        self.table = table
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._tables: asyncio.Queue[wire.Table] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self.connected = asyncio.Event()
        self.lost = False

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path, limit=wire.MAX_FRAME)
        self._tasks = [asyncio.create_task(self._read(reader)), asyncio.create_task(self._apply_tables())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writer is not None:
            self._writer.close()

    async def _send(self, message: Any) -> None:
        if self._writer is None or self.lost:
            raise ModelUnavailable("the engine process is not reachable")
        async with self._lock:
            await wire.send(self._writer, message)

    async def _call(self, message: Any, call_id: int) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await self._send(wire.Call(call_id, message))
            answer = await future
        finally:
            self._pending.pop(call_id, None)
        if isinstance(answer, wire.Failure):
            raise wire.error_of(answer)
        return answer

    async def infer(self, request: EngineRequest, schedule: Schedule | None = None) -> EngineReply:
        """The request in one frame (`schedule` stays here: its deadline and priority are in the
        request's fields)."""
        call_id = next(self._calls)
        try:
            return await self._call(request, call_id)
        except asyncio.CancelledError:  # the client went away: the engine drops what is queued
            with contextlib.suppress(Exception):
                await self._send(wire.Abort(call_id))
            raise

    async def admin(self, op: str, name: str = "") -> dict[str, Any]:
        """An admin call, answered once every front end has applied its effect (this one included)."""
        call_id = next(self._calls)
        done: wire.AdminDone = await self._call(wire.Admin(op, name), call_id)
        await self.table.applied(done.serial)
        return done.result

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await wire.receive(reader)
                if isinstance(message, wire.Table):
                    self._tables.put_nowait(message)
                elif isinstance(message, wire.Call):
                    future = self._pending.get(message.call_id)
                    if future is not None and not future.done():
                        future.set_result(message.message)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            log.error("lost the engine process", extra={"error": repr(e)})
        finally:
            self.lost = True
            self.table.engine_lost = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ModelUnavailable("the engine process went away"))

    async def _apply_tables(self) -> None:
        while True:
            table = await self._tables.get()
            await self.table.apply(table)
            self.connected.set()
            with contextlib.suppress(Exception):
                await self._send(wire.Ack(table.serial))


class FrontTable(ModelTable):
    """The engine's model table as this front end serves it: read-only, replaced by Table messages."""

    def __init__(
        self,
        settings: Settings,
        make_service: Callable[[Bundle], Any],
        on_retired: Callable[[str, str], None] | None,
    ):
        super().__init__(settings)
        self.make_service = make_service
        self.on_retired = on_retired
        self.serial = -1
        self.engine_lost = False
        self._applied = asyncio.Condition()

    def readiness(self) -> tuple[bool, str, dict[str, str], dict[str, str]]:
        if self.engine_lost:
            return False, "failed", {}, {"engine": "the engine process is not reachable"}
        return super().readiness()

    async def applied(self, serial: int) -> None:
        async with self._applied:
            await self._applied.wait_for(lambda: self.serial >= serial)

    async def apply(self, table: wire.Table) -> None:
        dropped: list[Bundle] = []
        for row in table.models:
            model = self.models.get(row.name) or Model(row.name)
            current = model.current
            facts = row.current
            if facts is None:
                model.current = None
            elif current is None or (current.version, str(current.path)) != (facts.version, facts.path):
                model.current = await asyncio.to_thread(self._version, row.name, facts)
                model.current.service = self.make_service(model.current)
            else:
                _copy_facts(current, facts)
            if current is not None and model.current is not current:
                dropped.append(current)
            model.task, model.status, model.error = row.task, row.status, row.error
            model.reranker, model.history, model.required = row.reranker, row.history, row.required
            self.models[row.name] = model
        for name in set(self.models) - {row.name for row in table.models}:
            gone = self.models.pop(name)
            if gone.current is not None:
                dropped.append(gone.current)
        self.default_names, self.device, self.load_finished = (
            table.default_names,
            table.device,
            table.load_finished,
        )
        for bundle in dropped:  # its requests here finish before the engine may retire it
            if bundle.leases > 0:
                bundle.idle = asyncio.Event()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(bundle.idle.wait(), self.settings.shutdown_grace_s)
            if self.on_retired is not None:
                self.on_retired(bundle.name, bundle.version)
        async with self._applied:
            self.serial = table.serial
            self._applied.notify_all()

    @staticmethod
    def _version(name: str, facts: wire.VersionFacts) -> Bundle:
        path = Path(facts.path)
        bundle = Bundle(name, facts.version, path, load_bundle_manifest(path), facts.digest)
        bundle.tokenizer = TextTokenizer.from_dir(path)
        _copy_facts(bundle, facts)
        return bundle


def _copy_facts(bundle: Bundle, facts: wire.VersionFacts) -> None:
    """The engine's facts of the version, for /models: the sessions and batcher are the engine's."""
    bundle.variant, bundle.device, bundle.threads = facts.variant, facts.device, facts.threads
    bundle.variant_reason = facts.variant_reason
    bundle.load_seconds, bundle.memory_bytes = facts.load_seconds, facts.memory_bytes
    bundle.runtime = SimpleNamespace(
        provider=facts.provider,
        providers=facts.providers,
        instances=facts.instances,
        solo_threads=facts.solo_threads,
    )
    bundle.batcher = SimpleNamespace(
        max_batch_tokens=facts.max_batch_tokens, max_padding_factor=facts.max_padding_factor
    )


class RemoteControl:
    """The admin API's ModelControl in a front end: the engine does it; this waits for the table."""

    def __init__(self, engine: RemoteEngine, table: FrontTable):
        self.engine, self.table = engine, table

    async def load(self, name: str) -> tuple[Model, bool]:
        result = await self.engine.admin("load", name)
        return self.table.models[result["name"]], result["changed"]

    async def unload(self, name: str) -> tuple[Model, float]:
        result = await self.engine.admin("unload", name)
        return self.table.models[result["name"]], result["waited"]

    async def poll(self) -> dict[str, Any]:
        return await self.engine.admin("poll")

    async def close(self) -> None:
        await self.engine.close()
