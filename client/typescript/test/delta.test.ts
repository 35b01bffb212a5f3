import assert from "node:assert/strict";
import { test } from "node:test";

import { ViewDelta } from "../src/gen/ctxcc/v1/compile_service.js";
import { MessageRole } from "../src/gen/ctxcc/v1/event.js";
import { type CompiledView, CompactionRequest } from "../src/gen/ctxcc/v1/view.js";
import { applyDelta, chainDigest, DeltaMismatch } from "../src/delta.js";
import { chained, encoded, fixture, makeDelta } from "./fixtures.js";

test("ts-proto's encoding of a decoded view is the daemon's serialization", () => {
  for (const n of [1, 2, 3]) {
    const { view, bytes } = fixture(n);
    assert.ok(encoded(view).equals(bytes), `view${n}`);
  }
});

test("a delta between real views rebuilds the later view byte for byte, base untouched", () => {
  for (const [from, to] of [[1, 2], [2, 3], [1, 3], [3, 1], [2, 2]]) {
    const base = fixture(from);
    const target = fixture(to);
    const got = applyDelta(base.view, makeDelta(base.view, target.view));
    assert.ok(encoded(got).equals(target.bytes), `${from}->${to}`);
    assert.ok(encoded(base.view).equals(base.bytes), `${from}->${to} changed its base`);
  }
});

test("the fixtures' deltas: kept messages, changed tools, sections from the base", () => {
  const [v1, v2, v3] = [fixture(1), fixture(2), fixture(3)];
  // v1->v2: the same turn goes on (v1's message kept, two appended); a tool was registered.
  let d = makeDelta(v1.view, v2.view);
  assert.equal(d.keptMessages, 1);
  assert.equal(d.appendedMessages.length, 2);
  assert.ok(d.toolsChanged);
  assert.equal(d.tools.length, 2);
  assert.ok(encoded(applyDelta(v1.view, d)).equals(v2.bytes));
  // v2->v3: tools unchanged; a rules section inserted after the kernel, v2's reused around it.
  d = makeDelta(v2.view, v3.view);
  assert.ok(!d.toolsChanged);
  assert.equal(d.tools.length, 0);
  assert.deepEqual(d.sections[0].slot, { $case: "baseIndex", value: 0 });
  assert.equal(d.sections[1].slot?.$case, "section");
  assert.ok(d.sections.filter((s) => s.slot?.$case === "baseIndex").length >= 2);
  const got = applyDelta(v2.view, d);
  assert.equal(got.systemPrompt, v3.view.systemPrompt);
  assert.ok(encoded(got).equals(v3.bytes));
});

test("tools emptied, messages kept in part, sections reordered", () => {
  const v2 = fixture(2).view;
  const v3 = fixture(3).view;
  const last = v2.systemSections[v2.systemSections.length - 1];
  const first = v2.systemSections[0];
  const target: CompiledView = {
    ...v3,
    tools: [],
    messages: [
      ...v2.messages.slice(0, 2),
      { ...v2.messages[0], role: MessageRole.MESSAGE_ROLE_USER, parts: [{ part: { $case: "text", value: "instead" }, authority: 0 }] },
    ],
    systemSections: [last, first],
    systemPrompt: `${last.text}\n\n${first.text}`,
  };
  const d = makeDelta(v2, target);
  assert.ok(d.toolsChanged);
  assert.equal(d.tools.length, 0);
  assert.equal(d.keptMessages, 2);
  const before = encoded(v2);
  const got = applyDelta(v2, d);
  assert.ok(encoded(got).equals(encoded(target)));
  assert.deepEqual(got.tools, []);
  assert.ok(encoded(v2).equals(before), "applying the delta changed its base");
});

