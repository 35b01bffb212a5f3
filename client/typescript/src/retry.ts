/**
 * Retries on UNAVAILABLE, bounded by time rather than attempts: a daemon that is down for a
 * few seconds (a restart, a rollout) is waited out. Only calls that are safe to repeat are
 * retried; appends and checkpoints carry a request id fixed before the first attempt, so a
 * repeat is answered as a replay, never stored twice. createSession carries a session id
 * fixed the same way and reads back a session an earlier attempt stored (see
 * Sessions.createSession). Deletes are not retried: a repeat of a delete that went through
 * finds nothing, and nothing tells that apart from a delete of nothing. Every call, a delete
 * included, is retried on a transient quota (isTransientQuota): the daemon did none of it.
 */
import { randomBytes } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

import { CtxccError, toCtxccError } from "./errors.js";

export const RETRY_SECONDS = 30;
const MAX_PAUSE_MS = 250;

export const newRequestId = (): string => randomBytes(12).toString("hex");

/** A session id of the daemon's own shape: "s-" and 24 hex digits. */
export const newSessionId = (): string => `s-${randomBytes(12).toString("hex")}`;

/** The reason of a createSession whose id is taken. */
export const SESSION_ALREADY_EXISTS = "SESSION_ALREADY_EXISTS";

/** Resolves after `ms`, or at once when `signal` aborts (the caller then sees it aborted). */
export const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done);
  });

/** Pauses of 50 ms doubling to 250 ms until the budget is spent; null when it is. */
export class Backoff {
  private readonly deadline: number;
  private pause = 50;

  constructor(seconds: number) {
    this.deadline = Date.now() + seconds * 1000;
  }

  remainingMs(): number {
    return Math.max(0, this.deadline - Date.now());
  }

  next(): number | null {
    const left = this.remainingMs();
    if (left <= 0) return null;
    const pause = Math.min(this.pause, left);
    this.pause = Math.min(this.pause * 2, MAX_PAUSE_MS);
    return pause;
  }
}

/** Runs `call` (given the remaining budget in ms) until it succeeds, fails with anything but
 * UNAVAILABLE (when `idempotent`) or a transient quota (always), or the budget is spent. */
export async function retry<T>(call: (remainingMs: number) => Promise<T>, idempotent: boolean, seconds: number): Promise<T> {
  const backoff = new Backoff(seconds);
  for (;;) {
    try {
      return await call(backoff.remainingMs());
    } catch (err) {
      const e = toCtxccError(err);
      const pause = (idempotent && isRetryable(e)) || isTransientQuota(e) ? backoff.next() : null;
      if (pause === null) throw e;
      await sleep(pause);
    }
  }
}

/** The daemon's quotas on what calls in progress hold at once (README "Memory of requests",
 * --max-calls-in-progress): a call refused under one was not started, and the refusal ends
 * when other calls end, so sending it again later is safe and can pass. Every other quota (a
 * session's bytes, max_message_bytes, compile_cpu_budget_ms, watchers) would refuse the same
 * call again: it fails at once. */
export const TRANSIENT_QUOTAS: ReadonlySet<string> = new Set([
  "request_bytes_in_memory",
  "calls_in_progress",
  "upload_bytes_in_memory",
  "download_bytes_in_memory",
  "watch_bytes_in_memory",
]);

/** RESOURCE_EXHAUSTED/QUOTA_EXCEEDED under one of TRANSIENT_QUOTAS, as a call's status or a
 * stream step's in-band error. Nothing of the call was done, so any call is retried on it, a
 * delete included. */
export function isTransientQuota(err: unknown): boolean {
  return (
    err instanceof CtxccError &&
    err.code === grpc.status.RESOURCE_EXHAUSTED &&
    err.reason === "QUOTA_EXCEEDED" &&
    TRANSIENT_QUOTAS.has(err.metadata.quota ?? "")
  );
}

export function isUnavailable(err: unknown): boolean {
  return err instanceof CtxccError && err.code === grpc.status.UNAVAILABLE;
}

/** UNAVAILABLE, or a bare CANCELLED (no ErrorInfo) this process did not cause: gRPC's own
 * stop in a daemon shutting down cancels so the calls that reach it after the daemon's drain.
 * Whether such a call ran is unknown, as when a connection drops: it is repeated only where
 * that is safe, as after UNAVAILABLE. */
export function isRetryable(err: unknown): boolean {
  if (!(err instanceof CtxccError)) return false;
  if (err.code === grpc.status.UNAVAILABLE) return true;
  return err.code === grpc.status.CANCELLED && err.reason === "CANCELLED" && !err.message.includes("Cancelled on client");
}

type Callback<Res> = (err: grpc.ServiceError | null, res: Res) => void;
export type UnaryMethod<Req, Res> = (req: Req, md: grpc.Metadata, opts: Partial<grpc.CallOptions>, cb: Callback<Res>) => grpc.ClientUnaryCall;

/**
 * One attempt of a unary call, with no deadline: `retrySeconds` bounds how long an
 * unavailable daemon is waited out, never a call a daemon that is up takes long to answer
 * (a large compile, a search over a long result). While the channel connects the call waits
 * for it; a daemon that cannot be reached fails it with UNAVAILABLE at once, and `retry`
 * tries again every 50-250 ms (the channel itself looks again at most every 500 ms) until
 * the budget is spent, so a call goes out within about a second of the daemon coming back.
 */
export function unaryOnce<Req, Res>(fn: UnaryMethod<Req, Res>, req: Req, md?: grpc.Metadata): Promise<Res> {
  const metadata = md ? md.clone() : new grpc.Metadata();
  return new Promise((resolve, reject) => {
    fn(req, metadata, {}, (err, res) => (err ? reject(err) : resolve(res)));
  });
}
