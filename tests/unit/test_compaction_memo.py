"""A compaction request taken from the last compile's memo is the request made from
scratch: taken (the same object) while its inputs hold, made again when any of them moved:
a message it looked at, the first one that did not fit, the range, the room, or (when
every covered message fit) a covered message after the ones it saw."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from server.compiler.compaction import CompactionMemo, compaction_request, working_set_start
from server.compiler.view import Layer, ViewMessage, ViewPart
from server.domain.model import ArtifactRef, Role
from tests.unit.test_system_prompt import WordCounter

C = WordCounter()


def _msg(seq: int, text: str, tokens: int = 20, layer: Layer = Layer.HISTORY) -> ViewMessage:
    role = Role.USER if seq % 2 else Role.ASSISTANT
    return ViewMessage(role, (ViewPart(text=text),), layer, tokens, first_seq=seq, last_seq=seq)


def _history(n: int, ws_from: int) -> tuple[ViewMessage, ...]:
    return tuple(
        _msg(i, f"message {i}", layer=Layer.WORKING_SET if i >= ws_from else Layer.HISTORY)
        for i in range(1, n + 1)
    )


def _request(
    messages: tuple[ViewMessage, ...], max_tokens: int, previous: CompactionMemo | None
) -> tuple[object, CompactionMemo | None]:
    ws = min((m.first_seq for m in messages if m.layer is Layer.WORKING_SET), default=None)
    return compaction_request(messages, None, ws, len(messages), max_tokens, C, previous)


def _same_as_scratch(
    messages: tuple[ViewMessage, ...], max_tokens: int, previous: CompactionMemo | None
) -> tuple[object, CompactionMemo | None]:
    got = _request(messages, max_tokens, previous)
    assert got[0] == _request(messages, max_tokens, None)[0]
    return got


def test_a_request_over_the_room_is_taken_while_the_messages_it_saw_hold() -> None:
    view = _history(300, 200)  # 199 covered messages, ~40 fit
    # A room whose rest, after the messages that fit, holds a 1-token message and its
    # label (36 tokens a message with its label; see the smaller one below).
    room = next(r for r in range(1_500, 1_540) if _request(view, r, None)[1].room % 36 >= 17)  # type: ignore[union-attr]
    first, memo = _same_as_scratch(view, room, None)
    assert memo is not None and not memo.whole
    # The turn goes on: messages appended to the working set, the same request.
    longer = view + tuple(_msg(i, "more", layer=Layer.WORKING_SET) for i in range(301, 320))
    again, memo2 = _same_as_scratch(longer, room, memo)
    assert again is first and memo2 is memo
    # A message it put in the prompt is another one now: made again.
    changed = (*view[:10], replace(view[10], parts=(ViewPart(text="other"),)), *view[11:])
    made, _ = _same_as_scratch(changed, room, memo)
    assert made is not first and made != first
    # The first message that did not fit is smaller now: it fits.
    k = len(memo.prefix) - 1
    smaller = (*view[:k], replace(view[k], tokens=1), *view[k + 1 :])
    made, _ = _same_as_scratch(smaller, room, memo)
    assert made != first
    # Another room: made again.
    assert _same_as_scratch(view, room - 100, memo)[0] != first
    # The working set moved on (a new turn): the range grew at its end, after the
    # messages that fit and the first that did not: the same request, not made again.
    moved = tuple(replace(m, layer=Layer.HISTORY) if m.first_seq < 250 else m for m in view)
    again, memo3 = _same_as_scratch(moved, room, memo)
    assert again is first and memo3 is memo
    # ... unless a message it looked at falls in the added range (a result the pairing
    # put next to its call, say): it is covered now, so made again, as from scratch.
    odd = (*view[:5], replace(view[5], first_seq=230, last_seq=230), *view[6:])
    odd_first, odd_memo = _same_as_scratch(odd, room, None)
    odd_moved = tuple(replace(m, layer=Layer.HISTORY) if m.first_seq < 250 else m for m in odd)
    made, odd_memo2 = _same_as_scratch(odd_moved, room, odd_memo)
    assert odd_memo2 is not odd_memo and made != odd_first
    # A range that shrank (an earlier working set): made again.
    back = tuple(replace(m, layer=Layer.WORKING_SET) if m.first_seq >= 150 else m for m in view)
    assert _same_as_scratch(back, room, memo)[1] is not memo


def test_a_request_that_covers_everything_is_made_again_when_more_is_covered() -> None:
    view = _history(60, 40)  # every covered message fits
    first, memo = _same_as_scratch(view, 100_000, None)
    assert memo is not None and memo.whole
    again, _ = _same_as_scratch((*view, _msg(61, "ws", layer=Layer.WORKING_SET)), 100_000, memo)
    assert again is first
    # A message after the ones it saw that is covered now (a message of the history
    # projected again after the memo's cut, say): made again, and it is in the prompt.
    late = _msg(39, "a late piece of history", layer=Layer.HISTORY)
    made, _ = _same_as_scratch((*view, late), 100_000, memo)
    assert made != first and "a late piece of history" in made.prompt  # type: ignore[attr-defined]


@given(st.lists(st.tuples(st.sampled_from(list(Layer)), st.integers(0, 50)), max_size=40))
def test_the_working_set_starts_at_its_least_seq(rows: list[tuple[Layer, int]]) -> None:
    """The definition, whatever the order of layers and seqs (pairing may put a working
    set's result before a history message; synthetic messages have seq 0)."""
    messages = tuple(_msg(seq, "m", layer=layer) for layer, seq in rows)
    seqs = [seq for layer, seq in rows if layer is Layer.WORKING_SET and seq]
    assert working_set_start(messages) == (min(seqs) if seqs else None)


def test_the_transcript_names_images_from_projection_6_only() -> None:
    """An image a covered message holds is named in the transcript (it leaves the view
    with the messages the summary replaces); compiles recorded before projection 6 are
    rebuilt with the transcript they had, which left it out."""
    ref = ArtifactRef("a-1", "image/png", 2_004, "00" * 32, 640, 480)
    shot = ViewMessage(
        Role.USER,
        (ViewPart(text="what is wrong here?"), ViewPart(attachment=ref)),
        Layer.HISTORY,
        900,
        first_seq=1,
        last_seq=1,
    )
    view = (shot, *_history(4, 3)[1:])
    named, _ = compaction_request(view, None, 3, 4, 10_000, C)
    assert named is not None and named.through_seq == 2
    assert "what is wrong here?\n[image a-1 (image/png, 640x480 pixels)" in named.prompt
    old, _ = compaction_request(view, None, 3, 4, 10_000, C, images=False)
    assert old is not None and "a-1" not in old.prompt
    line = next(x for x in named.prompt.splitlines() if x.startswith("[image a-1"))
    assert old.prompt == named.prompt.replace("\n" + line, "")
