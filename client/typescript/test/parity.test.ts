/** What the TypeScript client sends and hashes as the Python and Go clients do: a double
 * holding -0.0 is written (proto3 leaves out +0.0 alone), and a string holding a lone
 * surrogate is refused before anything is sent. */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { ReportUsageResponse } from "../src/gen/ctxcc/v1/compile_service.js";
import { RouteModel } from "../src/gen/ctxcc/v1/view.js";
import { applyDelta, chainDigest, viewDigest } from "../src/delta.js";
import { connect, CtxccError, user } from "../src/index.js";
import { daemonApart, daemonChain, encoded, fixture, makeDelta } from "./fixtures.js";

test("a double holding -0.0 is written, as Python's protobuf and protobuf-go write it; +0.0 is left out", () => {
  // RouteModel{ratio: -0.0} as upb serializes it: tag 9 (field 1, fixed64), the sign bit alone.
  assert.deepEqual(Buffer.from(RouteModel.encode(RouteModel.fromPartial({ ratio: -0 })).finish()).toString("hex"), "090000000000000080");
  assert.equal(RouteModel.encode(RouteModel.fromPartial({ ratio: 0 })).finish().length, 0);
  const decoded = RouteModel.decode(RouteModel.encode(RouteModel.fromPartial({ framingTokens: -0 })).finish());
  assert.ok(Object.is(decoded.framingTokens, -0));
  assert.equal(Buffer.from(ReportUsageResponse.encode(ReportUsageResponse.fromPartial({ relativeError: -0 })).finish()).toString("hex"), "190000000000000080");
});

test("a view whose route model holds -0.0 digests as the daemon's bytes", () => {
  const { view, bytes } = fixture(6);
  assert.ok(Object.is(view.budget?.routeModel?.framingTokens, -0), "view6 holds framing -0.0");
  assert.ok(encoded(view).equals(bytes));
  assert.equal(viewDigest(view), createHash("sha256").update(bytes).digest("hex"));
  assert.equal(chainDigest(view), daemonChain(6));
  assert.equal(chainDigest(view, true), daemonApart(6));
  // A delta to it, stating the digest of the daemon's bytes, is taken.
  const delta = makeDelta(fixture(3).view, view);
  delta.viewSha256 = createHash("sha256").update(bytes).digest("hex");
  assert.ok(encoded(applyDelta(fixture(3).view, delta)).equals(bytes));
});

test("a lone surrogate in a request is refused with INVALID_FIELD before anything is sent", async () => {
  // No daemon: a request that were sent would fail UNAVAILABLE (after retrySeconds), not this.
  const ctx = connect("unix:///nonexistent/ctxcc.sock", { retrySeconds: 5 });
  try {
    const refusal = async (p: Promise<unknown>, field: string, what: string) => {
      const started = Date.now();
      await assert.rejects(p, (err: unknown) => {
        assert.ok(err instanceof CtxccError, String(err));
        assert.equal(err.code, grpc.status.INVALID_ARGUMENT);
        assert.equal(err.reason, "INVALID_FIELD");
        assert.equal(err.metadata.field, field);
        assert.match(err.message, new RegExp(`lone UTF-16 surrogate \\(${what}\\)`));
        return true;
      });
      assert.ok(Date.now() - started < 1000, "refused at once, not retried");
    };
    await refusal(ctx.append("s-1", [user("ok"), user("half \ud83d of a pair")]), "request.events[1].user_message.parts[0].text", "U\\+D83D at index 5");
    await refusal(ctx.sessions.createSession({ session: { labels: { team: "\udc00" } } }), "request.session.labels.team", "U\\+DC00 at index 0");
    const stream = ctx.openStream();
    await refusal(
      stream.step({ sessionId: "s-1" }, [user("x")], { requestId: "r\ud800" }),
      "request.request_id",
      "U\\+D800 at index 1",
    );
    await stream.close().catch(() => undefined);
    // Well-formed text, astral characters included, is not refused (it fails UNAVAILABLE).
    assert.doesNotThrow(() => user("emoji \ud83d\ude00"));
  } finally {
    ctx.close();
  }
});
