import assert from "node:assert/strict";
import * as http from "node:http";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { CtxccError } from "../src/errors.js";
import { type Client, connect, user } from "../src/index.js";
import { isTransientQuota, retry } from "../src/retry.js";

const quota = (q: string) => new CtxccError(grpc.status.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", "retry later", { quota: q, limit: "2" });

test("only the four quotas on calls in progress are transient", () => {
  for (const q of ["request_bytes_in_memory", "calls_in_progress", "upload_bytes_in_memory", "download_bytes_in_memory", "watch_bytes_in_memory"]) {
    assert.ok(isTransientQuota(quota(q)), q);
  }
  for (const q of ["max_session_bytes", "max_sessions", "max_message_bytes", "compile_cpu_budget_ms", "watchers", "watchers_per_session", ""]) {
    assert.ok(!isTransientQuota(quota(q)), q);
  }
  assert.ok(!isTransientQuota(new CtxccError(grpc.status.RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", "too large")));
  assert.ok(!isTransientQuota(new CtxccError(grpc.status.UNAVAILABLE, "QUOTA_EXCEEDED", "", { quota: "calls_in_progress" })));
});

test("retry waits out a transient quota, a call not safe to repeat included, and fails at once on another", async () => {
  let calls = 0;
  const ok = await retry(
    async () => {
      if (++calls < 3) throw quota("calls_in_progress");
      return "done";
    },
    false,
    5,
  );
  assert.equal(ok, "done");
  assert.equal(calls, 3);
  calls = 0;
  await assert.rejects(
    retry(
      async () => {
        calls++;
        throw quota("compile_cpu_budget_ms");
      },
      true,
      5,
    ),
    (e: unknown) => e instanceof CtxccError && e.metadata.quota === "compile_cpu_budget_ms",
  );
  assert.equal(calls, 1);
});

// The daemon the test runs against: tests/e2e/test_client_quota_retry.py starts it with
// --max-calls-in-progress 2 and --max-session-bytes 65536, and sets CTXCC_TARGET and
// CTXCC_METRICS_URL (skipped without them).
const daemonTarget = process.env.CTXCC_TARGET;
const metricsUrl = process.env.CTXCC_METRICS_URL ?? "";

/** The sum of the samples of `name` whose labels include each of `labels` (`key="value"`). */
function metric(name: string, ...labels: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    http
      .get(metricsUrl, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (body += chunk));
        res.on("end", () => {
          let sum = 0;
          for (const line of body.split("\n")) {
            if (!line.startsWith(name + "{") && !line.startsWith(name + " ")) continue;
            if (!labels.every((l) => line.includes(l))) continue;
            sum += Number(line.trim().split(/\s+/).at(-1));
          }
          resolve(sum);
        });
      })
      .on("error", reject);
  });
}

/** Polls until `metric(name, ...labels)` reaches `want`: a state waited for, not slept through. */
async function waitMetric(want: number, name: string, ...labels: string[]): Promise<void> {
  const deadline = Date.now() + 60_000;
  while ((await metric(name, ...labels)) < want) {
    assert.ok(Date.now() < deadline, `${name} ${labels.join(",")} never reached ${want}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Polls until `metric(name, ...labels)` is at most `most`. */
async function waitMetricAtMost(most: number, name: string, ...labels: string[]): Promise<void> {
  const deadline = Date.now() + 60_000;
  while ((await metric(name, ...labels)) > most) {
    assert.ok(Date.now() < deadline, `${name} ${labels.join(",")} never came down to ${most}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const REFUSED = ["ctxcc_errors_total", 'reason="QUOTA_EXCEEDED"'] as const;

/** Runs `call` while two idle CompileStreams hold the daemon's two calls, ends one once the
 * daemon has refused `call` at least once, and returns what `call` returned. */
async function holdCalls<T>(ctx: Client, call: () => Promise<T>): Promise<T> {
  // The streams an earlier hold cancelled may not have ended on the daemon yet: while one
  // had, two in flight could be it and one new stream (the other refused), and the call
  // then found a free slot, was never refused, and the wait below ran out.
  await waitMetricAtMost(0, "ctxcc_rpcs_in_flight", 'method="CompileService/CompileStream"');
  const idle = [ctx.compiles.raw.compileStream(), ctx.compiles.raw.compileStream()];
  for (const s of idle) s.on("error", () => {}); // the cancel below ends them
  try {
    await waitMetric(2, "ctxcc_rpcs_in_flight", 'method="CompileService/CompileStream"');
    const before = await metric(...REFUSED);
    const result = call();
    result.catch(() => {}); // awaited below
    await waitMetric(before + 1, ...REFUSED);
    idle[0].cancel();
    return await result;
  } finally {
    for (const s of idle) s.cancel();
  }
}

test(
  "against a daemon: a call and a step refused for calls_in_progress succeed once a call ends; a lasting quota fails at once",
  { skip: daemonTarget && metricsUrl ? false : "CTXCC_TARGET is not set (tests/e2e/test_client_quota_retry.py runs this against a daemon)" },
  async () => {
    const ctx = connect(daemonTarget!, { retrySeconds: 60 });
    try {
      const { sessionId } = await ctx.createSession();
      const appended = await holdCalls(ctx, () => ctx.append(sessionId, [user("hello")]));
      assert.equal(appended.lastSeq, 1);
      const stream = ctx.openStream();
      try {
        const route = { connection: "example", protocol: "fake", endpoint: "local", model: "gpt-4o" };
        const stepped = await holdCalls(ctx, () => stream.step({ sessionId, route }, [user("again")]));
        assert.equal(stepped.append?.lastSeq, 2);
      } finally {
        stream.close();
      }

      const big = await ctx.createSession();
      const before = await metric(...REFUSED);
      await assert.rejects(ctx.append(big.sessionId, [user("x".repeat(100_000))]), (e: unknown) => {
        assert.ok(e instanceof CtxccError && e.reason === "QUOTA_EXCEEDED" && !isTransientQuota(e), String(e));
        return true;
      });
      // Retried, it would have been refused again and again for retrySeconds before it failed.
      await waitMetric(before + 1, ...REFUSED);
      assert.equal(await metric(...REFUSED), before + 1);
    } finally {
      ctx.close();
    }
  },
);
