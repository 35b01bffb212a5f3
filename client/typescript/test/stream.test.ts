import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import {
  AppendResult,
  CompileServiceService,
  CompileStreamRequest,
  CompileStreamResponse,
  ReportUsageRequest,
  ReportUsageResponse,
  ViewDelta,
} from "../src/gen/ctxcc/v1/compile_service.js";
import type { CompiledView } from "../src/gen/ctxcc/v1/view.js";
import { connect, CtxccError, Stream, user, viewDigest, type Client } from "../src/index.js";
import { encoded, fixture, makeDelta } from "./fixtures.js";

type Answer = CompileStreamResponse[] | grpc.StatusObject;

/** A CompileService whose stream answers each request with what `answer` returns (or resolves
 * to) for it, in order (a status ends the stream), recording every request with the number of
 * its stream. An answer to a step or a resume goes under its id, as the daemon sends it, unless
 * it has one already (`verbatim`: every answer as `answer` made it); `twice` sends every
 * response twice in a row, as a proxy that duplicates messages delivers them. */
async function scripted(
  answer: (n: number, req: CompileStreamRequest, stream: number) => Answer | Promise<Answer>,
  { verbatim = false, twice = false } = {},
) {
  const got: Array<{ stream: number; req: CompileStreamRequest }> = [];
  const reports: ReportUsageRequest[] = []; // the unary ones
  const sent = { bytes: 0 };
  let streams = 0;
  const server = new grpc.Server();
  server.addService(CompileServiceService, {
    compileStream: (call: grpc.ServerDuplexStream<CompileStreamRequest, CompileStreamResponse>) => {
      const stream = ++streams;
      // Answers go out in the order the requests came, also when one is awaited.
      let turn: Promise<void> = Promise.resolve();
      call.on("data", (req: CompileStreamRequest) => {
        got.push({ stream, req });
        const n = got.length;
        turn = turn.then(async () => {
          const out = await answer(n, req, stream);
          if (Array.isArray(out)) {
            for (const r of out) {
              if (!verbatim && !r.stepId && req.request) r.stepId = req.request.value.stepId;
              for (let copy = 0; copy < (twice ? 2 : 1); copy++) {
                sent.bytes += CompileStreamResponse.encode(r).finish().length;
                call.write(r);
              }
            }
          }
          else call.emit("error", out);
        });
      });
      call.on("end", () => void turn.then(() => call.end()));
    },
    reportUsage: (call: grpc.ServerUnaryCall<ReportUsageRequest, ReportUsageResponse>, done: grpc.sendUnaryData<ReportUsageResponse>) => {
      reports.push(call.request);
      done(null, ReportUsageResponse.fromPartial({ estimatedInputTokens: 1 }));
    },
  } as unknown as grpc.UntypedServiceImplementation);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const client: Client = connect(`127.0.0.1:${port}`, { retrySeconds: 5 });
  const stop = () => {
    client.close();
    server.forceShutdown();
  };
  return { got, sent, client, stop, reports };
}

const whole = (view: CompiledView): CompileStreamResponse[] => [CompileStreamResponse.fromPartial({ response: { $case: "view", value: view } })];
const delta = (d: ViewDelta, append?: Partial<AppendResult>): CompileStreamResponse[] => [
  CompileStreamResponse.fromPartial({ response: { $case: "delta", value: d }, append }),
];

/** A view in two chunks, as the daemon sends one above its chunk size. */
function chunked(view: CompiledView): CompileStreamResponse[] {
  const data = encoded(view);
  const sha256 = createHash("sha256").update(data).digest("hex");
  return [data.subarray(0, data.length >> 1), data.subarray(data.length >> 1)].map((part, index) =>
    CompileStreamResponse.fromPartial({ response: { $case: "chunk", value: { compileId: view.compileId, index, count: 2, data: part, sha256 } } }),
  );
}

const baseOf = (r: { req: CompileStreamRequest }): string | undefined =>
  r.req.request?.$case === "step" ? r.req.request.value.deltaBaseCompileId : undefined;

type Got = Array<{ stream: number; req: CompileStreamRequest }>;

/** A daemon going away: the answer that makes a step pause and retry. */
const restarting = (): grpc.StatusObject => ({ code: grpc.status.UNAVAILABLE, details: "restarting", metadata: new grpc.Metadata() });

