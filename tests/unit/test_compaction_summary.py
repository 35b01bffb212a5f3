"""A compaction prompt starts with the summary so far. A summary larger than the window
(written on a route with a larger one, or a portable checkpoint from another session)
made a prompt no model could read, covering one message cut to a few characters: the
history could never be shortened again. From projection 14 the summary takes at most half
of the prompt's room: its start and its end, a marker between them."""

from __future__ import annotations

from server.compiler.compaction import compaction_request
from server.compiler.view import Layer, ViewMessage, ViewPart
from server.domain.model import Role
from server.domain.records import Checkpoint, CheckpointKind
from tests.unit.test_system_prompt import WordCounter

C = WordCounter()
ROOM = 32_000


def _history(n: int) -> tuple[ViewMessage, ...]:
    """n messages of 300 words, the last one the working set."""
    return tuple(
        ViewMessage(
            Role.USER if i % 2 else Role.ASSISTANT,
            (ViewPart(text=" ".join(f"w{i}" for _ in range(300))),),
            Layer.WORKING_SET if i == n + 2 else Layer.HISTORY,
            300,
            first_seq=i,
            last_seq=i,
        )
        for i in range(3, n + 3)
    )


def _checkpoint(summary: str) -> Checkpoint:
    return Checkpoint("ck", "s", 2, summary, None, False, "", CheckpointKind.MODEL_SUMMARY, 1)


def _prompt(summary: str, cut: bool) -> tuple[str, int, int]:
    messages = _history(60)
    request, _ = compaction_request(
        messages, _checkpoint(summary), messages[-1].first_seq, 62, ROOM, C, summary_cut=cut
    )
    assert request is not None
    return request.prompt, request.from_seq, request.through_seq


def test_a_summary_over_half_the_room_is_cut_to_its_start_and_end() -> None:
    words = [f"s{i}" for i in range(40_000)]
    summary = " ".join(words)
    prompt, start, through = _prompt(summary, cut=True)
    assert C.count(prompt) <= ROOM
    assert "characters of the summary so far not shown" in prompt
    kept = C.count(prompt.split("Conversation, seq")[0])
    assert ROOM // 3 < kept <= ROOM // 2, kept
    # Its start and its end are kept, the start the larger part.
    assert "s0 s1 s2" in prompt and "s39998 s39999" in prompt
    assert "s20000 " not in prompt
    # The rest of the room covers whole messages, none cut.
    assert start == 3 and through - start + 1 >= 40, through
    assert "more characters of this message not shown" not in prompt


def test_a_summary_within_half_the_room_is_whole_and_older_projections_keep_it_whole() -> None:
    small = " ".join(f"s{i}" for i in range(1_000))
    assert small in _prompt(small, cut=True)[0]
    big = " ".join(f"s{i}" for i in range(40_000))
    # A compile recorded before projection 14 is rebuilt as it was made: the whole summary,
    # one message cut to fit what was left.
    prompt, start, through = _prompt(big, cut=False)
    assert big in prompt and start == through == 3
    assert "more characters of this message not shown" in prompt
