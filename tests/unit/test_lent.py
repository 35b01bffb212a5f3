"""The records a unary Compile's view lends to the session's next view: kept per
session, bounded by sessions and bytes, never for a view with inline image bytes."""

from __future__ import annotations

from dataclasses import replace

from ctxcc.v1 import compile_service_pb2 as cpb
from server.compiler.compile import compile_view
from server.compiler.render import RenderFormat
from server.compiler.view import CompactionRequest
from server.domain.model import ContentPart, Event, UserMessage
from server.service.compile_types import CompileResult
from server.transport.convert_view import result_out
from server.transport.lent import LentBySession
from server.transport.view_bytes import LentRecords, view_bytes
from tests.unit.test_incremental import C, Step, inputs_for

LOG = [Event(i + 1, f"e{i + 1}", 0, UserMessage((ContentPart(text=f"hi {i}"),))) for i in range(3)]
VIEW = compile_view(inputs_for(LOG, Step([], 0, "", 0, False, False, False), 0), C)


def _sent(session_id: str) -> tuple[CompileResult, int]:
    result = CompileResult(replace(VIEW, session_id=session_id))
    return result, view_bytes(result).size


def test_records_are_lent_to_the_sessions_next_view_and_bounded() -> None:
    one, size = _sent("a")
    lent = LentBySession(max_sessions=2, max_bytes=10 * size)
    assert lent.get("a").messages == ()
    lent.keep(one, view_bytes(one))
    got = lent.get("a")
    assert got.messages == one.view.messages and got.messages[0] is one.view.messages[0]
    assert got.records == view_bytes(one).messages
    for sid in ("b", "c"):  # a third session pushes out the oldest
        r, _ = _sent(sid)
        lent.keep(r, view_bytes(r))
    assert lent.get("a").messages == () and lent.get("c").messages
    small = LentBySession(max_sessions=10, max_bytes=4 * size + 3)
    for sid in ("a", "b", "c", "d", "e"):
        r, _ = _sent(sid)
        small.keep(r, view_bytes(r))
    kept = [sid for sid in "abcde" if small.get(sid).messages]
    assert kept == ["b", "c", "d", "e"]  # the bytes bound holds four


def test_a_view_with_inline_image_bytes_lends_nothing() -> None:
    result = CompileResult(VIEW, (("img1", b"png"),))
    lent = LentBySession()
    lent.keep(result, view_bytes(CompileResult(VIEW)))
    assert lent.get(VIEW.session_id).messages == ()


def test_lent_records_give_the_next_views_records_and_size() -> None:
    """The next view's size is the lent view's message bytes plus its new records when it
    keeps every lent message (counted without walking them), and counted whole otherwise."""
    one = CompileResult(VIEW)
    first = view_bytes(one)
    lent = LentRecords(VIEW.messages, first.messages, VIEW, first)
    extra = replace(VIEW.messages[-1], first_seq=9, last_seq=9)
    for messages in (
        (*VIEW.messages, extra, extra),  # every lent message kept, two appended
        (*VIEW.messages[:1], extra),  # a prefix kept
        (extra, *VIEW.messages),  # nothing kept
        # the last message projected again (an equal value, another object), one appended
        (*VIEW.messages[:-1], replace(VIEW.messages[-1]), extra),
    ):
        result = CompileResult(replace(VIEW, compile_id="next", messages=messages))
        view = view_bytes(result, lent)
        alone = view_bytes(result)
        assert view.whole() == alone.whole() and view.messages == alone.messages
        assert view.size == len(view.whole())


def test_a_repeat_is_the_last_answer_under_its_new_compile_id() -> None:
    one, _ = _sent("a")
    parts = view_bytes(one)
    lent = LentBySession()
    lent.keep(one, parts, parts.whole(1))
    # A repeat shares every field but the compile id with the view sent (repeats.py).
    for new_id in ("a:2", "a:" + "9" * 300):  # a longer id: the lengths change too
        again = replace(one.view, compile_id=new_id)
        answer = lent.repeated(again)
        assert answer is not None
        response = cpb.CompileResponse.FromString(answer)
        assert response.view.compile_id == new_id
        assert answer == view_bytes(CompileResult(again)).whole(1)
    # An equal view made anew is no repeat, nor is a view of another session, nor one
    # whose kept answer was not its encoding.
    anew = replace(one.view, compile_id="a:3", messages=tuple(list(one.view.messages)))
    assert anew.messages == one.view.messages and lent.repeated(anew) is None
    assert lent.repeated(replace(one.view, session_id="b")) is None
    lent.keep(one, parts, b"\x0a\x03abc")
    assert lent.repeated(replace(one.view, compile_id="a:4")) is None
    assert lent.get("a").records == parts.messages


def test_a_compaction_request_is_lent_only_when_it_is_the_same_request() -> None:
    """Over budget every view carries a compaction request with a prompt as long as the
    history: the next view of the stream takes the last one's record of it when the
    request is equal (an equal value made again), and encodes its own otherwise; the view
    is byte for byte its protobuf encoding either way, renderings and notes after it."""
    prompt = "summarise this: " + "x" * 5000

    def with_request(cid: str, text: str | None, notes: tuple[str, ...] = ()) -> CompileResult:
        request = None if text is None else CompactionRequest(1, 3, text, "d" * 64)
        view = replace(VIEW, compile_id=cid, compaction=request, notes=notes)
        return CompileResult(view, renderings=((RenderFormat.OPENAI_CHAT, "{}", 7),))

    first = with_request("a", prompt)
    parts = view_bytes(first)
    lent = LentRecords(first.view.messages, parts.messages, first.view, parts)
    for cid, text, notes in (
        ("b", "summarise this: " + "x" * 5000, ("a note",)),  # equal, another object
        ("c", prompt + "!", ()),  # another request
        ("d", None, ("n",)),  # none
    ):
        result = with_request(cid, text, notes)
        got = view_bytes(result, lent)
        want = result_out(result).SerializeToString(deterministic=True)
        assert got.whole() == want and got.size == len(want)
        if text is not None:
            lent_same = text == prompt
            assert (got.compaction is parts.compaction) == lent_same


def test_sections_and_prompt_are_lent_only_when_they_are_the_same() -> None:
    """The next view takes the last one's section and prompt records when its sections
    and prompt are equal values (compiled again, other objects), and encodes its own
    otherwise; byte for byte its protobuf encoding either way, a delta's
    `prompt_is_joined` included."""
    first = CompileResult(replace(VIEW, compile_id="a"))
    parts = view_bytes(first)
    lent = LentRecords(first.view.messages, parts.messages, first.view, parts)
    again = tuple(replace(s) for s in VIEW.system_sections)
    other = (*again[:-1], replace(again[-1], text=again[-1].text + " more"))
    for cid, sections, prompt in (
        ("b", again, "".join(VIEW.system_prompt)),  # equal, other objects
        ("c", other, "\n\n".join(s.text for s in other)),  # one section changed
        ("d", again, "not the joined sections"),  # the prompt differs
        # a section's count differs, the prompt is the same
        ("e", (replace(again[0], tokens=again[0].tokens + 1), *again[1:]), VIEW.system_prompt),
    ):
        result = CompileResult(
            replace(VIEW, compile_id=cid, system_sections=sections, system_prompt=prompt)
        )
        got = view_bytes(result, lent)
        want = result_out(result).SerializeToString(deterministic=True)
        assert got.whole() == want and got.size == len(want)
        assert (got.sections is parts.sections) == (cid == "b")
        assert got.prompt_is_joined == (cid != "d")
