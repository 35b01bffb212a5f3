"""Records decoded on many worker threads at once, in a fresh process (the daemon's
situation right after a restart: every RPC's first read builds its decoder)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import sys, threading
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    from server.domain.records import Checkpoint, CheckpointKind
    from storage.codec import decode_value, encode_value

    raw = encode_value(
        Checkpoint("ck", "s", 3, "summary", None, True, "d", CheckpointKind.BUILTIN, 5)
    )
    gate = threading.Barrier(8)
    decoded = []

    def work():
        gate.wait()
        for _ in range(20):
            decoded.append(decode_value(raw, Checkpoint).covers_through_seq)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert decoded == [3] * 160, decoded
    """
)


def test_first_decodes_on_many_threads_do_not_crash_the_process() -> None:
    # Building a decoder on two threads at once crashed msgspec 0.22 with SIGSEGV in
    # about three fresh processes out of four; twelve processes make a miss unlikely.
    codes = [
        subprocess.run(
            [sys.executable, "-c", _CHILD], check=False, cwd=REPO, capture_output=True, timeout=120
        ).returncode
        for _ in range(12)
    ]
    assert codes == [0] * 12