/** Resolves once the scripted daemon has received `n` requests. */
async function received(got: Got, n: number): Promise<void> {
  while (got.length < n) await new Promise((r) => setTimeout(r, 1));
}

/** Every step request received carried the same, non-empty request id (a resend, never a new step). */
function oneRequestId(got: Got): void {
  const ids = got.map((g) => (g.req.request?.$case === "step" ? g.req.request.value.requestId : ""));
  assert.ok(ids[0] !== "" && ids.every((id) => id === ids[0]), `request ids ${ids.join(", ")}`);
}

test("deltas are applied, a mismatch is fetched whole, a reopened stream names no base", async () => {
  const [v1, v2, v3] = [fixture(1), fixture(2), fixture(3)];
  const d12 = makeDelta(v1.view, v2.view);
  const d23 = makeDelta(v2.view, v3.view);
  const { got, sent, client, stop } = await scripted((n) => {
    switch (n) {
      case 1: return whole(v1.view);
      case 2: return delta(d12, { firstSeq: 2, lastSeq: 3 });
      case 3: return delta(d23, { firstSeq: 4, lastSeq: 5 });
      case 4: return chunked(v3.view); // the resume after the mismatch
      case 5: return restarting();
      default: return whole(v3.view);
    }
  });
  let corrupted = 0;
  const stream = client.openStream({
    onDelta: (d) => {
      if (d.head?.compileId === v3.view.compileId) {
        corrupted++;
        d.appendedMessages[0].tokens++;
      }
    },
  });
  try {
    const compile = { sessionId: v1.view.sessionId, route: v1.view.route };
    const results = [];
    for (const want of [v1.bytes, v2.bytes, v3.bytes, v3.bytes]) {
      const r = await stream.step(compile, [user("step")]);
      assert.ok(encoded(r.view).equals(want), `step ${results.length + 1}`);
      results.push(r);
    }
    assert.equal(corrupted, 1);
    assert.deepEqual(stream.stats, { whole: 3, deltas: 1, mismatches: 1, bytes: sent.bytes, stale: 0 });
    assert.ok(sent.bytes > 0);
    // The refetched view comes with the append of the step whose delta failed.
    assert.equal(results[2].append?.firstSeq, 4);
    assert.equal(got.length, 6);
    assert.deepEqual(got.slice(0, 3).map(baseOf), ["", v1.view.compileId, v2.view.compileId]);
    const resume = got[3].req.request;
    assert.equal(resume?.$case, "resume");
    assert.equal(resume.value.compileId, v3.view.compileId);
    assert.equal(resume.value.compile?.sessionId, v1.view.sessionId);
    assert.deepEqual(resume.value.compile?.route, v1.view.route);
    assert.equal(baseOf(got[4]), v3.view.compileId);
    assert.equal(got[4].stream, 1);
    // The step resent after the daemon went away: a new stream, no base, the same request id.
    assert.equal(baseOf(got[5]), "");
    assert.equal(got[5].stream, 2);
    const ids = [got[4], got[5]].map((r) => (r.req.request?.$case === "step" ? r.req.request.value.requestId : ""));
    assert.ok(ids[0] && ids[0] === ids[1]);
  } finally {
    stream.close();
    stop();
  }
});

test("without deltas no step names a base; an unasked-for delta is fetched whole", async () => {
  const [v1, v2] = [fixture(1), fixture(2)];
  const { got, sent, client, stop } = await scripted((n) => (n === 1 ? whole(v1.view) : n === 2 ? delta(makeDelta(v1.view, v2.view)) : whole(v2.view)));
  const stream = client.openStream({ deltas: false });
  try {
    let view: CompiledView | undefined;
    for (let i = 0; i < 3; i++) view = (await stream.step({ sessionId: v1.view.sessionId })).view;
    assert.ok(encoded(view!).equals(v2.bytes));
    for (const r of got) if (r.req.request?.$case === "step") assert.equal(baseOf(r), "");
    assert.equal(got.length, 4);
    assert.equal(got[2].req.request?.$case, "resume");
    assert.deepEqual(stream.stats, { whole: 3, deltas: 0, mismatches: 1, bytes: sent.bytes, stale: 0 });
  } finally {
    stream.close();
    stop();
  }
});

