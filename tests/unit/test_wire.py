# mypy: disable-error-code="list-item"
# (raw enum numbers on purpose: the wire count does not care what they mean)
"""Element counts of capped repeated fields, read from the raw request bytes."""

from __future__ import annotations

from ctxcc.v1 import common_pb2, event_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.domain.errors import CtxccError, Reason
from server.transport.wire import (
    MAX_EVENT_ELEMENTS,
    RepeatedCap,
    count_over,
    request_caps,
    string_at,
)

CAPS = request_caps(1_000, 512)
APPEND = CAPS["/ctxcc.v1.SessionService/AppendEvents"][0]
LIST = CAPS["/ctxcc.v1.SessionService/ListEvents"][0]


def _append(n: int) -> bytes:
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="x" * 200)  # multi-byte lengths inside each element
    return spb.AppendEventsRequest(
        session_id="s", events=[ev] * n, request_id="r", expected_last_seq=7
    ).SerializeToString()


def test_events_are_counted_on_the_wire() -> None:
    assert count_over(_append(1_000), APPEND) is None
    assert count_over(_append(1_001), APPEND) == 1_001
    err = APPEND.error(1_001)
    assert isinstance(err, CtxccError) and err.reason is Reason.TOO_MANY_EVENTS


def test_packed_kinds_are_counted_element_by_element() -> None:
    ok = spb.ListEventsRequest(session_id="s", kinds=[1, 2, 3] * 21, after_seq=300)
    assert count_over(ok.SerializeToString(), LIST) is None
    many = spb.ListEventsRequest(session_id="s", kinds=[1] * 65)
    assert count_over(many.SerializeToString(), LIST) == 65
    big = spb.ListEventsRequest(session_id="s", kinds=[300] * 65)  # two-byte varints
    assert count_over(big.SerializeToString(), LIST) == 65


def test_malformed_bytes_are_left_to_the_decoder() -> None:
    cap = RepeatedCap(2, 1, APPEND.error)
    assert count_over(b"\x12\xff", cap) is None  # truncated length
    assert count_over(b"\x0f", cap) is None  # wire type 7


def _rule(globs: int) -> bytes:
    from ctxcc.v1 import source_pb2
    from ctxcc.v1 import source_service_pb2 as rpb

    rule = source_pb2.Rule(rule_id="r", name="n", text="t" * 300, path_globs=["src/*.py"] * globs)
    return rpb.PutRuleRequest(rule=rule).SerializeToString()


def test_nested_globs_are_counted_inside_the_rule() -> None:
    cap = CAPS["/ctxcc.v1.SourceService/PutRule"][0]
    assert count_over(_rule(64), cap) is None
    assert count_over(_rule(65), cap) == 65
    assert count_over(_rule(200_000), cap) == 65  # stops at the limit + 1
    err = cap.error(65)
    assert err.reason is Reason.INVALID_FIELD and err.metadata["field"] == "rule.path_globs"


def test_labels_are_counted_as_map_entries_of_the_session() -> None:
    from ctxcc.v1 import session_pb2

    cap = CAPS["/ctxcc.v1.SessionService/CreateSession"][0]

    def request(n: int) -> bytes:
        s = session_pb2.Session(session_id="s", project_root="/p")
        s.labels.update({f"k{i}": "v" * 300 for i in range(n)})
        return spb.CreateSessionRequest(session=s).SerializeToString()

    assert count_over(request(64), cap) is None
    assert count_over(request(65), cap) == 65
    # Session.head_seq (field 8) and an unrelated field 6 at the top level are not labels.
    assert count_over(b"\x32\x00" * 100, cap) is None


def test_step_events_are_counted_per_stream_message() -> None:
    from ctxcc.v1 import common_pb2
    from ctxcc.v1 import compile_service_pb2 as cpb

    cap = CAPS["/ctxcc.v1.CompileService/CompileStream"][0]
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="y" * 200)

    def step(n: int) -> bytes:
        compile_req = cpb.CompileRequest(session_id="s", route=common_pb2.Route(model="m"))
        return cpb.CompileStreamRequest(
            step=cpb.StepRequest(step_id="1", events=[ev] * n, compile=compile_req)
        ).SerializeToString()

    assert count_over(step(1_000), cap) is None
    assert count_over(step(1_001), cap) == 1_001
    # A resume (field 2) holds no events whatever its size.
    resume = cpb.CompileStreamRequest(resume=cpb.ResumeRequest(compile_id="c" * 5_000))
    assert count_over(resume.SerializeToString(), cap) is None


def test_a_nested_length_past_its_parent_is_left_to_the_decoder() -> None:
    cap = CAPS["/ctxcc.v1.SourceService/PutRule"][0]
    # rule of 2 bytes whose only field claims 100 bytes
    assert count_over(b"\x0a\x02\x42\x64", cap) is None


