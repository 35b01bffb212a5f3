/** The chained digest (ViewDelta.chain_sha256): the daemon's values for real views, continued
 * from a base's chain values, every damage caught, and the stream asking for it by default. */
import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import {
  CompileServiceService,
  CompileStreamRequest,
  CompileStreamResponse,
  DeltaDigest,
  ViewDelta,
} from "../src/gen/ctxcc/v1/compile_service.js";
import { CompiledView } from "../src/gen/ctxcc/v1/view.js";
import { applyChainedDelta, applyDelta, chainDigest, DeltaMismatch, extendChain, PartRecords } from "../src/delta.js";
import { connect } from "../src/index.js";
import { chained, daemonApart, daemonChain, encoded, fixture, makeDelta } from "./fixtures.js";

const copy = (v: CompiledView): CompiledView => CompiledView.decode(CompiledView.encode(v).finish());

test("the chained digest of real views is the daemon's", () => {
  for (const n of [1, 2, 3]) assert.equal(chainDigest(fixture(n).view), daemonChain(n), `view${n}`);
});

test("chained deltas continue from the base's chain values, which are really the ones used", () => {
  let base = fixture(1).view;
  let values = extendChain([], 0, base.messages);
  for (const n of [2, 2, 3, 1]) {
    const target = fixture(n);
    const out = applyChainedDelta(base, chained(makeDelta(base, target.view), daemonChain(n)), values);
    assert.ok(encoded(out.view).equals(target.bytes), `to view${n}`);
    assert.equal(out.chain.length, out.view.messages.length);
    [base, values] = [out.view, out.chain];
  }
  const d = chained(makeDelta(base, fixture(2).view), daemonChain(2));
  assert.ok(d.keptMessages > 0);
  const spoiled = values.map((v) => Buffer.from(v));
  spoiled[0][0] ^= 1;
  assert.throws(() => applyChainedDelta(base, d, spoiled), DeltaMismatch);
});

test("every way a chained delta can go wrong is caught, a damaged kept message of the base too", () => {
  const v2 = fixture(2).view;
  const v3 = fixture(3).view;
  const target = copy(v3);
  target.messages = [...copy(v2).messages, ...target.messages];
  const sum = chainDigest(target);
  const fresh = () => chained(makeDelta(v2, target), sum);
  assert.equal(fresh().keptMessages, v2.messages.length);
  assert.ok(encoded(applyDelta(v2, fresh())).equals(encoded(target)));
  const cases: Record<string, (d: ViewDelta) => void> = {
    "a changed appended message": (d) => {
      d.appendedMessages[0].tokens++;
    },
    "a flipped byte in the head": (d) => {
      d.head!.renderings[0].bodyJson = d.head!.renderings[0].bodyJson.replace("a", "b");
    },
    "a note added to the head": (d) => {
      d.head!.notes.push("x");
    },
    "a flipped digest": (d) => {
      d.chainSha256 = "0".repeat(64);
    },
    "a message fewer kept": (d) => {
      d.keptMessages--;
    },
    "another section of the base": (d) => {
      d.sections[0] = { slot: { $case: "baseIndex", value: 1 } };
    },
    "tools emptied": (d) => {
      d.toolsChanged = true;
      d.tools = [];
    },
  };
  for (const [name, spoil] of Object.entries(cases)) {
    const d = fresh();
    spoil(d);
    assert.throws(() => applyDelta(v2, d), DeltaMismatch, name);
  }
  // The client's base differs from the daemon's in a kept message (its chain values are those
  // of the damaged message, as if it had arrived so).
  const damaged = copy(v2);
  damaged.messages[0].tokens++;
  assert.throws(() => applyChainedDelta(damaged, fresh(), extendChain([], 0, damaged.messages)), DeltaMismatch);
});

test("the stream asks for the chained digest unless told not to, and refetches a damaged one", async () => {
  const [v1, v2, v3] = [fixture(1), fixture(2), fixture(3)];
  for (const chainedDigest of [true, false]) {
    const asked: DeltaDigest[] = [];
    const server = new grpc.Server();
    server.addService(CompileServiceService, {
      compileStream: (call: grpc.ServerDuplexStream<CompileStreamRequest, CompileStreamResponse>) => {
        let n = 0;
        call.on("data", (req: CompileStreamRequest) => {
          n++;
          // Under the step's id, as the daemon answers (a resume's answer has none).
          const stepId = req.request?.$case === "step" ? req.request.value.stepId : "";
          const send = (response: CompileStreamResponse["response"]) => call.write(CompileStreamResponse.fromPartial({ stepId, response }));
          if (req.request?.$case === "resume") return send({ $case: "view", value: v3.view });
          if (req.request?.$case === "step") asked.push(req.request.value.deltaDigest);
          if (n === 1) return send({ $case: "view", value: v1.view });
          const [base, target, num] = n === 2 ? [v1, v2, 2] : [v2, v3, 3];
          const d = makeDelta(base.view, target.view);
          send({ $case: "delta", value: chainedDigest ? chained(d, daemonApart(num)) : d });
        });
        call.on("end", () => call.end());
      },
    } as unknown as grpc.UntypedServiceImplementation);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
    );
    const client = connect(`127.0.0.1:${port}`, { retrySeconds: 5 });
    const stream = client.openStream({
      chainedDigest,
      // The chained delta to v3 arrives with its head changed: fetched whole.
      onDelta: (d) => {
        if (d.chainSha256 && d.head?.compileId === v3.view.compileId) d.head.eventBoundary++;
      },
    });
    try {
      for (const want of [v1.bytes, v2.bytes, v3.bytes]) {
        const r = await stream.step({ sessionId: v1.view.sessionId }, []);
        assert.ok(encoded(r.view).equals(want));
      }
      const want = chainedDigest
        ? DeltaDigest.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
        : DeltaDigest.DELTA_DIGEST_UNSPECIFIED;
      assert.deepEqual(asked, [DeltaDigest.DELTA_DIGEST_UNSPECIFIED, want, want]);
      assert.deepEqual(
        [stream.stats.deltas, stream.stats.mismatches],
        chainedDigest ? [1, 1] : [2, 0],
      );
    } finally {
      stream.close();
      client.close();
      server.forceShutdown();
    }
  }
});