test("a daemon whose deltas never check out is asked for whole views after three failures", async () => {
  const [v1, v2] = [fixture(1), fixture(2)];
  const bad = makeDelta(v1.view, v2.view);
  bad.viewSha256 = "0".repeat(64);
  const { got, client, stop } = await scripted((_n, req) =>
    req.request?.$case === "step" && req.request.value.deltaBaseCompileId ? delta(bad) : whole(v1.view),
  );
  const stream = client.openStream();
  try {
    for (let i = 0; i < 6; i++) await stream.step({});
    assert.equal(stream.stats.mismatches, 3);
    assert.equal(stream.stats.deltas, 0);
    assert.equal(baseOf(got[got.length - 1]), "");
  } finally {
    stream.close();
    stop();
  }
});

test("chunks that do not fit their view fail the step instead of waiting for more", async () => {
  const v1 = fixture(1);
  const cases: Array<Array<{ index: number; count: number }>> = [
    [{ index: 2, count: 2 }],
    [{ index: 0, count: 0 }],
    [{ index: 0, count: (1 << 16) + 1 }],
    [{ index: 0, count: 2 }, { index: 2, count: 3 }],
  ];
  for (const chunks of cases) {
    const { client, stop } = await scripted(() =>
      chunks.map((c) => CompileStreamResponse.fromPartial({ response: { $case: "chunk", value: { compileId: "c", ...c, data: Buffer.from("x"), sha256: "" } } })),
    );
    const stream = client.openStream({ deltas: false });
    try {
      await assert.rejects(stream.step({ sessionId: v1.view.sessionId }), /chunk/, JSON.stringify(chunks));
    } finally {
      stream.close();
      stop();
    }
  }
});

test("a queued usage report rides on the next step; refused it is dropped, unsent it is kept", async () => {
  const v1 = fixture(1);
  const { got, client, stop, reports } = await scripted((n, req) => {
    if (n === 2) {
      const error = { code: grpc.status.NOT_FOUND, reason: "COMPILE_NOT_FOUND", message: "no such compile", usageRefused: true };
      return [CompileStreamResponse.fromPartial({ response: { $case: "error", value: error } })];
    }
    if (n === 4) return restarting();
    const carried = req.request?.$case === "step" && req.request.value.usage;
    return [CompileStreamResponse.fromPartial({ response: { $case: "view", value: v1.view }, usage: carried ? { errorTokens: 5 } : undefined })];
  });
  // No retries: the daemon that goes away fails its step at once.
  const stream = new Stream(client.compiles.raw, 0, undefined, {}, (req) => client.compiles.reportUsage(req));
  try {
    const compile = { sessionId: v1.view.sessionId };
    assert.equal((await stream.step(compile)).usage, undefined);
    assert.equal(await stream.reportUsage({ compileId: "bad", inputTokens: 9 }), undefined);
    await assert.rejects(stream.step(compile), (err: CtxccError) => err.usageRefused && err.reason === "COMPILE_NOT_FOUND");
    assert.equal((await stream.step(compile)).usage, undefined, "the refused report was dropped");
    await stream.reportUsage({ compileId: "good", inputTokens: 9 });
    await assert.rejects(stream.step(compile), (err: CtxccError) => !err.usageRefused && err.code === grpc.status.UNAVAILABLE);
    const after = await stream.step(compile);
    assert.equal(after.usage?.errorTokens, 5);
    assert.equal(stream.lastUsage?.errorTokens, 5);
    const carried = got.map((r) => (r.req.request?.$case === "step" ? (r.req.request.value.usage?.compileId ?? "") : "?"));
    assert.deepEqual(carried, ["", "bad", "", "good", "good"]);
    await stream.reportUsage({ compileId: "third" });
    const sent = await stream.reportUsage({ compileId: "fourth" });
    assert.equal(sent?.estimatedInputTokens, 1, "a second queued report sends the first");
    await stream.close();
    assert.deepEqual(reports.map((r) => r.compileId), ["third", "fourth"]);
  } finally {
    await stream.close();
    stop();
  }
});

