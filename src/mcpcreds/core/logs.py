"""Structured logs: one JSON object a line (or a readable line on a terminal), always redacted."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from .secret import REDACTOR, redact_json

LOGGER_NAME = "mcpcreds"
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)))


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(redact_json(entry))  # masked inside its strings: always valid JSON


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():7} {record.getMessage()}"
        if extras:
            line += " " + extras
        if record.exc_info and record.exc_info[0] is not None:
            line += "\n" + self.formatException(record.exc_info)
        return REDACTOR.redact(line)


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO,
                      json_lines: bool | None = None) -> logging.Handler:
    """Send mcpcreds logs to `stream` (stderr): JSON lines unless it is a terminal."""
    stream = stream or sys.stderr
    if json_lines is None:
        json_lines = not stream.isatty()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if json_lines else ConsoleFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
