"""JSON logs, one object per line, carrying the request id of the request being served.

Records are formatted and written by one writer thread: the event loop only hands them over, so a
slow stderr (a full pipe to a stalled log collector) never stalls serving, and the access line of
every request costs the loop a queue put instead of a write syscall.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import queue
import random
import re
import threading
from contextvars import ContextVar
from datetime import datetime, timezone

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# Incoming X-Request-ID values are echoed into logs and headers: keep them short and plain.
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_HANDLER_MARK = "_bert_json_handler"


def new_request_id(incoming: str | None) -> str:
    if incoming and _SAFE_ID.match(incoming):
        return incoming
    # Unique, not secret: Mersenne Twister bits (seeded from os.urandom, reseeded in forked
    # workers) in uuid4().hex's shape, without its getrandom syscall per request.
    return f"{random.getrandbits(128):032x}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        # Captured by the handler on the logging thread; the writer thread has no request context.
        request_id = getattr(record, "_request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            # Tracebacks go to the logs only, never into responses.
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


class LogWriter:
    """A bounded queue of records and the daemon thread that writes them. When the queue is full
    (the stream blocks), records are dropped and counted, and the count is logged once it drains.
    A SimpleQueue: its put is one C call, where queue.Queue's takes two locks and a notify."""

    def __init__(self, capacity: int = 10_000):
        self.capacity = capacity
        self.queue: queue.SimpleQueue[logging.LogRecord | threading.Event] = queue.SimpleQueue()
        self.handler: logging.Handler = logging.StreamHandler()
        self._dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def put(self, record: logging.LogRecord) -> None:
        if self.queue.qsize() >= self.capacity:
            with self._lock:
                self._dropped += 1
            return
        self.queue.put(record)

    def _take_dropped(self) -> int:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def _run(self) -> None:
        while True:
            record = self.queue.get()
            if isinstance(record, threading.Event):  # a flush waiting for what came before it
                record.set()
                continue
            try:
                self.handler.handle(record)
                dropped = self._take_dropped()
                if dropped:  # said right after the record that held the stream up
                    self.handler.handle(
                        logging.makeLogRecord(
                            {
                                "name": "app.logs",
                                "levelno": logging.WARNING,
                                "levelname": "WARNING",
                                "msg": "log records dropped: the log stream did not keep up",
                                "dropped": dropped,
                            }
                        )
                    )
            except Exception:  # noqa: BLE001 - the writer thread must outlive a bad record
                pass

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every record queued so far is written (shutdown, tests); False on timeout."""
        written = threading.Event()
        self.queue.put(written)  # FIFO: set once everything before it is written
        return written.wait(timeout_s)


class QueuedHandler(logging.Handler):
    """Hands a record to the writer, with what the writer thread cannot see resolved first: the
    message, the traceback text and the request id."""

    def __init__(self, writer: LogWriter):
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            # A copy: handlers after this one (pytest's) still see the traceback object.
            record = copy.copy(record)
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        record.msg, record.args = record.getMessage(), None
        record._request_id = request_id_var.get()
        self.writer.put(record)


_writer: LogWriter | None = None


def log_writer() -> LogWriter:
    global _writer
    if _writer is None:
        _writer = LogWriter()
        atexit.register(_writer.flush)
    return _writer


def flush_logs(timeout_s: float = 5.0) -> bool:
    return log_writer().flush(timeout_s)


def configure_logging(level: str) -> None:
    """JSON handler on the `app` logger and uvicorn's loggers (idempotent: tests build many apps)."""
    writer = log_writer()
    writer.flush()
    stream = logging.StreamHandler()  # today's sys.stderr (tests capture it per app)
    stream.setFormatter(JsonFormatter())
    writer.handler = stream
    handler = QueuedHandler(writer)
    setattr(handler, _HANDLER_MARK, True)
    for name in ("app", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not getattr(h, _HANDLER_MARK, False)]
        if name == "app" or logger.handlers:
            # uvicorn's own text handlers are replaced; the `app` logger still propagates for pytest.
            logger.handlers = [handler]
        logger.setLevel(level)
    # The middleware writes one JSON access line per request; uvicorn's text one would duplicate it.
    access = logging.getLogger("uvicorn.access")
    access.handlers = []
    access.propagate = False
    access.disabled = True