test("a step that failed in-band keeps its request id for the same events; the next step gets a new one", async () => {
  const v1 = fixture(1);
  const { got, client, stop } = await scripted((n) => {
    if (n === 1) {
      // The compile failed after the append (over the daemon's CPU budget, say).
      const error = {
        code: grpc.status.RESOURCE_EXHAUSTED,
        reason: "QUOTA_EXCEEDED",
        message: "over budget",
        metadata: { quota: "compile_cpu_budget_ms", limit: "30000" },
      };
      return [CompileStreamResponse.fromPartial({ response: { $case: "error", value: error }, append: { firstSeq: 1, lastSeq: 1 } })];
    }
    return whole(v1.view);
  });
  const stream = client.openStream();
  try {
    const compile = { sessionId: v1.view.sessionId };
    const events = [user("one")];
    await assert.rejects(
      stream.step(compile, events),
      (err: CtxccError) => err.reason === "QUOTA_EXCEEDED" && err.metadata.limit === "30000",
      "a step's error carries the metadata a unary call's would",
    );
    await stream.step(compile, events);
    await stream.step(compile, events);
    const ids = got.map((r) => (r.req.request?.$case === "step" ? r.req.request.value.requestId : "?"));
    assert.equal(ids.length, 3);
    assert.notEqual(ids[0], "");
    assert.equal(ids[1], ids[0], "the failed step's events were appended: the same id replays them");
    assert.notEqual(ids[2], ids[0], "a step after a success is a new step");
  } finally {
    await stream.close();
    stop();
  }
});

test("a report queued while a step runs never loses the step's own", async () => {
  // The step carrying c1 waits for its answer when c2 is queued, then its stream fails
  // without the daemon recording c1: c1 goes by the unary call, c2 rides on. The client
  // before queued c2 at once, and the failed step, finding the queue taken, dropped c1.
  const { client, stop } = await scripted(() => []);
  const unary: string[] = [];
  const stream = new Stream(client.compiles.raw, 0, undefined, {}, async (req) => {
    unary.push(req.compileId);
    return ReportUsageResponse.fromPartial({});
  });
  try {
    await stream.reportUsage({ compileId: "c1", inputTokens: 9 });
    const step = stream.step({ sessionId: "s" }, [user("one")]);
    await new Promise((r) => setTimeout(r, 50));
    const second = stream.reportUsage({ compileId: "c2", inputTokens: 9 });
    await new Promise((r) => setTimeout(r, 20));
    stop();
    await assert.rejects(step);
    await second;
    await stream.flushUsage();
    assert.deepEqual(unary, ["c1", "c2"]);
  } finally {
    await stream.close();
  }
});

test("every response delivered twice: a copy read at a later step is skipped, each step gets its own answer", async () => {
  // Before, the copy was taken for the next step's answer, and every step from then on
  // returned the previous step's view.
  const [v1, v2, v3, v4, v5] = [fixture(1), fixture(2), fixture(3), fixture(4), fixture(5)];
  const error = { code: grpc.status.FAILED_PRECONDITION, reason: "SEQUENCE_MISMATCH", message: "head moved" };
  const { got, client, stop } = await scripted(
    (n) => {
      switch (n) {
        case 1: return whole(v1.view);
        case 2: return delta(makeDelta(v1.view, v2.view), { firstSeq: 2, lastSeq: 3 });
        case 3: return chunked(v3.view);
        case 4: return delta(makeDelta(v3.view, v4.view));
        case 5: return [CompileStreamResponse.fromPartial({ response: { $case: "error", value: error } })];
        default: return whole(v5.view);
      }
    },
    { twice: true },
  );
  const stream = new Stream(client.compiles.raw, 0);
  try {
    const compile = { sessionId: v1.view.sessionId, route: v1.view.route };
    const results = [];
    for (const [i, want] of [v1.bytes, v2.bytes, v3.bytes, v4.bytes].entries()) {
      const r = await stream.step(compile);
      assert.ok(encoded(r.view).equals(want), `step ${i + 1}: not the step's own view`);
      results.push(r);
    }
    await assert.rejects(stream.step(compile), (err: CtxccError) => err.reason === "SEQUENCE_MISMATCH");
    assert.ok(encoded((await stream.step(compile)).view).equals(v5.bytes), "step 6");
    assert.equal(results[1].append?.lastSeq, 3);
    assert.equal(results[2].append, undefined, "step 3 took step 2's append from its copy");
    // Read at a later step: the copies of the view, the delta, the last chunk, the delta and the
    // error (the first chunk's copy came within its own step).
    const { stale, mismatches, deltas, whole: wholes } = stream.stats;
    assert.deepEqual({ stale, mismatches, deltas, wholes }, { stale: 5, mismatches: 0, deltas: 2, wholes: 3 });
    assert.equal(got.length, 6);
    assert.ok(got.every((r) => r.stream === 1), "a copy of an earlier answer reopened the stream");
  } finally {
    await stream.close();
    stop();
  }
});

