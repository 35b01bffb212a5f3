"""The chunk names a Splitter gives a table are its content's, whatever it split before:
the names it takes over from an earlier table (steps that append, remove from the front,
change one message) are those a fresh Splitter computes."""

from __future__ import annotations

import random

from server.domain.table_chunks import CHUNK, Splitter, chunk_name


def _names_from_scratch(digests: bytes, tokens: tuple[int, ...]) -> tuple[str, ...]:
    split = Splitter().split(digests, tokens)
    # A fresh splitter names every chunk by hashing its content.
    assert split.names == tuple(chunk_name(split.chunk(i)) for i in range(len(split.names)))
    return split.names


def test_names_taken_over_from_earlier_tables_are_the_contents_names() -> None:
    rnd = random.Random(7)
    kept = Splitter()
    digests, tokens = rnd.randbytes(8 * 700), tuple(rnd.randrange(1, 5000) for _ in range(700))
    chunked = 0
    for step in range(300):
        kind = rnd.randrange(5)
        if kind == 0:  # a step appends
            k = rnd.randrange(1, 40)
            digests += rnd.randbytes(8 * k)
            tokens += tuple(rnd.randrange(1, 5000) for _ in range(k))
        elif kind == 1 and len(tokens) > 600:  # messages leave the front (a checkpoint)
            k = rnd.randrange(1, 300)
            digests, tokens = digests[8 * k :], tokens[k:]
        elif kind == 2 and tokens:  # one message's digest changes
            i = rnd.randrange(len(tokens))
            digests = digests[: 8 * i] + rnd.randbytes(8) + digests[8 * i + 8 :]
        elif kind == 3 and tokens:  # one message's tokens change (another route)
            i = rnd.randrange(len(tokens))
            tokens = (*tokens[:i], tokens[i] + 1, *tokens[i + 1 :])
        else:  # the same table, other objects
            digests, tokens = bytes(bytearray(digests)), tuple(list(tokens))
        split = kept.split(digests, tokens)
        chunked += bool(split.names)
        assert split.names == _names_from_scratch(digests, tokens), step
        full = len(tokens) // CHUNK
        assert split.digests == digests[8 * CHUNK * full :]
        assert split.tokens == tokens[CHUNK * full :]
        assert b"".join(split.chunk(i).digests for i in range(full)) + split.digests == digests
    assert chunked > 250  # the tables were long enough to have chunks
