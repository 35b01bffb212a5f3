"""What the step page shows of one compiled view, as plain values for its template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.compiler.view import Authority, ToolOrigin, ViewMessage
from server.domain.tools import ToolVisibility
from server.service.inspection import Step, relative_error
from server.web import charts, present

# How a text part says an image was not sent (R-IMG-2); see compiler/projection.py.
_IMAGE_NOTE = "[image "
_FENCED = (Authority.USER_CONTROLLABLE, Authority.UNTRUSTED)
TOOL_GROUPS = (
    ("direct", "offered in every request"),
    ("deferred, activated", "activated by a tool search this turn"),
    ("built-in", "added by ctxcc"),
    ("deferred, not activated", "in the registry, offered after a tool search"),
    ("hidden", "in the registry, never offered"),
)


def event_view(m: ViewMessage, budget: present.PageBudget) -> dict[str, Any]:
    """A view message for the page, its text parts and tool calls cut to what `budget`
    still allows (each part to MAX_PART_CHARS at most)."""
    parts = []
    for p in m.parts:
        if p.attachment is not None:
            a = p.attachment
            budget.item()
            parts.append({"kind": "image", "ref": a})
        elif p.text is not None:
            placeholder = p.text.startswith(_IMAGE_NOTE) and " not sent" in p.text
            cut = budget.cut(p.text)
            parts.append(
                {
                    "kind": "placeholder" if placeholder else "text",
                    "text": cut.text,
                    "omitted": cut.omitted,
                    "untrusted": p.authority == Authority.UNTRUSTED,
                }
            )
    # A call's name and id are whatever the model wrote, as long as its arguments, and an
    # imported message's origin whatever the client sent: cut with the page's text
    # (printed whole, four calls of 200,000 characters made a page of 12 MB).
    calls = [budget.cut(f"{c.name}({c.arguments_json}) [{c.call_id}]") for c in m.tool_calls]
    tool = (
        budget.cut(f"{m.tool_name} [{m.tool_call_id}]") if m.tool_name or m.tool_call_id else None
    )
    origin = budget.cut(m.origin_session_id) if m.origin_session_id else None
    budget.item()
    return {
        "role": present.name(m.role),
        "layer": present.name(m.layer),
        "tokens": m.tokens,
        "first_seq": m.first_seq,
        "last_seq": m.last_seq,
        "synthetic": m.synthetic,
        "is_error": m.is_error,
        "tool_calls": calls,
        "tool": tool,
        "origin": origin,
        "parts": parts,
    }


def event_views(
    messages: Sequence[ViewMessage], budget: present.PageBudget
) -> tuple[list[dict[str, Any]], int]:
    """`messages` for the page while `budget` lasts, and how many were left out."""
    out = []
    for m in messages:
        if budget.spent:
            break
        out.append(event_view(m, budget))
    return out, len(messages) - len(out)


def _tools(step: Step, budget: present.PageBudget) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {g: [] for g, _ in TOOL_GROUPS}
    offered = set()
    for t in step.view.tools:
        offered.add(t.spec.name)
        group = {
            ToolOrigin.DIRECT: "direct",
            ToolOrigin.ACTIVATED: "deferred, activated",
        }.get(t.origin, "built-in")
        groups[group].append(
            {
                "name": t.spec.name,
                "tokens": t.tokens,
                "description": budget.cut(t.spec.description),
                "origin": present.name(t.origin),
            }
        )
    for spec in step.registry:
        if spec.name in offered:
            continue
        group = "hidden" if spec.visibility == ToolVisibility.HIDDEN else "deferred, not activated"
        if spec.visibility == ToolVisibility.DIRECT and not step.view.tools_deferred_by_cap:
            continue  # registered after this step: not part of its view
        # Else over the route's tool cap (tool_cap.py): offered through tool_search.
        groups[group].append(
            {
                "name": spec.name,
                "tokens": 0,
                "description": budget.cut(spec.description),
                "origin": "",
            }
        )
    return groups


def step_context(step: Step, fmt: str) -> dict[str, Any]:
    """The step page's values. Its text is cut to one PageBudget, in the page's order
    (but for the notes, cut last): system sections, the checkpoint's summary, messages (a
    long view's last ones are left out), tool descriptions; the rendered body has a cut
    of its own."""
    view, b = step.view, step.view.budget
    budget = present.PageBudget()
    layers = {present.name(r.layer): r.tokens for r in view.layers}
    layers["provider_overhead"] = b.provider_overhead_tokens
    window = b.context_window or (b.input_budget + b.output_reserve)
    record = step.record
    sections = [
        {
            "index": i + 1,
            "kind": present.name(s.kind),
            "sources": s.sources,
            "scope": present.name(s.scope),
            "authority": present.name(s.authority),
            "fenced": s.authority in _FENCED,
            "tokens": s.tokens,
            "truncated": s.truncated,
            "stable": s.stable,
            "text": budget.cut(s.text),
        }
        for i, s in enumerate(view.system_sections)
    ]
    checkpoint = step.checkpoint
    summary = budget.cut(checkpoint.summary) if checkpoint else present.Cut("")
    messages, hidden = event_views(view.messages, budget)
    tools = _tools(step, budget)
    # A view's notes name what they are about (the id of a call repaired or dropped, of
    # any length), one per repair: cut with the page's text, and last, so a session
    # that makes many cannot crowd its messages off the page.
    notes = []
    for n in view.notes:
        if budget.spent:
            break
        notes.append(budget.cut(n))
    images = [(m, p) for m in messages for p in m["parts"] if p["kind"] in ("image", "placeholder")]
    return {
        "step": step,
        "session": step.session,
        "view": view,
        "budget": b,
        "layers": layers,
        "layer_order": present.LAYER_ORDER,
        "stack": charts.window_stack(layers, window, b.output_reserve, b.input_budget),
        "decision": present.name(view.decision),
        "method": present.name(b.estimate_method),
        "pressure": present.name(view.pressure_layer),
        "record": record,
        "recorded_layers": (
            present.layer_tokens(record.layer_tokens, record.estimated_input_tokens)
            if record and record.layer_tokens
            else {}
        ),
        "recorded_decision": present.decision_name(record.decision) if record else "",
        "recorded_error": relative_error(record) if record else None,
        "recorded_busts": present.busts(record.changed_sections) if record else [],
        "changed_sections": [present.name(k) for k in view.changed_sections],
        "previous": step.previous,
        "next": step.next,
        "sections": sections,
        "messages": messages,
        "hidden_messages": hidden,
        "images": images,
        "tools": tools,
        "notes": notes,
        "hidden_notes": len(view.notes) - len(notes),
        "tool_groups": TOOL_GROUPS,
        "fallbacks": [present.name(r) for r in view.fallback_reasons],
        "checkpoint": checkpoint,
        "summary": summary,
        "checkpoint_kind": present.name(checkpoint.kind) if checkpoint else "",
        "formats": list(present.FORMATS),
        "format": fmt,
        "body": present.pretty_body(step.rendering[1]) if step.rendering else "",
        "body_tokens": step.rendering[2] if step.rendering else 0,
        "model": view.route.model,
    }