test("while a step's resume is in flight a copy of the step's own delta is skipped", async () => {
  const [v1, v2] = [fixture(1), fixture(2)];
  const { got, client, stop } = await scripted((n, req) => {
    if (req.request?.$case === "resume") return whole(v2.view);
    if (n === 1) return whole(v1.view);
    const d = makeDelta(v1.view, v2.view); // damaged by onDelta below, and a copy of it
    return [...delta(d), ...delta(d)];
  });
  let damaged = 0;
  const stream = new Stream(client.compiles.raw, 0, undefined, {
    onDelta: (d) => {
      damaged++;
      d.appendedMessages[0].tokens++;
    },
  });
  try {
    const compile = { sessionId: v1.view.sessionId };
    await stream.step(compile);
    const r = await stream.step(compile);
    assert.ok(encoded(r.view).equals(v2.bytes), "not the view its resume fetched");
    assert.deepEqual([stream.stats.stale, stream.stats.mismatches, damaged], [1, 1, 1]);
    assert.deepEqual(got.map((g) => [g.stream, g.req.request?.$case]), [[1, "step"], [1, "step"], [1, "resume"]]);
  } finally {
    await stream.close();
    stop();
  }
});

test("an answer for no step the stream sent is never returned: the step is resent on a new stream", async () => {
  const [v1, v2, v3] = [fixture(1), fixture(2), fixture(3)];
  for (const id of ["7", "", "x2"]) {
    const { got, client, stop } = await scripted(
      (n, req) => {
        const stepId = req.request?.$case === "step" ? req.request.value.stepId : "";
        if (n === 2) {
          // Another view, and an append the step must not report.
          return [CompileStreamResponse.fromPartial({ stepId: id, response: { $case: "view", value: v3.view }, append: { firstSeq: 9, lastSeq: 9 } })];
        }
        return [CompileStreamResponse.fromPartial({ stepId, response: { $case: "view", value: n === 1 ? v1.view : v2.view } })];
      },
      { verbatim: true },
    );
    const stream = client.openStream();
    try {
      const compile = { sessionId: v1.view.sessionId };
      await stream.step(compile, [user("one")]);
      const r = await stream.step(compile, [user("two")]);
      assert.ok(encoded(r.view).equals(v2.bytes), `step id ${JSON.stringify(id)}: step 2 returned another step's answer`);
      assert.equal(r.append, undefined);
      assert.equal(got.length, 3);
      const [sent, again] = [got[1], got[2]];
      assert.deepEqual([sent.stream, again.stream, baseOf(again)], [1, 2, ""]);
      const step = (g: { req: CompileStreamRequest }) => (g.req.request?.$case === "step" ? g.req.request.value : undefined);
      assert.equal(step(again)?.requestId, step(sent)?.requestId);
      assert.equal(step(again)?.stepId, step(sent)?.stepId);
    } finally {
      await stream.close();
      stop();
    }
  }
});

type Relay = (stream: number, req: CompileStreamRequest, answer: CompileStreamResponse[]) => CompileStreamResponse[];

/** A proxy of the daemon `up` serves, as the answer of `scripted`: each request goes on to the
 * daemon, on one call of its own per scripted stream, and what `relay` makes of the daemon's
 * answer to it (its messages up to the view, the last chunk, the delta or the error) is sent. */
function forward(up: Client, relay: Relay) {
  const calls = new Map<number, { call: grpc.ClientDuplexStream<CompileStreamRequest, CompileStreamResponse>; next: () => Promise<CompileStreamResponse> }>();
  const upstream = (stream: number) => {
    const known = calls.get(stream);
    if (known) return known;
    const call = up.compiles.raw.compileStream();
    const buffered: CompileStreamResponse[] = [];
    const waiting: Array<{ resolve: (r: CompileStreamResponse) => void; reject: (e: unknown) => void }> = [];
    let failure: unknown = null;
    call.on("data", (r: CompileStreamResponse) => {
      const w = waiting.shift();
      if (w) w.resolve(r);
      else buffered.push(r);
    });
    call.on("error", (err) => {
      failure = err;
      for (const w of waiting.splice(0)) w.reject(err);
    });
    const next = (): Promise<CompileStreamResponse> => {
      const r = buffered.shift();
      if (r) return Promise.resolve(r);
      if (failure) return Promise.reject(failure);
      return new Promise((resolve, reject) => waiting.push({ resolve, reject }));
    };
    const entry = { call, next };
    calls.set(stream, entry);
    return entry;
  };
  const answer = async (_n: number, req: CompileStreamRequest, stream: number): Promise<Answer> => {
    const { call, next } = upstream(stream);
    call.write(req);
    const out: CompileStreamResponse[] = [];
    for (;;) {
      const r = await next();
      out.push(r);
      const resp = r.response;
      if (resp?.$case !== "chunk" || resp.value.index + 1 === resp.value.count) return relay(stream, req, out);
    }
  };
  const close = () => {
    for (const { call } of calls.values()) call.cancel();
  };
  return { answer, close };
}

