"""Log output of the ``qjm`` command: a level and a format (text for people, JSON lines for collectors).

JSON lines carry ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and, for an error
with a traceback, ``exception``; one object per line, so journald, Loki or Elasticsearch ingest it
without a parser of their own.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Send the root logger's records at ``level`` and above to stderr in ``fmt`` (replacing any handler)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
