"""Structured logs, always redacted: readable lines on a terminal, one JSON object a line elsewhere.

- text: `2026-12-07 04:12:03 WARNING gateway: upstream "docs" failed: ... key=value`, the local
  time, the level, the part of the sidecar that speaks, the event, then the event's fields.
- json: `{"timestamp": "2026-12-07T03:12:03.214Z", "time": 1796613123.214, "level": "warning",
  "logger": "mcpcreds.gateway", "event": "...", <fields>}`: the time twice, ISO-8601 in UTC and
  unix seconds (what log shippers and `jq` each read best).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final, TextIO

from .secret import REDACTOR, redact_json

LOGGER_NAME = "mcpcreds"
LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                 "error": logging.ERROR}
FORMATS: Final = ("text", "json")
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)))
_PREFIX: Final = LOGGER_NAME + "."


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


def iso_utc(seconds: float) -> str:
    """Unix seconds as ISO-8601 in UTC, to the millisecond: 2026-12-07T03:12:03.214Z."""
    whole, millis = divmod(round(seconds * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        at = round(record.created, 3)
        entry: dict[str, Any] = {
            "timestamp": iso_utc(at),  # the same instant as "time", to the millisecond
            "time": at,
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
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        part = record.name[len(_PREFIX):] if record.name.startswith(_PREFIX) else record.name
        message = record.getMessage()
        if not message.startswith(part + ": "):  # "gateway: ..." events already name their part
            message = f"{part}: {message}"
        line = f"{stamp} {record.levelname} {message}"
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if extras:
            line += " " + extras
        if record.exc_info and record.exc_info[0] is not None:
            line += "\n" + self.formatException(record.exc_info)
        return REDACTOR.redact(line)


def configure_logging(stream: TextIO | None = None, level: int | str = logging.INFO,
                      json_lines: bool | None = None) -> logging.Handler:
    """Send mcpcreds logs to `stream` (stderr) from `level` up (a number, or a name of LEVELS):
    JSON lines unless it is a terminal, or as `json_lines` says."""
    stream = stream or sys.stderr
    if isinstance(level, str):
        level = LEVELS[level]
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
