"""The log writer thread: records keep their request context, a blocked stream never blocks the
caller, and what it had to drop is counted and said."""

from __future__ import annotations

import json
import logging
import re
import threading
import time

from app.observe.logs import JsonFormatter, LogWriter, QueuedHandler, new_request_id, request_id_var


class Collect(logging.Handler):
    def __init__(self, gate: threading.Event | None = None):
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict] = []
        self.gate = gate

    def emit(self, record: logging.LogRecord) -> None:
        if self.gate is not None:
            self.gate.wait()
        self.lines.append(json.loads(self.format(record)))


def logger_for(writer: LogWriter, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers = [QueuedHandler(writer)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_records_keep_request_id_message_and_traceback():
    writer = LogWriter()
    writer.handler = sink = Collect()
    log = logger_for(writer, "test.logs.context")
    token = request_id_var.set("req-7")
    try:
        log.info("served %s in %d ms", "/classify", 3, extra={"status": 200})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        request_id_var.reset(token)
    assert writer.flush()
    served, failed = sink.lines
    assert served["message"] == "served /classify in 3 ms" and served["request_id"] == "req-7"
    assert served["status"] == 200
    assert failed["request_id"] == "req-7" and "ValueError: boom" in failed["exc"]


def test_a_blocked_stream_drops_and_counts_instead_of_blocking():
    gate = threading.Event()
    writer = LogWriter(capacity=2)
    writer.handler = sink = Collect(gate)
    log = logger_for(writer, "test.logs.blocked")
    started = time.perf_counter()
    for n in range(10):
        log.info("line %d", n)
    assert time.perf_counter() - started < 0.5  # the caller never waited for the stream
    gate.set()
    assert writer.flush()
    log.info("after")
    assert writer.flush()
    messages = [line["message"] for line in sink.lines]
    dropped = [line for line in sink.lines if line["message"].startswith("log records dropped")]
    assert len(dropped) == 1 and dropped[0]["level"] == "WARNING"
    written = [m for m in messages if m.startswith("line")]
    # At most one record in the writer's hands and two queued: the rest were dropped and counted.
    assert len(written) in (2, 3) and dropped[0]["dropped"] == 10 - len(written)
    assert written == [f"line {n}" for n in range(len(written))] and messages[-1] == "after"


def test_request_ids_are_kept_when_safe_and_otherwise_fresh_and_distinct():
    assert new_request_id("client-42.a:b") == "client-42.a:b"
    made = [new_request_id(incoming) for incoming in [None, "", "has space", "x" * 129] * 250]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in made)
    assert len(set(made)) == len(made)