test("every way a delta can go wrong is caught before the view is used", () => {
  const v2 = fixture(2).view;
  const v3 = fixture(3).view;
  const cases: Record<string, (d: ViewDelta) => void> = {
    "a flipped byte in a message": (d) => {
      const p = d.appendedMessages[0].parts[0].part!;
      assert.equal(p.$case, "text");
      const text = Buffer.from(p.value as string);
      text[0] ^= 1;
      p.value = text.toString();
    },
    "a flipped byte in the head": (d) => {
      d.head!.renderings[0].bodyJson = d.head!.renderings[0].bodyJson.replace("a", "b");
    },
    "a flipped digest": (d) => {
      d.viewSha256 = "0".repeat(64);
    },
    "a message more kept": (d) => {
      d.keptMessages++;
    },
    "more messages kept than the base has": (d) => {
      d.keptMessages = 99;
    },
    "a section index out of range": (d) => {
      d.sections[0] = { slot: { $case: "baseIndex", value: 99 } };
    },
    "another section of the base": (d) => {
      d.sections[0] = { slot: { $case: "baseIndex", value: 1 } };
    },
    "an empty slot": (d) => {
      d.sections[0] = { slot: undefined };
    },
    "tools emptied when they were not": (d) => {
      d.toolsChanged = true;
      d.tools = [];
    },
    "another base": (d) => {
      d.baseCompileId = "other";
    },
    "no head": (d) => {
      d.head = undefined;
    },
  };
  for (const [name, spoil] of Object.entries(cases)) {
    const d = makeDelta(v2, v3);
    spoil(d);
    assert.throws(() => applyDelta(v2, d), DeltaMismatch, name);
  }
  assert.throws(() => applyDelta(null, makeDelta(v2, v3)), DeltaMismatch, "no base");
});

test("message encodings carry over from view to view, and are really the ones hashed", () => {
  const [v1, v2, v3] = [fixture(1), fixture(2), fixture(3)];
  const records = new WeakMap();
  const got2 = applyDelta(v1.view, makeDelta(v1.view, v2.view), records);
  assert.ok(encoded(got2).equals(v2.bytes));
  assert.ok(got2.messages.every((m) => records.has(m)));
  // A delta from v2 to v2 itself keeps all of its messages; then on to v3.
  const again = applyDelta(got2, makeDelta(got2, v2.view), records);
  assert.ok(encoded(again).equals(v2.bytes));
  const got3 = applyDelta(again, makeDelta(again, v3.view), records);
  assert.ok(encoded(got3).equals(v3.bytes));
  const spoiled = new WeakMap();
  for (const m of again.messages) {
    const r = Uint8Array.from(records.get(m)!);
    r[r.length - 1] ^= 1;
    spoiled.set(m, r);
  }
  assert.throws(() => applyDelta(again, makeDelta(again, v2.view), spoiled), DeltaMismatch);
});

test("a delta keeping the base's compaction rebuilds the view with it, under either digest", () => {
  const c = CompactionRequest.fromPartial({ fromSeq: 1, throughSeq: 9, prompt: "Summarise this. ".repeat(500) });
  const withC = (n: number, req: CompactionRequest): CompiledView => ({ ...fixture(n).view, compaction: req });
  const kept = (base: CompiledView, target: CompiledView, chainedDigest: boolean): ViewDelta => {
    const d = makeDelta(base, target);
    d.head = { ...d.head!, compaction: undefined };
    d.compactionKept = true;
    return chainedDigest ? chained(d, chainDigest(target)) : d;
  };
  for (const chainedDigest of [false, true]) {
    const base = withC(2, c);
    const target = withC(3, c);
    const got = applyDelta(base, kept(base, target, chainedDigest));
    assert.ok(encoded(got).equals(encoded(target)), `chained ${chainedDigest}`);
    assert.equal(got.compaction?.prompt, c.prompt);
    const bare = fixture(2).view;
    assert.throws(() => applyDelta(bare, kept(bare, target, chainedDigest)), DeltaMismatch, "a base without one");
    const both = kept(base, target, chainedDigest);
    both.head = { ...both.head!, compaction: c };
    assert.throws(() => applyDelta(base, both), DeltaMismatch, "a head with its own");
    // The daemon's new view recommends another compaction: its digest catches the base's kept.
    const moved = withC(3, { ...c, throughSeq: c.throughSeq + 1 });
    assert.throws(() => applyDelta(base, kept(base, moved, chainedDigest)), DeltaMismatch, "another compaction");
  }
});
