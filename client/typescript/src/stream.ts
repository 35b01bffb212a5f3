/**
 * One long-lived CompileStream: steps are answered in order, chunked views reassembled and
 * checked, delta views rebuilt and checked. When the daemon goes away (a restart, SIGTERM
 * ending idle streams with UNAVAILABLE, a dropped connection) the stream reopens itself and
 * resends the step in flight with the same request id, so its append is replayed, never
 * stored twice.
 *
 * `reportUsage` queues the provider's usage of a view and the next step carries it: the
 * daemon records it before that step's append and compile, so a step is one round trip
 * instead of a step and a unary ReportUsage. A report with no step to ride on (the stream is
 * closed, or a second report is queued first) goes by the unary ReportUsage.
 *
 * Every answer is matched to what is in flight by its step_id: the step's own (also in its
 * chunks and its StepError), or the fresh one each ResumeRequest carries (the daemon echoes it
 * on every message of the resume's answer). One for a step or resume already answered (e.g. a
 * response a proxy delivered twice, the rest of a step that failed, the answer to an earlier
 * resume arriving late) is skipped and counted in `stats.stale`, never returned; any other
 * ends the stream, and the step is resent on a new one with its request id, as after
 * UNAVAILABLE. A daemon that predates the resume's step_id answers it with an empty one: an
 * empty id is taken for the resume's answer only until the stream's daemon has echoed a
 * resume's id (so on such a daemon a resume's answer delivered twice cannot be told from the
 * next one's).
 */
import { createHash } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

import {
  applyChainedDelta,
  applyDelta,
  DeltaMismatch,
  extendChain,
  PartRecords,
  type MessageRecords,
} from "./delta.js";
import { refuseLoneSurrogates } from "./text.js";
import { CtxccError, toCtxccError } from "./errors.js";
import type { DeepPartial } from "./gen/ctxcc/v1/common.js";
import {
  AppendResult,
  CompileRequest,
  CompileServiceClient,
  CompileServiceService,
  CompileStreamRequest,
  CompileStreamResponse,
  DeltaDigest,
  ReportUsageRequest,
  ReportUsageResponse,
  ViewDelta,
} from "./gen/ctxcc/v1/compile_service.js";
import { Event } from "./gen/ctxcc/v1/event.js";
import { CompiledView } from "./gen/ctxcc/v1/view.js";
import { Backoff, isRetryable, isTransientQuota, newRequestId, sleep } from "./retry.js";

type Duplex = grpc.ClientDuplexStream<CompileStreamRequest, CompileStreamResponse>;

export interface StepResult {
  view: CompiledView;
  /** The append's result when the step carried events (`replayed` after a resend). */
  append?: AppendResult;
  /** The daemon's answer to the usage report the step carried (see `Stream.reportUsage`). */
  usage?: ReportUsageResponse;
}

/** The unary ReportUsage a report with no step to ride on is sent by. */
export type UsageReporter = (req: ReportUsageRequest) => Promise<ReportUsageResponse>;

export interface StepOptions {
  /** Idempotency key of the append; by default fixed once per step before its first attempt. */
  requestId?: string;
  expectedLastSeq?: number;
  /** Bounds the step (`AbortSignal.timeout(ms)`, or a controller's): once aborted, the step
   * rejects with the signal's reason and the stream's call is dropped (the next step opens a
   * new one); aborted while it pauses before a retry, it sends nothing more, and while it waits
   * its turn behind another step it rejects at once and is never sent. The daemon may
   * have appended the events all the same: the same events sent again on this stream reuse
   * the step's request id, so they are appended once. */
  signal?: AbortSignal;
}

export interface StreamOptions {
  /** Ask for delta views (default true): each step names the last view this stream received
   * and checked, and the daemon may answer with only what changed against it. */
  deltas?: boolean;
  /** Called with every ViewDelta as it arrives, before it is applied (for tracing; tests
   * change one to see a mismatch handled). */
  onDelta?: (delta: ViewDelta) => void;
  /** Check deltas by the chained digest (default true: continued from the base's, so only
   * the new messages and the view without messages are hashed); false asks for the whole
   * view's sha256 (view_sha256) as before. */
  chainedDigest?: boolean;
}

