/**
 * One long-lived CompileStream: steps are answered in order, chunked views reassembled and
 * checked. When the daemon goes away (a restart, SIGTERM ending idle streams with
 * UNAVAILABLE, a dropped connection) the stream reopens itself and resends the step in flight
 * with the same request id, so its append is replayed, never stored twice.
 */
import { createHash } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

import { CtxccError, toCtxccError } from "./errors.js";
import type { DeepPartial } from "./gen/ctxcc/v1/common.js";
import {
  AppendResult,
  CompileRequest,
  CompileServiceClient,
  CompileStreamRequest,
  CompileStreamResponse,
} from "./gen/ctxcc/v1/compile_service.js";
import { Event } from "./gen/ctxcc/v1/event.js";
import { CompiledView } from "./gen/ctxcc/v1/view.js";
import { Backoff, isUnavailable, newRequestId, sleep } from "./retry.js";

type Duplex = grpc.ClientDuplexStream<CompileStreamRequest, CompileStreamResponse>;

export interface StepResult {
  view: CompiledView;
  /** The append's result when the step carried events (`replayed` after a resend). */
  append?: AppendResult;
}

export interface StepOptions {
  /** Idempotency key of the append; by default fixed once per step before its first attempt. */
  requestId?: string;
  expectedLastSeq?: number;
}

const streamEnded = () => new CtxccError(grpc.status.UNAVAILABLE, "UNAVAILABLE", "the stream ended");

function eventsKey(events: Event[]): string {
  const h = createHash("sha256");
  for (const e of events) h.update(Event.encode(e).finish());
  return h.digest("hex");
}

export class Stream {
  private call: Duplex | null = null;
  private waiting: Array<{ resolve: (r: CompileStreamResponse) => void; reject: (e: unknown) => void }> = [];
  private buffered: CompileStreamResponse[] = [];
  private failure: unknown = null;
  private counter = 0;
  private chain: Promise<unknown> = Promise.resolve();
  // The request id of a step that failed, by its events: calling `step` again with the same
  // events (the natural "try again") reuses it instead of appending them twice.
  private unfinished: { key: string; requestId: string } | null = null;

  constructor(
    private readonly client: CompileServiceClient,
    private readonly retrySeconds: number,
    private readonly metadata?: grpc.Metadata,
  ) {}

  private open(): Duplex {
    if (this.call) return this.call;
    const call = this.client.compileStream(this.metadata?.clone() ?? new grpc.Metadata());
    this.failure = null;
    this.buffered = [];
    call.on("data", (r: CompileStreamResponse) => {
      if (this.call !== call) return;
      const w = this.waiting.shift();
      if (w) w.resolve(r);
      else this.buffered.push(r);
    });
    const fail = (err: unknown) => {
      if (this.call !== call) return;
      this.failure = err;
      this.call = null;
      for (const w of this.waiting.splice(0)) w.reject(err);
    };
    call.on("error", (err) => fail(toCtxccError(err)));
    call.on("end", () => fail(streamEnded()));
    this.call = call;
    return call;
  }

  private drop(): void {
    const call = this.call;
    this.call = null;
    this.failure = null;
    this.buffered = [];
    call?.cancel();
  }

  private next(): Promise<CompileStreamResponse> {
    const r = this.buffered.shift();
    if (r) return Promise.resolve(r);
    if (this.failure) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  /** Append `events` (if any) and compile, in one round trip. */
  step(compile: DeepPartial<CompileRequest>, events: Event[] = [], options: StepOptions = {}): Promise<StepResult> {
    const key = events.length ? eventsKey(events) : "";
    // Fixed here, before the first attempt; every retry resends it.
    const requestId =
      options.requestId ?? (!events.length ? "" : this.unfinished?.key === key ? this.unfinished.requestId : newRequestId());
    const stepId = String(++this.counter);
    const msg = CompileStreamRequest.fromPartial({
      request: {
        $case: "step",
        value: { stepId, events, requestId, expectedLastSeq: options.expectedLastSeq, compile: CompileRequest.fromPartial(compile) },
      },
    });
    const run = async (): Promise<StepResult> => {
      const backoff = new Backoff(this.retrySeconds);
      for (;;) {
        try {
          const out = await this.attempt(msg);
          this.unfinished = null;
          return out;
        } catch (err) {
          const pause = isUnavailable(err) ? backoff.next() : null;
          if (pause === null) {
            if (events.length && isUnavailable(err)) this.unfinished = { key, requestId };
            throw toCtxccError(err);
          }
          await sleep(pause);
        }
      }
    };
    const result = this.chain.then(run, run);
    this.chain = result.catch(() => undefined);
    return result;
  }

  private async attempt(msg: CompileStreamRequest): Promise<StepResult> {
    const call = this.open();
    try {
      call.write(msg);
    } catch {
      // Written after the daemon ended the call but before its status arrived.
      this.drop();
      throw streamEnded();
    }
    try {
      return await this.receive();
    } catch (err) {
      if (isUnavailable(err)) this.drop();
      throw err;
    }
  }

  private async receive(): Promise<StepResult> {
    const parts: Uint8Array[] = [];
    let append: AppendResult | undefined;
    for (;;) {
      const r = await this.next();
      append = r.append ?? append;
      const resp = r.response;
      if (!resp) continue;
      if (resp.$case === "view") return { view: resp.value, append };
      if (resp.$case === "error") throw new CtxccError(resp.value.code, resp.value.reason, resp.value.message);
      const chunk = resp.value;
      parts[chunk.index] = chunk.data;
      if (chunk.index !== chunk.count - 1) continue;
      const data = Buffer.concat(parts);
      if (createHash("sha256").update(data).digest("hex") !== chunk.sha256) {
        throw new Error(`view ${chunk.compileId} arrived damaged`);
      }
      return { view: CompiledView.decode(data), append };
    }
  }

  close(): void {
    const call = this.call;
    this.call = null;
    call?.end();
  }
}
