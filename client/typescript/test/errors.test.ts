import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { CtxccError, toCtxccError } from "../src/errors.js";

test("a status without an ErrorInfo has its code's name as its reason, said once", () => {
  const bare = Object.assign(new Error("14 UNAVAILABLE: connection refused"), {
    code: grpc.status.UNAVAILABLE,
    details: "connection refused",
    metadata: new grpc.Metadata(),
  });
  const e = toCtxccError(bare);
  assert.equal(e.reason, "UNAVAILABLE");
  assert.equal(e.message, "UNAVAILABLE: connection refused");
  const daemon = new CtxccError(grpc.status.NOT_FOUND, "SESSION_NOT_FOUND", "no such session");
  assert.equal(daemon.message, "NOT_FOUND SESSION_NOT_FOUND: no such session");
});