test("with the stream's part records, a chain of deltas checks as the whole views' digests say", () => {
  // Sections kept, swapped, changed; tools kept, dropped, back; middle fields there or not.
  const v3 = fixture(3).view;
  const noTools = { ...copy(v3), compileId: "c4", tools: [] };
  const swapped = { ...copy(noTools), compileId: "c5", systemSections: [...copy(noTools).systemSections].reverse() };
  swapped.systemPrompt = swapped.systemSections.map((s) => s.text).join("\n\n");
  const changed = { ...copy(swapped), compileId: "c6", prefixDigest: "", changedSections: [] };
  changed.systemSections[0].text += " and one more rule";
  changed.systemPrompt = changed.systemSections.map((s) => s.text).join("\n\n");
  const toolsBack = { ...copy(changed), compileId: "c7", tools: copy(v3).tools, renderings: [] };
  const views = [fixture(1).view, fixture(2).view, v3, noTools, swapped, changed, toolsBack];
  const parts = new PartRecords();
  let base = views[0];
  let values = extendChain([], 0, base.messages);
  for (const target of views.slice(1)) {
    const d = chained(makeDelta(base, target), chainDigest(target));
    const out = applyChainedDelta(base, d, values, parts);
    assert.ok(encoded(out.view).equals(encoded(target)), `to ${target.compileId}`);
    [base, values] = [out.view, out.chain];
  }
  // A record kept for the prompt or a section of another view fails the digest.
  const again = chained(makeDelta(base, toolsBack), chainDigest(toolsBack));
  again.head!.notes.push("x");
  assert.throws(() => applyChainedDelta(base, again, values, parts), DeltaMismatch);
});

test("the digest with the compaction apart of real views is the daemon's, and not the plain one", () => {
  for (const n of [1, 2, 3, 4, 5]) {
    assert.equal(chainDigest(fixture(n).view, true), daemonApart(n), `view${n}`);
    assert.notEqual(chainDigest(fixture(n).view, true), chainDigest(fixture(n).view), `view${n}`);
  }
});

test("with the compaction apart, a kept request is hashed once and its Q is part of the digest", () => {
  const [v3, v4, v5] = [fixture(3), fixture(4), fixture(5)];
  const parts = new PartRecords();
  const to4 = applyChainedDelta(v3.view, chained(makeDelta(v3.view, v4.view), daemonApart(4)), extendChain([], 0, v3.view.messages), parts, true);
  assert.ok(encoded(to4.view).equals(v4.bytes));
  const request = to4.view.compaction!;
  const q = parts.compactions.get(request);
  assert.ok(q, "Q of the request the delta brought is held");
  const kept = () => {
    const d = makeDelta(to4.view, v5.view);
    d.compactionKept = true;
    d.head!.compaction = undefined;
    return chained(d, daemonApart(5));
  };
  const to5 = applyChainedDelta(to4.view, kept(), to4.chain, parts, true);
  assert.ok(encoded(to5.view).equals(v5.bytes));
  assert.equal(to5.view.compaction, request, "the kept request is the same object");
  assert.equal(parts.compactions.get(request), q, "and its Q was not made again");
  // A wrong Q held for the kept request fails the digest.
  parts.compactions.set(request, Buffer.alloc(32, 1));
  assert.throws(() => applyChainedDelta(to4.view, kept(), to4.chain, parts, true), DeltaMismatch);
  // applyDelta is not told which chained digest was asked for: it takes either.
  for (const sum of [daemonApart(5), chainDigest(v5.view)]) {
    const d = kept();
    d.chainSha256 = sum;
    assert.ok(encoded(applyDelta(to4.view, d)).equals(v5.bytes));
  }
  assert.throws(() => applyDelta(to4.view, chained(kept(), "0".repeat(64))), DeltaMismatch);
});
