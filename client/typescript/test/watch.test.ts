import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { Event } from "../src/gen/ctxcc/v1/event.js";
import { SessionServiceService, WatchSessionRequest, WatchSessionResponse } from "../src/gen/ctxcc/v1/session_service.js";
import { connect, CtxccError, SESSION_CREATE_TIME_KEY } from "../src/index.js";

const ev = (seq: number, eventId: string, at: number): Event => Event.fromPartial({ seq, eventId, createTime: new Date(at * 1000) });

/** A SessionService whose n-th WatchSession call sends calls[n-1]'s events after the
 * after_seq asked for, then ends UNAVAILABLE (a daemon restart); the last call ends cleanly. */
async function scripted(calls: Event[][], endWith: grpc.status = grpc.status.UNAVAILABLE, made: (string | undefined)[] = []) {
  const asked: number[] = [];
  const server = new grpc.Server();
  server.addService(SessionServiceService, {
    watchSession: (call: grpc.ServerWritableStream<WatchSessionRequest, WatchSessionResponse>) => {
      asked.push(call.request.afterSeq);
      const log = calls[asked.length - 1];
      const created = made[asked.length - 1];
      if (created !== undefined) {
        // Sent at once, before any update, as the daemon does once the watch is subscribed.
        const md = new grpc.Metadata();
        md.set(SESSION_CREATE_TIME_KEY, created);
        call.sendMetadata(md);
      }
      for (const e of log) if (e.seq > call.request.afterSeq) call.write(WatchSessionResponse.fromPartial({ update: { $case: "event", value: e } }));
      if (asked.length < calls.length) call.emit("error", { code: endWith, details: "restarting" });
      else call.end();
    },
  } as unknown as grpc.UntypedServiceImplementation);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const client = connect(`127.0.0.1:${port}`, { retrySeconds: 5 });
  const got: string[] = [];
  let error: unknown;
  try {
    for await (const msg of client.watch("s")) if (msg.update?.$case === "event") got.push(msg.update.value.eventId);
  } catch (err) {
    error = err;
  } finally {
    client.close();
    server.forceShutdown();
  }
  return { asked, got, error };
}

test("a reopened watch goes on after the last event delivered, once", async () => {
  const old = [ev(1, "e1", 10), ev(2, "e2", 11), ev(3, "e3", 12)];
  const { asked, got, error } = await scripted([old.slice(0, 2), old]);
  assert.equal(error, undefined);
  assert.deepEqual(got, ["e1", "e2", "e3"]);
  assert.deepEqual(asked, [0, 1]);
});

test("a watch does not follow a session deleted and made again while it was away", async () => {
  const old = [ev(1, "e1", 10), ev(2, "e2", 11)];
  const remade = [ev(1, "n1", 20), ev(2, "n2", 21), ev(3, "n3", 22)];
  const { got, error } = await scripted([old, remade]);
  assert.deepEqual(got, ["e1", "e2"]);
  assert.ok(error instanceof CtxccError, String(error));
  assert.equal(error.code, grpc.status.NOT_FOUND);
  assert.equal(error.reason, "SESSION_NOT_FOUND");
});

test("a watch the daemon's gRPC cancelled as it stopped (a bare CANCELLED) reopens after the last event", async () => {
  const old = [ev(1, "e1", 10), ev(2, "e2", 11)];
  const { asked, got, error } = await scripted([old.slice(0, 1), old], grpc.status.CANCELLED);
  assert.equal(error, undefined);
  assert.deepEqual(got, ["e1", "e2"]);
  assert.deepEqual(asked, [0, 0]);
});

test("a watch that delivered nothing does not follow a session made again while it was away", async () => {
  // No event to ask for again: the create time in the daemon's header tells the logs apart.
  const remade = [ev(1, "n1", 20), ev(2, "n2", 21)];
  const { got, error } = await scripted([[], remade], grpc.status.UNAVAILABLE, ["100", "200"]);
  assert.deepEqual(got, []);
  assert.ok(error instanceof CtxccError, String(error));
  assert.equal(error.code, grpc.status.NOT_FOUND);
  assert.equal(error.reason, "SESSION_NOT_FOUND");
  // The same session (the same create time), or a daemon that sends no header: followed.
  for (const made of [["100", "100"], ["100", undefined], []]) {
    const same = await scripted([[], remade], grpc.status.UNAVAILABLE, made);
    assert.equal(same.error, undefined, `headers ${made}`);
    assert.deepEqual(same.got, ["n1", "n2"], `headers ${made}`);
  }
});
