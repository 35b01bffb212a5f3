"""How the daemon's log records are written: lines of text for a terminal, or one JSON
object per line for a log pipeline (Loki, Elasticsearch, Cloud Logging), which parses
fields rather than guessing them from text and keeps a traceback with its record
instead of splitting it into lines of its own."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has; anything else on a record came from `extra=` and
# is written as a field of its own.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: `time` (RFC 3339, UTC, microseconds),
    `level`, `logger`, `message`, and `exception` / `stack` when the record has them;
    fields given with `extra=` follow (text when they are not JSON values)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        # ensure_ascii: a client's bytes that are not valid text (a lone surrogate from a
        # decoded path, say) cannot make the line unwritable; default=str: an `extra`
        # value of any type is written, never an error in the logging call.
        return json.dumps(out, ensure_ascii=True, default=str)


# grpc decodes each header value as UTF-8 and, for one that is not, logs an ERROR with a
# traceback naming the value's bytes, then takes it as Latin-1 and serves the call. Any
# peer could write the contents of its headers (a token, say) into the log, and ~300
# bytes of log per byte-long header: one call of 1,500 such headers wrote 470 KB. Nothing
# in them is the daemon's to act on, so those records are dropped.
GRPC_LOGGER = "grpc._cython.cygrpc"
_UNDECODABLE_HEADER = "Invalid encoding on %s"


def _not_undecodable_header(record: logging.LogRecord) -> bool:
    return record.msg != _UNDECODABLE_HEADER


def quiet_grpc_header_decoding() -> None:
    """Drops grpc's records of header values that are not UTF-8 (see above)."""
    logging.getLogger(GRPC_LOGGER).addFilter(_not_undecodable_header)


def formatter(kind: str) -> logging.Formatter:
    """The formatter for `kind`, one of FORMATS."""
    if kind == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT)
