import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { RenderFormat } from "../src/gen/ctxcc/v1/view.js";
import { connect, CtxccError, user } from "../src/index.js";

// retrySeconds bounds how long a unary call waits out an unavailable daemon: never the call
// itself. A daemon that cannot be reached is UNAVAILABLE once it has passed.
test("a unary call to a daemon that cannot be reached fails UNAVAILABLE once retrySeconds pass", async () => {
  const ctx = connect("unix:///nonexistent/ctxcc.sock", { retrySeconds: 0.2 });
  try {
    await assert.rejects(ctx.getSession("s-1"), (err: unknown) => {
      assert.ok(err instanceof CtxccError, String(err));
      assert.equal(err.code, grpc.status.UNAVAILABLE);
      assert.equal(err.reason, "UNAVAILABLE");
      return true;
    });
  } finally {
    ctx.close();
  }
});

// The daemon the test runs against: tests/e2e/test_clients.py starts it and sets CTXCC_TARGET
// (skipped without it).
const daemonTarget = process.env.CTXCC_TARGET;

test(
  "against a daemon: a unary call the daemon answers after retrySeconds is not cut off",
  { skip: daemonTarget ? false : "CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)" },
  async () => {
    const route = { connection: "default", protocol: "openai-chat", endpoint: "api", model: "gpt-4o" };
    const setup = connect(daemonTarget!);
    const ctx = connect(daemonTarget!, { retrySeconds: 0.001 });
    try {
      const { sessionId } = await setup.createSession();
      for (let k = 0; k < 3; k++) await setup.append(sessionId, [user(`part ${k} ` + "y".repeat(900_000))]);
      // The compile (~2.7 MB of history rendered twice) takes the daemon far longer than the
      // client's budget of a millisecond, and is its first call: the channel connects first.
      const view = await ctx.compile({
        sessionId,
        route,
        renderFormats: [RenderFormat.RENDER_FORMAT_OPENAI_CHAT, RenderFormat.RENDER_FORMAT_ANTHROPIC_MESSAGES],
      });
      assert.equal(view.messages.length, 3);
      assert.equal(view.renderings.length, 2);
      const again = await ctx.getSession(sessionId);
      assert.equal(again.sessionId, sessionId);
    } finally {
      setup.close();
      ctx.close();
    }
  },
);