/** How a stream's views arrived. */
export interface StreamStats {
  /** Views that arrived whole (in one message or in chunks), refetches included. */
  whole: number;
  /** Views rebuilt from a ViewDelta whose digest checked. */
  deltas: number;
  /** Deltas that could not be applied or failed the digest check; each was fetched whole. */
  mismatches: number;
  /** Bytes of the answers received (their encoded messages). */
  bytes: number;
  /** Answers skipped because they answer a step or resume already answered: a response
   * delivered twice, the rest of a step that failed, an earlier resume's answer arriving late.
   * Never returned. */
  stale: number;
}

// A daemon whose views this client cannot rebuild (e.g. one with fields this client does not
// know) would otherwise cost a refetch at every step.
const MAX_MISMATCHES = 3;
/** The most chunks a view may announce. */
const MAX_CHUNKS = 1 << 16;

type Answer = { view: CompiledView; delta?: undefined; append?: AppendResult } | { view?: undefined; delta: ViewDelta; append?: AppendResult };

/**
 * Whether an answer whose step_id is `answer` is the one awaited: the one under id `awaited` (a
 * step's, also in its chunks and its StepError, or the ResumeRequest's the step made after a
 * delta that did not check), or when `bare` one with no id (a resume's answer from a daemon
 * that does not echo its id). "stale" for an answer to a step or resume already answered: ids
 * are the stream's counter, so a smaller number (the step itself while its resume is awaited,
 * an earlier resume's answer delivered late). "unmatched" for anything else, an empty id when
 * not `bare` too: nothing tells which resume it answers.
 */
function matchAnswer(answer: string, awaited: string, bare: boolean): "ours" | "stale" | "unmatched" {
  if (answer === awaited || (bare && answer === "")) return "ours";
  const earlier = /^[1-9][0-9]*$/.test(answer) && /^[0-9]+$/.test(awaited) && BigInt(answer) < BigInt(awaited);
  return earlier ? "stale" : "unmatched";
}

const streamClosed = () => new CtxccError(grpc.status.CANCELLED, "STREAM_CLOSED", "the stream was closed while a step waited for its answer");
const streamEnded = () => new CtxccError(grpc.status.UNAVAILABLE, "UNAVAILABLE", "the stream ended");

function eventsKey(events: Event[]): string {
  const h = createHash("sha256");
  for (const e of events) h.update(Event.encode(e).finish());
  return h.digest("hex");
}

/**
 * Views returned by `step` are the bases of later deltas and share their unchanged messages,
 * sections and tools, whose encodings the stream remembers by object: treat them as read-only
 * (copy one to change it, e.g. `CompiledView.fromPartial(view)`).
 */