// The daemon the tests that need one run against: tests/e2e/test_clients.py starts it and sets
// CTXCC_TARGET (skipped without it).
const daemonTarget = process.env.CTXCC_TARGET;

test(
  "against a daemon: an earlier resume's answer delivered again late is never taken",
  { skip: daemonTarget ? false : "CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)" },
  async () => {
    // A proxy damages every delta's digest, so each step with a delta fetches its view whole
    // with a ResumeRequest, and delivers each resume's answer a second time right after the next
    // delta, while that step's own resume is awaited. The copy carries the earlier resume's step
    // id: skipped, every step gets its own view on one stream. Cleared of its id, it is not taken
    // either (the daemon echoed the first resume's id, so an empty one answers nothing the stream
    // sent): the stream is reopened and the step resent. A daemon too old to echo the id (the
    // proxy clears it on every resume's answer, and sends no copies) still gets its resumes
    // taken. Before resumes had ids, the copy (no id, as every resume's answer) was returned as
    // step 3's view: step 2's.
    const up = connect(daemonTarget!, { retrySeconds: 5 });
    const cases = [
      { name: "copies with their id", copies: true, clear: false, oldEcho: false, stale: 2, streams: 1, copied: 2 },
      // Step 3 is resent on a new stream (no base: whole, no resume); step 4 resumes there and
      // no delta follows to carry its answer's copy.
      { name: "copies without an id", copies: true, clear: true, oldEcho: false, stale: 0, streams: 2, copied: 1 },
      { name: "a daemon that does not echo", copies: false, clear: false, oldEcho: true, stale: 0, streams: 1, copied: 0 },
    ];
    try {
      for (const c of cases) {
        const held = new Map<number, CompileStreamResponse[]>();
        let copied = 0;
        const proxy = forward(up, (stream, req, answer) => {
          if (req.request?.$case === "resume") {
            for (const r of answer) {
              if (c.copies) held.set(stream, [...(held.get(stream) ?? []), CompileStreamResponse.fromPartial({ ...r, stepId: c.clear ? "" : r.stepId })]);
              if (c.oldEcho) r.stepId = "";
            }
            return answer;
          }
          const first = answer[0].response;
          if (first?.$case === "delta") {
            if (first.value.chainSha256) first.value.chainSha256 = "0".repeat(64);
            else first.value.viewSha256 = "0".repeat(64);
            const copies = held.get(stream) ?? [];
            held.delete(stream);
            copied += copies.length;
            return [...answer, ...copies];
          }
          return answer;
        });
        const { got, client, stop } = await scripted(proxy.answer, { verbatim: true });
        const stream = client.openStream();
        try {
          const session = await up.createSession();
          const compile = { sessionId: session.sessionId, route: { connection: "example", protocol: "fake", endpoint: "local", model: "gpt-4o" } };
          for (let n = 1; n <= 4; n++) {
            const r = await stream.step(compile, [user(`ask ${n}`)]);
            assert.equal(r.view.eventBoundary, n, `${c.name}: step ${n} was handed step ${r.view.eventBoundary}'s view`);
            assert.equal(r.append?.lastSeq, n);
            const again = await up.compile({ rebuildCompileId: r.view.compileId });
            assert.equal(viewDigest(r.view), viewDigest(again), `${c.name}: step ${n}: not its compile rebuilt whole`);
          }
          const { stale, mismatches } = stream.stats;
          const streams = new Set(got.map((g) => g.stream)).size;
          assert.deepEqual({ stale, mismatches, streams, copied }, { stale: c.stale, mismatches: 3, streams: c.streams, copied: c.copied }, c.name);
        } finally {
          await stream.close();
          proxy.close();
          stop();
        }
      }
    } finally {
      up.close();
    }
  },
);