def test_the_refused_step_is_named_from_the_raw_bytes() -> None:
    from ctxcc.v1 import compile_service_pb2 as cpb

    ev = event_pb2.Event()
    ev.user_message.parts.add(text="z")
    step = cpb.StepRequest(events=[ev] * 3, request_id="r", step_id="step-7")
    data = cpb.CompileStreamRequest(step=step).SerializeToString()
    assert string_at(data, (1, 1)) == "step-7"  # found after the events
    resume = cpb.CompileStreamRequest(resume=cpb.ResumeRequest(compile_id="c"))
    assert string_at(resume.SerializeToString(), (1, 1)) == ""
    assert string_at(data[:-3], (1, 1)) == ""  # cut short: no name rather than garbage
    # Unknown groups on the way (outside the step and inside it) are stepped over.
    grouped = b"\x4b\x08\x01\x4c" + b"\x0a" + bytes([len(data) - 2 + 2]) + b"\x4b\x4c" + data[2:]
    assert cpb.CompileStreamRequest.FromString(grouped).step.step_id == "step-7"
    assert string_at(grouped, (1, 1)) == "step-7"


def _events_with(kind: str, per_event: int, events: int) -> list[event_pb2.Event]:
    out = []
    for _ in range(events):
        ev = event_pb2.Event()
        if kind == "user":
            ev.user_message.parts.extend([common_pb2.ContentPart(text="p")] * per_event)
        elif kind == "calls":
            ev.assistant_message.parts.add(text="calling")
            for i in range(per_event - 1):
                ev.assistant_message.tool_calls.add(call_id=f"c{i}", name="t")
        else:
            ev.imported_message.parts.extend([common_pb2.ContentPart(text="p")] * per_event)
        out.append(ev)
    return out


def test_parts_and_tool_calls_of_all_events_are_counted_together() -> None:
    cap = CAPS["/ctxcc.v1.SessionService/AppendEvents"][1]
    limit = MAX_EVENT_ELEMENTS
    for kind in ("user", "calls", "imported"):
        ok = _events_with(kind, limit // 16, 16)
        data = spb.AppendEventsRequest(session_id="s", events=ok).SerializeToString()
        assert count_over(data, cap) is None, kind
        over = ok + _events_with(kind, 1, 1)
        data = spb.AppendEventsRequest(session_id="s", events=over).SerializeToString()
        assert count_over(data, cap) == limit + 1, kind
    mixed = _events_with("user", 6_000, 1) + _events_with("calls", 6_000, 1)
    mixed += _events_with("imported", 5_000, 1)
    data = spb.AppendEventsRequest(session_id="s", events=mixed).SerializeToString()
    assert count_over(data, cap) == limit + 1
    err = cap.error(limit + 1)
    assert err.reason is Reason.INVALID_FIELD and err.metadata["field"] == "events"


def test_ten_million_empty_parts_are_refused_from_the_wire() -> None:
    """One event of 10,000,000 empty parts (20 MB; decoding it held the GIL ~1.8 s): the
    count stops at the limit + 1."""
    from tests.e2e.test_hostile_corpus import _len_field

    one_event = _len_field(10, _len_field(1, b"") * 10_000_000)
    data = _len_field(1, b"s") + _len_field(2, one_event)
    cap = CAPS["/ctxcc.v1.SessionService/AppendEvents"][1]
    assert count_over(data, cap) == MAX_EVENT_ELEMENTS + 1


def test_browser_element_attributes_count_with_the_parts() -> None:
    cap = CAPS["/ctxcc.v1.SessionService/AppendEvents"][1]
    attrs = {f"data-{i}": "v" for i in range(MAX_EVENT_ELEMENTS)}
    alone = event_pb2.Event()
    alone.browser_element.attributes.update(attrs)
    in_part = event_pb2.Event()
    in_part.user_message.parts.add().browser_element.attributes.update(attrs)
    for ev, total in ((alone, MAX_EVENT_ELEMENTS), (in_part, MAX_EVENT_ELEMENTS + 1)):
        data = spb.AppendEventsRequest(session_id="s", events=[ev]).SerializeToString()
        # the part itself counts too: one over
        assert count_over(data, cap) == (None if total == MAX_EVENT_ELEMENTS else total)


def test_search_keywords_and_compile_enums_are_capped() -> None:
    from ctxcc.v1 import compile_service_pb2 as cpb
    from ctxcc.v1 import tool_pb2, view_pb2
    from ctxcc.v1 import tool_service_pb2 as tpb

    keywords = CAPS["/ctxcc.v1.ToolService/RegisterTools"][1]
    tools = [tool_pb2.ToolDefinition(name=f"t{i}", search_keywords=["k"] * 4_096) for i in range(4)]
    ok = tpb.RegisterToolsRequest(session_id="s", tools=tools).SerializeToString()
    assert count_over(ok, keywords) is None
    tools.append(tool_pb2.ToolDefinition(name="t", search_keywords=["k"]))
    over = tpb.RegisterToolsRequest(session_id="s", tools=tools).SerializeToString()
    assert count_over(over, keywords) == 16_385
    enums = CAPS["/ctxcc.v1.CompileService/Compile"][0]
    req = cpb.CompileRequest(session_id="s", exclude_sections=[1] * 40, render_formats=[1] * 24)
    assert count_over(req.SerializeToString(), enums) is None
    req.render_formats.append(view_pb2.RENDER_FORMAT_OPENAI_CHAT)
    assert count_over(req.SerializeToString(), enums) == 65
    step_enums = CAPS["/ctxcc.v1.CompileService/CompileStream"][2]
    step = cpb.CompileStreamRequest(step=cpb.StepRequest(step_id="x", compile=req))
    assert count_over(step.SerializeToString(), step_enums) == 65
    # A resume's compile too (5,000,000 of them were decoded and compiled), and its refusal
    # is named by the resume's step_id.
    resume_enums = CAPS["/ctxcc.v1.CompileService/CompileStream"][3]
    resume = cpb.CompileStreamRequest(
        resume=cpb.ResumeRequest(compile_id="c", compile=req, step_id="r-9")
    ).SerializeToString()
    assert count_over(resume, resume_enums) == 65
    assert count_over(resume, step_enums) is None
    assert string_at(resume, resume_enums.id_path) == "r-9"
    req.render_formats.pop()
    fine = cpb.CompileStreamRequest(resume=cpb.ResumeRequest(compile_id="c", compile=req))
    assert count_over(fine.SerializeToString(), resume_enums) is None


def test_every_truncation_of_a_step_is_left_to_the_decoder_or_counted_no_higher() -> None:
    """Tags and lengths are read inline when one byte long: a message cut anywhere (in a
    tag, in a two-byte length, in a packed run) never raises from the count and never
    counts more than the whole message holds."""
    from ctxcc.v1 import compile_service_pb2 as cpb

    caps = CAPS["/ctxcc.v1.CompileService/CompileStream"]
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="x" * 200)
    req = cpb.CompileRequest(session_id="s", exclude_sections=[1] * 40, render_formats=[1] * 25)
    step = cpb.StepRequest(step_id="x", events=[ev] * 3, compile=req, request_id="r" * 130)
    data = cpb.CompileStreamRequest(step=step).SerializeToString()
    assert count_over(data, caps[2]) == 65
    for end in range(len(data)):
        for cap in caps:
            found = count_over(data[:end], cap)
            assert found is None or cap.limit < found <= 65, (end, found)


