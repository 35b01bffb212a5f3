"""A view's message table continued piece by piece (as incremental compiles extend the
memo's) equals the table built in one piece, and the hash of any first n messages is the
sha256 of their digests joined, whichever kept state it continues from."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.message_table import DIGEST_PREFIX, EMPTY, message_table

digests = st.binary(min_size=32, max_size=32)
pieces = st.lists(st.lists(st.tuples(digests, st.integers(0, 500)), max_size=7), max_size=12)


@settings(max_examples=200, deadline=None)
@given(pieces)
def test_a_table_extended_in_pieces_is_the_table_in_one_piece(
    parts: list[list[tuple[bytes, int]]],
) -> None:
    table, all_d, all_t = EMPTY, list[bytes](), list[int]()
    older = []
    for part in parts:
        before = table
        older.append((before, before.fold(), before.table))
        table = table.extend([d for d, _ in part], [t for _, t in part])
        all_d += [d for d, _ in part]
        all_t += [t for _, t in part]
        assert table.digests == tuple(all_d) and table.tokens == tuple(all_t)
        assert table.table == b"".join(d[:DIGEST_PREFIX] for d in all_d)
        for n in range(len(all_d) + 2):
            assert table.fold(n) == hashlib.sha256(b"".join(all_d[:n])).hexdigest(), n
        assert table.fold() == message_table(all_d, all_t).fold()
    # Extending never changed a table it continued (memos share them).
    for before, folded, joined in older:
        assert before.fold() == folded and before.table == joined
