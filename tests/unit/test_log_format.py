"""--log-format json: one JSON object per record, on one line, whatever the record holds."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest

from server.log_format import JsonFormatter, formatter


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter("json"))
    log = logging.getLogger("ctxcc.test.json")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield log, out
    finally:
        log.removeHandler(handler)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_record_is_one_object_with_time_level_logger_and_message(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    log, out = logged
    log.warning("compiled %s in %d ms", "s-1", 12)
    (rec,) = lines(out)
    assert rec["level"] == "warning" and rec["logger"] == "ctxcc.test.json"
    assert rec["message"] == "compiled s-1 in 12 ms"  # arguments applied
    stamp = datetime.fromisoformat(str(rec["time"]))
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert set(rec) == {"time", "level", "logger", "message"}


def test_a_traceback_stays_inside_its_record(logged: tuple[logging.Logger, io.StringIO]) -> None:
    """As text, a traceback is a dozen lines that a log pipeline takes for a dozen records
    of no level; in JSON it is one field of its record."""
    log, out = logged
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("step failed")
    log.info("after", stack_info=True)
    first, second = lines(out)  # two records, two lines
    assert first["level"] == "error" and first["message"] == "step failed"
    assert "Traceback (most recent call last)" in str(first["exception"])
    assert "ValueError: bad\nthing" in str(first["exception"])
    assert "test_a_traceback_stays_inside_its_record" in str(second["stack"])


def test_extra_fields_are_fields_and_anything_is_written(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    log, out = logged
    log.info("x", extra={"session_id": "s-1", "events": 3, "where": object})
    # A lone surrogate (undecodable bytes of a client's path) must not make it unwritable.
    # Handed to the handler alone: pytest's own log capture would carry the record to
    # xdist's controller, whose channel refuses strings that UTF-8 cannot encode.
    handler = next(h for h in log.handlers if getattr(h, "stream", None) is out)
    handler.handle(
        log.makeRecord(log.name, logging.INFO, __file__, 72, "path %s", ("a\udcffb",), None)
    )
    rec, odd = lines(out)
    assert rec["session_id"] == "s-1" and rec["events"] == 3
    assert rec["where"] == str(object)  # not JSON: written as text, not an error
    assert odd["message"] == "path a\udcffb"
    assert out.getvalue().isascii()


def test_text_is_the_default_line_format() -> None:
    record = logging.LogRecord("ctxcc", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    text = formatter("text").format(record)
    assert text.endswith(" INFO ctxcc: hello x")
    assert not isinstance(formatter("text"), JsonFormatter)
    assert isinstance(formatter("json"), JsonFormatter)
