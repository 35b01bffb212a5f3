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


# grpc's asyncio server logs at ERROR, with a traceback, each message a handler could not
# send because the call had ended under it (grpc/grpc#32551 turned the exception into
# that record): a client that went away — closed, killed, its pod restarted — while its
# watch or stream step was being answered. Every such disconnect wrote an error with a
# traceback, which an alert on error logs takes for a fault of the daemon. A client
# leaving is not one: the record becomes a line of the daemon's own at DEBUG. A batch
# that failed for another reason (no message in it) is still logged as grpc logs it.
_SEND_FAILED = "ExecuteBatchError raised in core by servicer method ["
_gone_log = logging.getLogger("ctxcc.transport")


def _not_a_client_gone(record: logging.LogRecord) -> bool:
    # The method is formatted into the message (no args): `... method [/pkg.Svc/Rpc]`.
    msg = record.msg
    if not (isinstance(msg, str) and msg.startswith(_SEND_FAILED) and record.exc_info):
        return True
    exc = record.exc_info[1]
    if type(exc).__name__ != "ExecuteBatchError" or "SendMessageOperation" not in str(exc):
        return True
    method = msg[len(_SEND_FAILED) :].rstrip("]")
    _gone_log.debug("the client of a %s call went away while a message was sent to it", method)
    return False


def filter_grpc_records() -> None:
    """Drops grpc's records of header values that are not UTF-8, and turns its records of
    messages not sent to clients gone into DEBUG lines (see above)."""
    logger = logging.getLogger(GRPC_LOGGER)
    logger.addFilter(_not_undecodable_header)
    logger.addFilter(_not_a_client_gone)


def formatter(kind: str) -> logging.Formatter:
    """The formatter for `kind`, one of FORMATS."""
    if kind == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT)
