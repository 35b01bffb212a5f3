"""Append throughput of the event store in `sync` and `buffered` durability, against a
raw write+fsync loop on the same disk measured in the same run."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

from server.domain.model import AppendBatch, ContentPart, NewEvent, Session, UserMessage
from storage import KVEventStore, open_rocks

PAYLOAD = "x" * 200


def raw_fsync_per_s(path: Path, n: int) -> float:
    fd = os.open(path / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        started = time.perf_counter()
        for _ in range(n):
            os.write(fd, PAYLOAD.encode())
            os.fsync(fd)
        return n / (time.perf_counter() - started)
    finally:
        os.close(fd)


def appends_per_s(path: Path, *, sync: bool, threads: int, per_thread: int) -> float:
    store = KVEventStore(open_rocks(path, sync=sync))
    try:
        for t in range(threads):
            store.create_session(Session(f"s{t}", 0, 0))

        def work(t: int) -> None:
            for i in range(per_thread):
                ev = NewEvent(f"e{i}", UserMessage((ContentPart(text=PAYLOAD),)))
                store.append(AppendBatch(f"s{t}", (ev,), now_ns=i, request_id=f"r{i}"))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return threads * per_thread / (time.perf_counter() - started)
    finally:
        store.close()


def run(scale: float = 1.0) -> dict[str, float]:
    n = max(50, int(1000 * scale))
    with tempfile.TemporaryDirectory(dir=os.environ.get("CTXCC_BENCH_DIR")) as d:
        root = Path(d)
        raw = raw_fsync_per_s(root, n)
        rows = {
            "raw_fsync_per_s": raw,
            "sync_1_client_per_s": appends_per_s(root / "a", sync=True, threads=1, per_thread=n),
            "sync_8_clients_per_s": appends_per_s(
                root / "b", sync=True, threads=8, per_thread=n // 4
            ),
            "buffered_1_client_per_s": appends_per_s(
                root / "c", sync=False, threads=1, per_thread=n * 4
            ),
            "buffered_8_clients_per_s": appends_per_s(
                root / "d", sync=False, threads=8, per_thread=n
            ),
        }
    rows["durable_appends_vs_fsync"] = rows["sync_1_client_per_s"] / raw
    return rows


def main() -> None:
    rows = run()
    print(f"{'measure':<28}{'value':>14}")
    for k, v in rows.items():
        print(f"{k:<28}{v:>14.2f}")
    print(json.dumps({k: round(v, 3) for k, v in rows.items()}))


if __name__ == "__main__":
    main()