test("a step bounded by its signal, or cut short by close, rejects and keeps its request id for the same events", async () => {
  const v1 = fixture(1).view;
  // The first two steps are never answered (a stalled daemon or connection); then whole views.
  const { got, client, stop } = await scripted((n) => (n <= 2 ? new Promise<Answer>(() => {}) : whole(v1)));
  try {
    const stream = client.openStream();
    const req = { sessionId: v1.sessionId, route: v1.route };
    const events = [user("please run the tests")];
    await assert.rejects(stream.step(req, events, { signal: AbortSignal.timeout(200) }), (err: unknown) => {
      assert.equal((err as Error).name, "TimeoutError");
      return true;
    });
    const waiting = stream.step(req, events);
    await received(got, 2);
    await stream.close();
    await assert.rejects(waiting, (err: unknown) => err instanceof CtxccError && err.code === grpc.status.CANCELLED && err.reason === "STREAM_CLOSED");
    const { view } = await stream.step(req, events);
    assert.equal(view.compileId, v1.compileId);
    assert.equal(got.length, 3);
    oneRequestId(got);
    assert.equal(new Set(got.map((g) => g.stream)).size, 3); // each cut call was dropped
  } finally {
    stop();
  }
});

test("a step aborted while it waits to retry rejects with the signal's reason and sends no further attempt", async () => {
  const v1 = fixture(1).view;
  // The first attempt finds the daemon going away; any later one would be answered.
  const { got, client, stop } = await scripted((n) =>
    n === 1 ? restarting() : whole(v1),
  );
  try {
    const stream = client.openStream();
    const req = { sessionId: v1.sessionId, route: v1.route };
    const events = [user("please run the tests")];
    const controller = new AbortController();
    const stepping = stream.step(req, events, { signal: controller.signal });
    // Abort once the first attempt failed, while the step pauses before its retry.
    await received(got, 1);
    await new Promise((r) => setTimeout(r, 5));
    controller.abort(new Error("caller gave up"));
    await assert.rejects(stepping, /caller gave up/);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(got.length, 1, "an aborted step is not sent again");
    // The same events sent again reuse the step's request id.
    const { view } = await stream.step(req, events);
    assert.equal(view.compileId, v1.compileId);
    oneRequestId(got);
  } finally {
    stop();
  }
});

test("a step pausing before a retry when the stream is closed fails STREAM_CLOSED and opens no call after the close", async () => {
  const v1 = fixture(1).view;
  const { got, client, stop } = await scripted((n) =>
    n === 1 ? restarting() : whole(v1),
  );
  try {
    const stream = client.openStream();
    const req = { sessionId: v1.sessionId, route: v1.route };
    const events = [user("please run the tests")];
    const stepping = stream.step(req, events);
    await received(got, 1);
    await new Promise((r) => setTimeout(r, 5));
    await stream.close();
    await assert.rejects(stepping, (err: unknown) => err instanceof CtxccError && err.reason === "STREAM_CLOSED");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(got.length, 1, "nothing is sent on the closed stream");
    // The stream is usable again, and the same events reuse the step's request id.
    const { view } = await stream.step(req, events);
    assert.equal(view.compileId, v1.compileId);
    oneRequestId(got);
    await stream.close();
  } finally {
    stop();
  }
});

test("close while a step carrying a usage report waits sends the report by the unary call", async () => {
  const v1 = fixture(1).view;
  // The step is never answered (a stalled daemon): close cuts it.
  const { got, client, stop, reports } = await scripted(() => new Promise<Answer>(() => {}));
  try {
    const stream = client.openStream();
    await stream.reportUsage({ compileId: "earlier", inputTokens: 9 });
    const waiting = stream.step({ sessionId: v1.sessionId, route: v1.route }, [user("go on")]);
    await received(got, 1);
    await stream.close();
    await assert.rejects(waiting, (err: unknown) => err instanceof CtxccError && err.reason === "STREAM_CLOSED");
    // The daemon may or may not have recorded it before the cut; a replay is harmless, a loss is not.
    assert.deepEqual(reports.map((r) => r.compileId), ["earlier"]);
  } finally {
    stop();
  }
});

