"""JSON logs, one object per line, carrying the request id of the request being served."""

from __future__ import annotations

import json
import logging
import re
import uuid
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
    return uuid.uuid4().hex


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            # Tracebacks go to the logs only, never into responses.
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str) -> None:
    """JSON handler on the `app` logger and uvicorn's loggers (idempotent: tests build many apps)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
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
