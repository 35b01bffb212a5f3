"""What changed between two compiled views: messages that entered, left or changed,
system sections whose text changed (a prompt-cache bust when it is a stable one),
tools offered or withdrawn, and the tokens per layer. Pure: views in, a diff out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from server.compiler.view import CompiledView, Layer, SectionKind, ViewMessage


@dataclass(frozen=True, slots=True)
class MessageChange:
    before: ViewMessage
    after: ViewMessage
    what: tuple[str, ...]  # "layer", "content", "tokens"


@dataclass(frozen=True, slots=True)
class SectionChange:
    kind: SectionKind
    before_tokens: int  # 0: absent before
    after_tokens: int  # 0: absent after
    stable: bool


@dataclass(frozen=True, slots=True)
class StepDiff:
    entered: tuple[ViewMessage, ...]
    left: tuple[ViewMessage, ...]
    changed: tuple[MessageChange, ...]
    sections: tuple[SectionChange, ...]
    prefix_changed: bool
    tools_added: tuple[str, ...]
    tools_removed: tuple[str, ...]
    # (layer, tokens in a, tokens in b)
    layers: tuple[tuple[Layer, int, int], ...]


def _key(m: ViewMessage) -> tuple[object, ...]:
    """A message's identity across views: where in the log it comes from."""
    return (m.role, m.first_seq, m.last_seq, m.tool_call_id, m.synthetic)


def _content(m: ViewMessage) -> str:
    h = hashlib.sha256()
    for p in m.parts:
        h.update((p.text or "").encode())
        h.update(b"\x00" + (p.attachment.artifact_id.encode() if p.attachment else b"") + b"\x00")
    for c in m.tool_calls:
        h.update(f"{c.call_id}\x00{c.name}\x00{c.arguments_json}\x00".encode())
    return h.hexdigest()


def diff_views(a: CompiledView, b: CompiledView) -> StepDiff:
    before = {_key(m): m for m in a.messages}
    after = {_key(m): m for m in b.messages}
    changed = []
    for key, new in after.items():
        old = before.get(key)
        if old is None:
            continue
        what = tuple(
            name
            for name, differs in (
                ("layer", old.layer != new.layer),
                ("content", _content(old) != _content(new)),
                ("tokens", old.tokens != new.tokens),
            )
            if differs
        )
        if what:
            changed.append(MessageChange(old, new, what))
    sa = {s.kind: s for s in a.system_sections}
    sb = {s.kind: s for s in b.system_sections}
    sections = []
    for kind in sorted(set(sa) | set(sb)):
        x, y = sa.get(kind), sb.get(kind)
        if x is not None and y is not None and x.text == y.text:
            continue
        sections.append(
            SectionChange(
                kind,
                x.tokens if x else 0,
                y.tokens if y else 0,
                (x or y).stable,  # type: ignore[union-attr]
            )
        )
    tools_a = {t.spec.name for t in a.tools}
    tools_b = {t.spec.name for t in b.tools}
    la = {r.layer: r.tokens for r in a.layers}
    lb = {r.layer: r.tokens for r in b.layers}
    return StepDiff(
        entered=tuple(m for k, m in after.items() if k not in before),
        left=tuple(m for k, m in before.items() if k not in after),
        changed=tuple(changed),
        sections=tuple(sections),
        prefix_changed=a.prefix_digest != b.prefix_digest,
        tools_added=tuple(sorted(tools_b - tools_a)),
        tools_removed=tuple(sorted(tools_a - tools_b)),
        layers=tuple((layer, la.get(layer, 0), lb.get(layer, 0)) for layer in Layer),
    )
