"""Cold start with a million events on disk, and daemon memory with 1,000 sessions."""

from __future__ import annotations

from pathlib import Path

from bench.daemon import BenchDaemon
from bench.rpc import Api, conversation
from server.domain.model import AppendBatch, ContentPart, NewEvent, Session, UserMessage
from storage import KVEventStore, open_rocks


def fill(db: Path, events: int, per_session: int = 10_000) -> None:
    """Writes `events` events straight through the store, in 1,000-event batches."""
    store = KVEventStore(open_rocks(db, sync=False))
    try:
        text = "an event of about a hundred bytes, like a short user message in a session. "
        for s in range(max(1, events // per_session)):
            sid = f"cold{s}"
            store.create_session(Session(sid, 0, 0))
            for b in range(0, per_session, 1000):
                batch = tuple(
                    NewEvent(f"e{b + i}", UserMessage((ContentPart(text=text),)))
                    for i in range(min(1000, per_session - b))
                )
                store.append(AppendBatch(sid, batch, now_ns=b))
    finally:
        store.close()


def cold_start(root: Path, events: int) -> float:
    data = root / "cold"
    fill(data / "db", events)
    d = BenchDaemon(data)
    try:
        return d.start_timed()
    finally:
        d.stop()


def rss(root: Path, sessions: int, events_each: int) -> dict[str, float]:
    """Daemon RSS once SERVING (`rss_mb_idle`: code, libraries and the tokenizer tables
    preloaded by default) and after `sessions` sessions with a GPT-4o compile every tenth
    (`rss_mb_1k_sessions`: plus o200k's table, memos and RocksDB's memory)."""
    d = BenchDaemon(root / "rss")
    d.start_timed()
    try:
        idle = d.rss_mb()
        api = Api(d.target)
        turns = max(1, events_each // 3)
        for s in range(sessions):
            api.session(f"rss{s}", conversation(turns, f"r{s}")[:events_each])
            if s % 10 == 0:  # compiles too, as agents would: caches and counters warm up
                api.compile(f"rss{s}")
        return {"rss_mb_idle": idle, "rss_mb_1k_sessions": d.rss_mb()}
    finally:
        d.stop()