export class Stream {
  private call: Duplex | null = null;
  private waiting: Array<{ resolve: (r: CompileStreamResponse) => void; reject: (e: unknown) => void }> = [];
  private buffered: CompileStreamResponse[] = [];
  private failure: unknown = null;
  // The ids of steps and resumes, taken when each is first sent: one counter, so an earlier
  // one's is a smaller number.
  private counter = 0;
  // Whether the open call's daemon echoed a resume's step_id: until it has, an answer with none
  // is taken for the resume's (a daemon that predates the field). Per call: a reopened one may
  // reach another daemon. On a daemon that echoes, no answer on the call has an empty id, so
  // one cannot be an earlier resume's.
  private echoes = false;
  private chain: Promise<unknown> = Promise.resolve();
  // Steps called and not yet settled.
  private running = 0;
  // The request id of a step that failed, by its events: calling `step` again with the same
  // events (the natural "try again") reuses it instead of appending them twice.
  private unfinished: { key: string; requestId: string } | null = null;
  private deltas: boolean;
  // The last view received completely and checked on the current call: the base of the next
  // delta. A reopened call starts without one (the daemon keeps views per stream).
  private base: CompiledView | null = null;
  // The chain values of base's messages when it was rebuilt from a chained delta (null:
  // computed from base when the next chained delta comes).
  private baseChain: Buffer[] | null = null;
  // Deltas that failed in a row; at MAX_MISMATCHES the stream stops asking for them.
  private mismatchRun = 0;
  // Encodings of the messages of views rebuilt here: the next delta keeps most of them.
  private readonly records: MessageRecords = new WeakMap();
  // The records of sections, tools and the system prompt for the chained digest.
  private readonly parts = new PartRecords();
  private readonly counts: StreamStats = { whole: 0, deltas: 0, mismatches: 0, bytes: 0, stale: 0 };
  // The usage report the next step carries, and the answer to the one the last step carried.
  private queued: ReportUsageRequest | null = null;
  private last: ReportUsageResponse | undefined = undefined;
  // Calls of `close`: a step running across one (pausing before a retry) fails instead of
  // opening a call after it.
  private closes = 0;
  // Ends the retry pause of the step running (at close).
  private pausing: AbortController | null = null;
  // Settles when the step running now does (close waits for it before flushing its report).
  private current: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly client: CompileServiceClient,
    private readonly retrySeconds: number,
    private readonly metadata?: grpc.Metadata,
    private readonly options: StreamOptions = {},
    private readonly reporter?: UsageReporter,
  ) {
    this.deltas = options.deltas ?? true;
  }

  /** The daemon's answer to the usage report the last step carried (undefined: it carried none). */
  get lastUsage(): ReportUsageResponse | undefined {
    return this.last;
  }

  /**
   * Queues the provider's usage of a view (`req.compileId`): the next `step` carries it, and
   * the daemon records it before that step's append and compile (the step's view is estimated
   * from it; its answer is then `StepResult.usage` and `lastUsage`). If a report for another
   * compile is still queued, that one is sent now by the unary ReportUsage and its answer
   * returned; otherwise nothing is sent. A step whose report is refused rejects with a
   * CtxccError whose `usageRefused` is set, having appended nothing: the report is dropped, so
   * calling `step` again goes without it. While a step is running this waits for it.
   */
  async reportUsage(req: DeepPartial<ReportUsageRequest>): Promise<ReportUsageResponse | undefined> {
    const report = ReportUsageRequest.fromPartial(req);
    // After the steps running now: one whose report the daemon did not record puts it back,
    // and it is then the earlier one, sent now. With none running, queued at once.
    if (this.running) await this.chain;
    const earlier = this.queued;
    this.queued = report;
    if (!earlier || earlier.compileId === report.compileId) return undefined;
    return this.unary(earlier);
  }

  /** Sends the queued usage report now by the unary ReportUsage (undefined: none queued); for a
   * view after which no step follows. `close` does it too. */
  async flushUsage(): Promise<ReportUsageResponse | undefined> {
    const usage = this.queued;
    this.queued = null;
    return usage ? this.unary(usage) : undefined;
  }

  private unary(req: ReportUsageRequest): Promise<ReportUsageResponse> {
    if (this.reporter) return this.reporter(req);
    return new Promise((resolve, reject) =>
      this.client.reportUsage(req, this.metadata?.clone() ?? new grpc.Metadata(), (err, resp) =>
        err ? reject(toCtxccError(err)) : resolve(resp),
      ),
    );
  }

  /** How the stream's views arrived so far. */
  get stats(): StreamStats {
    return { ...this.counts };
  }

  private open(): Duplex {
    if (this.call) return this.call;
    // The generated method's own call, with a decoder that also counts the bytes received.
    const method = CompileServiceService.compileStream;
    const call = this.client.makeBidiStreamRequest(
      method.path,
      method.requestSerialize,
      (data: Buffer) => {
        this.counts.bytes += data.length;
        return method.responseDeserialize(data);
      },
      this.metadata?.clone() ?? new grpc.Metadata(),
    );
    this.failure = null;
    this.buffered = [];
    this.base = null;
    this.baseChain = null;
    this.echoes = false;
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

  /** Ends the call a step waits on (an abort, a close): its waiters are rejected with `err`. */
  private cut(err: unknown): void {
    const waiting = this.waiting.splice(0);
    this.drop();
    for (const w of waiting) w.reject(err);
  }

  private drop(): void {
    const call = this.call;
    this.call = null;
    this.failure = null;
    this.buffered = [];
    this.base = null;
    this.baseChain = null;
    this.echoes = false;
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
    const request = CompileRequest.fromPartial(compile);
    // The step id is taken when the step runs (steps called meanwhile wait their turn), so ids
    // grow in the order steps and resumes are sent.
    const step = { stepId: "", events, requestId, expectedLastSeq: options.expectedLastSeq, compile: request, deltaBaseCompileId: "" };
    const msg = CompileStreamRequest.fromPartial({ request: { $case: "step", value: step } });
    try {
      refuseLoneSurrogates(step);
    } catch (err) {
      return Promise.reject(err);
    }
    const signal = options.signal;
    // A close after this call fails the step (waiting its turn, or pausing before a retry).
    const closes = this.closes;
    let started = false;
    const run = async (): Promise<StepResult> => {
      started = true;
      // An abort ends the wait: the call it waits on is dropped, its waiters rejected.
      const onAbort = () => this.cut(signal?.reason);
      signal?.addEventListener("abort", onAbort);
      try {
        signal?.throwIfAborted();
        const running = runSteps();
        this.current = running.catch(() => undefined);
        return await running;
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
    };
    const runSteps = async (): Promise<StepResult> => {
      // The report queued when the step runs rides on it.
      const usage = this.queued;
      this.queued = null;
      this.last = undefined;
      if (msg.request?.$case === "step") {
        msg.request.value.usage = usage ?? undefined;
        msg.request.value.stepId = String(++this.counter);
      }
      const backoff = new Backoff(this.retrySeconds);
      for (;;) {
        try {
          // Aborted, or closed since it was called: no (further) attempt.
          signal?.throwIfAborted();
          if (this.closes !== closes) throw streamClosed();
          const out = await this.attempt(msg, request);
          this.unfinished = null;
          return { ...out, usage: this.last };
        } catch (err) {
          const aborted = signal?.aborted ?? false;
          // A transient quota's refusal did none of the step: in-band the call stays open and
          // the step goes again on it; as the call's status (calls_in_progress) the call has
          // ended and the step goes on a new one.
          const pause = !aborted && (isRetryable(err) || isTransientQuota(err)) ? backoff.next() : null;
          if (pause === null) {
            // Whatever the error: the events may have been appended before it (a compile over
            // its CPU budget fails after the append; an abort does not stop the daemon), and
            // an id that appended nothing appends them as new.
            if (events.length) this.unfinished = { key, requestId };
            const failed = toCtxccError(err);
            // A report the daemon neither recorded nor refused rides on the next step (or goes
            // by the unary call at close).
            if (usage && !this.last && !failed.usageRefused && !this.queued) this.queued = usage;
            if (aborted) throw signal?.reason;
            throw failed;
          }
          // Ended early by the step's abort or by close.
          const pausing = (this.pausing = new AbortController());
          const onAbort = () => pausing.abort();
          signal?.addEventListener("abort", onAbort);
          try {
            await sleep(pause, pausing.signal);
          } finally {
            signal?.removeEventListener("abort", onAbort);
            this.pausing = null;
          }
        }
      }
    };
    this.running++;
    const result = this.chain.then(run, run);
    const settled = () => {
      this.running--;
    };
    this.chain = result.then(settled, settled);
    if (!signal) return result;
    // Aborted while an earlier step still runs, it rejects at once too: `run` then sends
    // nothing when its turn comes, instead of the caller waiting as long as that step. (Once
    // running, `run` rejects it, having kept its request id for the same events.)
    return new Promise<StepResult>((resolve, reject) => {
      const onAbort = () => {
        if (!started) reject(signal.reason);
      };
      if (signal.aborted) onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      result.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
    });
  }

  private async attempt(msg: CompileStreamRequest, compile: CompileRequest): Promise<StepResult> {
    const call = this.open();
    // Set at each attempt: a reopened call has no base.
    if (msg.request?.$case === "step") {
      const step = msg.request.value;
      step.deltaBaseCompileId = this.deltas ? (this.base?.compileId ?? "") : "";
      step.deltaDigest =
        step.deltaBaseCompileId && (this.options.chainedDigest ?? true)
          ? DeltaDigest.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
          : DeltaDigest.DELTA_DIGEST_UNSPECIFIED;
      step.keepCompaction = step.deltaBaseCompileId !== "";
    }
    try {
      this.send(call, msg);
      const stepId = msg.request?.$case === "step" ? msg.request.value.stepId : "";
      const first = await this.receive(stepId, false);
      if (!first.delta) return { view: this.keep(first.view), append: first.append };
      this.options.onDelta?.(first.delta);
      const headId = first.delta.head?.compileId ?? "";
      try {
        const { view, chain } = this.apply(first.delta);
        this.counts.deltas++;
        this.mismatchRun = 0;
        return { view: this.keep(view, chain), append: first.append };
      } catch (err) {
        if (!(err instanceof DeltaMismatch)) throw err;
      }
      this.counts.mismatches++;
      this.mismatchRun++;
      this.base = null;
      this.baseChain = null;
      // Its answer comes on this call under the resume's own id.
      const resumeId = String(++this.counter);
      this.send(call, CompileStreamRequest.fromPartial({ request: { $case: "resume", value: { compileId: headId, compile, stepId: resumeId } } }));
      const again = await this.receive(resumeId, true);
      if (!again.view) throw new Error("the daemon answered a ResumeRequest with a delta");
      return { view: this.keep(again.view), append: first.append };
    } catch (err) {
      if (isRetryable(err)) this.drop();
      throw err;
    }
  }

  private send(call: Duplex, msg: CompileStreamRequest): void {
    try {
      call.write(msg);
    } catch {
      // Written after the daemon ended the call but before its status arrived.
      throw streamEnded();
    }
  }

  /** Rebuilds and checks a delta with the digest it carries: the chained one when the daemon
   * sent it, else the whole view's sha256 (a daemon that does not know the chained one). */
  private apply(delta: ViewDelta): { view: CompiledView; chain: Buffer[] | null } {
    if (!delta.chainSha256) return { view: applyDelta(this.base, delta, this.records), chain: null };
    // A base that came whole gets its chain values once, here.
    const values = this.baseChain ?? extendChain([], 0, this.base?.messages ?? []);
    return applyChainedDelta(this.base, delta, values, this.parts, true);
  }

  /** Records a view received whole or rebuilt and checked as the next delta's base. */
  private keep(view: CompiledView, chain: Buffer[] | null = null): CompiledView {
    if (this.mismatchRun >= MAX_MISMATCHES) this.deltas = false;
    if (this.deltas) {
      this.base = view;
      this.baseChain = chain;
    }
    return view;
  }

  /** One answer under id `stepId` (a step's, or its resume's when `resuming`): a whole view
   * (reassembled from chunks when chunked), a delta, or the error. Answers to a step or resume
   * already answered are skipped; any other answer that is not the awaited one is an UNAVAILABLE
   * error, so the stream is dropped and the step resent on a new one. */
  private async receive(stepId: string, resuming: boolean): Promise<Answer> {
    const parts: Uint8Array[] = [];
    let append: AppendResult | undefined;
    for (;;) {
      const r = await this.next();
      const match = matchAnswer(r.stepId, stepId, resuming && !this.echoes);
      if (match === "stale") {
        this.counts.stale++;
        continue;
      }
      if (match === "unmatched") {
        const awaited = resuming ? `resume ${stepId}` : `step ${stepId}`;
        throw new CtxccError(grpc.status.UNAVAILABLE, "UNAVAILABLE", `the stream answered ${awaited} with an answer for step ${JSON.stringify(r.stepId)}: reopened`);
      }
      if (resuming && r.stepId === stepId) this.echoes = true;
      append = r.append ?? append;
      if (r.usage) this.last = r.usage;
      const resp = r.response;
      if (!resp) continue;
      if (resp.$case === "view") {
        this.counts.whole++;
        return { view: resp.value, append };
      }
      if (resp.$case === "delta") return { delta: resp.value, append };
      if (resp.$case === "error") {
        const e = resp.value;
        throw new CtxccError(e.code, e.reason, e.message, e.metadata, e.usageRefused);
      }
      const chunk = resp.value;
      // A chunk that does not fit its view is an error of the step, not a wait for
      // chunks that never come (65,536 × 1 MiB is far beyond any view the daemon sends).
      const count = parts.length > 0 ? parts.length : chunk.count;
      if (chunk.count === 0 || chunk.count > MAX_CHUNKS || chunk.count !== count || chunk.index >= count) {
        throw new Error(`view ${chunk.compileId}: chunk ${chunk.index} of ${chunk.count} does not fit a view of ${count} chunks`);
      }
      if (parts.length === 0) parts.length = count;
      parts[chunk.index] = chunk.data;
      if (chunk.index !== count - 1) continue;
      const data = Buffer.concat(parts);
      if (createHash("sha256").update(data).digest("hex") !== chunk.sha256) {
        throw new Error(`view ${chunk.compileId} arrived damaged`);
      }
      this.counts.whole++;
      return { view: CompiledView.decode(data), append };
    }
  }

  /** Ends the stream; a usage report still queued is sent by the unary ReportUsage (await it:
   * its error, if any, rejects), the report of a step cut by this close included. */
  async close(): Promise<void> {
    const call = this.call;
    // A step pausing before a retry fails likewise instead of opening a call after this.
    this.closes++;
    this.pausing?.abort();
    if (this.waiting.length) {
      // A step waits on this call: it fails (its events may be appended; the same events sent
      // again reuse its request id) instead of waiting for an answer that never comes.
      this.cut(streamClosed());
    } else {
      this.call = null;
      call?.end();
    }
    // The step cut puts back a report the daemon did not answer: it goes with the queued one.
    if (this.running) await this.current;
    await this.flushUsage();
  }
}