def _group(number: int, inner: bytes = b"") -> bytes:
    """An unknown group (wire types 3 and 4): no field of ours is one; the decoder keeps
    it as unknown fields."""
    return bytes([number << 3 | 3]) + inner + bytes([number << 3 | 4])


def test_events_behind_an_unknown_group_are_counted() -> None:
    """Two bytes of an empty group in front of a flood ended the walk ("malformed: the
    decoder reports it"), and the decoder, which takes the group, decoded every event."""
    for group in (_group(9), _group(9, _group(10, b"\x08\x01") + b"\x15abcd"), _group(15)):
        body = group + _append(1_001)
        assert len(spb.AppendEventsRequest.FromString(body).events) == 1_001  # the decoder's view
        assert count_over(body, APPEND) == 1_001
        assert count_over(_append(1_001) + group, APPEND) == 1_001
    # Events inside a group are not events: the decoder keeps them as unknown bytes.
    inside = _group(9, _append(1_001))
    assert len(spb.AppendEventsRequest.FromString(inside).events) == 0
    assert count_over(inside + b"\x0a\x01s", APPEND) is None


def test_malformed_groups_are_left_to_the_decoder() -> None:
    cap = RepeatedCap(2, 1, APPEND.error)
    assert count_over(bytes([9 << 3 | 3]) + b"\x12\x00" * 3, cap) is None  # never ends
    assert count_over(bytes([9 << 3 | 3, 10 << 3 | 4]) + b"\x12\x00" * 3, cap) is None
    assert count_over(bytes([9 << 3 | 4]) + b"\x12\x00" * 3, cap) is None  # an end alone
    deep = bytes([9 << 3 | 3]) * 101 + bytes([9 << 3 | 4]) * 101 + b"\x12\x00" * 3
    assert count_over(deep, cap) is None
    ok = bytes([9 << 3 | 3]) * 100 + bytes([9 << 3 | 4]) * 100 + b"\x12\x00" * 3
    assert count_over(ok, cap) == 2