test("a step called before close and waiting its turn fails STREAM_CLOSED too; one called after runs", async () => {
  const v1 = fixture(1).view;
  const { got, client, stop } = await scripted((n) => (n === 1 ? new Promise<Answer>(() => {}) : whole(v1)));
  try {
    const stream = client.openStream();
    const req = { sessionId: v1.sessionId, route: v1.route };
    const first = stream.step(req, [user("one")]);
    const queued = stream.step(req, [user("two")]);
    await received(got, 1);
    const closing = stream.close();
    const after = stream.step(req, [user("three")]);
    await closing;
    for (const step of [first, queued]) {
      await assert.rejects(step, (err: unknown) => err instanceof CtxccError && err.reason === "STREAM_CLOSED");
    }
    assert.equal((await after).view.compileId, v1.compileId);
    const texts = got.map((g) => (g.req.request?.$case === "step" ? g.req.request.value.events.map((e) => JSON.stringify(e.payload)).join() : ""));
    assert.equal(got.length, 2, texts.join(" | "));
    assert.ok(texts[1].includes("three"), texts[1]);
  } finally {
    stop();
  }
});

test("a step aborted while it waits its turn behind a stalled step rejects at once and is never sent", async () => {
  const v1 = fixture(1).view;
  // The first step is never answered (a stalled daemon or connection); then whole views.
  const { got, client, stop } = await scripted((n) => (n === 1 ? new Promise<Answer>(() => {}) : whole(v1)));
  try {
    const stream = client.openStream();
    const req = { sessionId: v1.sessionId, route: v1.route };
    const first = stream.step(req, [user("one")]);
    first.catch(() => undefined);
    const controller = new AbortController();
    const queued = stream.step(req, [user("two")], { signal: controller.signal });
    let settled: unknown = "pending";
    queued.then(
      () => (settled = "resolved"),
      (err: unknown) => (settled = err),
    );
    await received(got, 1);
    controller.abort(new Error("caller gave up"));
    // A step called with a signal already aborted, behind the same stalled one.
    let late: unknown = "pending";
    stream.step(req, [user("three")], { signal: AbortSignal.abort(new Error("too late")) }).then(
      () => (late = "resolved"),
      (err: unknown) => (late = err),
    );
    // The rejections are settled by the aborts themselves, before any I/O or timer of this loop.
    await new Promise((r) => setImmediate(r));
    assert.ok(settled instanceof Error && /caller gave up/.test(settled.message), `the queued step is ${String(settled)}`);
    assert.ok(late instanceof Error && /too late/.test(late.message), `the step called aborted is ${String(late)}`);
    await stream.close();
    await assert.rejects(first, (err: unknown) => err instanceof CtxccError && err.reason === "STREAM_CLOSED");
    assert.equal(got.length, 1, "the aborted steps are never sent");
    // The stream is usable again.
    assert.equal((await stream.step(req, [user("four")])).view.compileId, v1.compileId);
  } finally {
    stop();
  }
});

test("a step refused in-band for a transient quota is sent again on the same stream; a lasting quota fails at once", async () => {
  const v1 = fixture(1);
  for (const [quota, sent] of [
    ["request_bytes_in_memory", 3],
    ["max_message_bytes", 1],
  ] as const) {
    const { got, client, stop } = await scripted((n) => {
      if (n < 3) {
        const error = { code: grpc.status.RESOURCE_EXHAUSTED, reason: "QUOTA_EXCEEDED", message: "retry later", metadata: { quota, limit: "1048576" } };
        return [CompileStreamResponse.fromPartial({ response: { $case: "error", value: error } })];
      }
      return whole(v1.view);
    });
    const stream = client.openStream();
    try {
      const step = stream.step({ sessionId: v1.view.sessionId }, [user("one")]);
      if (sent === 1) await assert.rejects(step, (err: CtxccError) => err.metadata.quota === quota);
      else assert.equal((await step).view.compileId, v1.view.compileId);
      assert.equal(got.length, sent, quota);
      oneRequestId(got);
      const stepIds = new Set(got.map((g) => (g.req.request?.$case === "step" ? g.req.request.value.stepId : "?")));
      assert.equal(stepIds.size, 1, "the same step, sent again");
      assert.ok(got.every((g) => g.stream === got[0].stream), "on the stream that refused it");
    } finally {
      await stream.close();
      stop();
    }
  }
});
