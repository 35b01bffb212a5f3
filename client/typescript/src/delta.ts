/**
 * Delta views: a step's view sent as what changed against the last view the stream holds
 * (a ViewDelta), rebuilt whole here and checked against the digest the daemon states.
 */
import { createHash } from "node:crypto";
import { BinaryReader, BinaryWriter } from "@bufbuild/protobuf/wire";

import type { ViewDelta } from "./gen/ctxcc/v1/compile_service.js";
import { CompactionRequest, CompiledView, SystemSection, ViewMessage, ViewTool } from "./gen/ctxcc/v1/view.js";

/** Lower-case hex sha256 of a view's serialization, the digest a ViewDelta states. ts-proto
 * writes fields in number order and map entries in the order they were decoded, which for a
 * view from the daemon is the deterministic one. */
export function viewDigest(view: CompiledView): string {
  return createHash("sha256").update(CompiledView.encode(view).finish()).digest("hex");
}

/** Encodings of view messages by object, as field 10 of a view (tag and length included). A
 * view rebuilt from a delta shares its kept messages with its base, so with these only its new
 * messages are encoded for its digest. */
export type MessageRecords = WeakMap<ViewMessage, Uint8Array>;

const MESSAGES_FIELD = 10;

/** viewDigest, encoding each message once per object: the view without its messages is
 * encoded whole, and the messages' records (CompiledView.messages is field 10) are hashed
 * where field 10 goes, before the first field above it. */
function digestWith(view: CompiledView, records: MessageRecords): string {
  const rest = CompiledView.encode({ ...view, messages: [] }).finish();
  const reader = new BinaryReader(rest);
  let at = rest.length;
  while (reader.pos < reader.len) {
    const start = reader.pos;
    const [fieldNo, wireType] = reader.tag();
    if (fieldNo > MESSAGES_FIELD) {
      at = start;
      break;
    }
    reader.skip(wireType, fieldNo);
  }
  const parts: Uint8Array[] = [rest.subarray(0, at)];
  for (const m of view.messages) {
    let record = records.get(m);
    if (!record) {
      record = ViewMessage.encode(m, new BinaryWriter().uint32((MESSAGES_FIELD << 3) | 2).fork()).join().finish();
      records.set(m, record);
    }
    parts.push(record);
  }
  parts.push(rest.subarray(at));
  // One update: hashing in 200 small pieces costs more than copying them into one buffer.
  return createHash("sha256").update(Buffer.concat(parts)).digest("hex");
}

export class DeltaMismatch extends Error {}

/** Builds the view `delta` describes against `base`, without checking its digest. */
function rebuild(base: CompiledView | null, delta: ViewDelta): CompiledView {
  if (!base || base.compileId !== delta.baseCompileId) {
    throw new DeltaMismatch(`delta against "${delta.baseCompileId}", but the view held is "${base?.compileId ?? ""}"`);
  }
  if (!delta.head) throw new DeltaMismatch(`delta against "${delta.baseCompileId}" has no head`);
  if (delta.keptMessages > base.messages.length) {
    throw new DeltaMismatch(`delta keeps ${delta.keptMessages} messages of a view with ${base.messages.length}`);
  }
  const sections: SystemSection[] = delta.sections.map((slot) => {
    if (slot.slot?.$case === "section") return slot.slot.value;
    if (slot.slot?.$case === "baseIndex") {
      const s = base.systemSections[slot.slot.value];
      if (!s) throw new DeltaMismatch(`delta names section ${slot.slot.value} of a view with ${base.systemSections.length}`);
      return s;
    }
    throw new DeltaMismatch("delta has an empty section slot");
  });
  let compaction = delta.head.compaction;
  if (delta.compactionKept) {
    if (!base.compaction || compaction) {
      throw new DeltaMismatch("delta keeps the compaction of a view without one, or has its own");
    }
    compaction = base.compaction;
  }
  return {
    ...delta.head,
    messages: [...base.messages.slice(0, delta.keptMessages), ...delta.appendedMessages],
    systemSections: sections,
    systemPrompt: sections.map((s) => s.text).join("\n\n"),
    tools: delta.toolsChanged ? delta.tools : base.tools,
    compaction,
  };
}

/**
 * Rebuilds the whole view that `delta` describes against `base` (the view named by
 * delta.baseCompileId) and checks it against delta.viewSha256, or against delta.chainSha256
 * when the delta carries the chained digest; throws DeltaMismatch when it cannot be rebuilt
 * or its digest differs (then ask for it whole; Stream.step does).
 *
 * The result is a new object, but the messages, sections, tools and compaction it keeps from
 * `base` are the same objects as base's: nothing is copied, so treat views as read-only. With
 * `records`, message encodings are remembered there and reused by object.
 */
export function applyDelta(base: CompiledView | null, delta: ViewDelta, records?: MessageRecords): CompiledView {
  if (delta.chainSha256) {
    // The delta does not say which chained digest was asked for: either is taken.
    const baseChain = extendChain([], 0, base?.messages ?? []);
    try {
      return applyChainedDelta(base, delta, baseChain).view;
    } catch (err) {
      if (!(err instanceof DeltaMismatch)) throw err;
      return applyChainedDelta(base, delta, baseChain, new PartRecords(), true).view;
    }
  }
  const view = rebuild(base, delta);
  const digest = records ? digestWith(view, records) : viewDigest(view);
  if (digest !== delta.viewSha256) {
    throw new DeltaMismatch(`view ${view.compileId} rebuilt from a delta has sha256 ${digest}, the daemon's is ${delta.viewSha256}`);
  }
  return view;
}

/** c_0 of the chained digest: the chain value of no messages. */
const CHAIN_START = Buffer.alloc(32);

/** The chain values c_1..c_n of a view whose first `kept` messages are those of the view
 * whose chain values are `base`, followed by `messages` (the only ones encoded and hashed):
 * c_i = sha256(c_{i-1} || sha256(encoding of message i)). */
export function extendChain(base: readonly Buffer[], kept: number, messages: readonly ViewMessage[]): Buffer[] {
  const out = base.slice(0, kept);
  let last = kept > 0 ? base[kept - 1] : CHAIN_START;
  for (const m of messages) {
    const h = createHash("sha256").update(ViewMessage.encode(m).finish()).digest();
    last = createHash("sha256").update(last).update(h).digest();
    out.push(last);
  }
  return out;
}

/** Encodings a stream keeps for the digest of its next view: its sections' and tools'
 * records by object (fields 6 and 11, tag and length included; a view rebuilt from a delta
 * shares the sections and tools it keeps with its base) and the last system prompt's record.
 * With them a step encodes the head and what changed, not the system prompt, sections and
 * tool definitions again (often most of a view without its messages). */
export class PartRecords {
  readonly sections = new WeakMap<SystemSection, Uint8Array>();
  readonly tools = new WeakMap<ViewTool, Uint8Array>();
  /** Q of the digest with the compaction apart, by request object: a delta that keeps its
   * base's request (compactionKept) hands on the same object, so over budget the request,
   * as long as a model window, is hashed once per turn. */
  readonly compactions = new WeakMap<CompactionRequest, Buffer>();
  prompt = "";
  promptRecord: Uint8Array = new Uint8Array(0);
}

const SECTIONS_FIELD = 6;
const PROMPT_FIELD = 7;
const TOOLS_FIELD = 11;

function recordOf<T extends object>(
  cache: WeakMap<T, Uint8Array>,
  item: T,
  field: number,
  fns: { encode(m: T, w: BinaryWriter): BinaryWriter },
): Uint8Array {
  let record = cache.get(item);
  if (!record) {
    record = fns.encode(item, new BinaryWriter().uint32((field << 3) | 2).fork()).join().finish();
    cache.set(item, record);
  }
  return record;
}

/** The encoding of `view` without its messages, in pieces: the head (every field but the
 * sections, prompt, messages and tools) encoded and cut where the records of fields 6, 7
 * and 11 go in (ts-proto writes fields in number order), those records from `parts`. */
function restPieces(view: CompiledView, parts: PartRecords, apart: boolean): Uint8Array[] {
  const bare = { ...view, messages: [], systemSections: [], systemPrompt: "", tools: [] };
  const head = CompiledView.encode(apart ? { ...bare, compaction: undefined } : bare).finish();
  const reader = new BinaryReader(head);
  let front = head.length;
  let back = head.length;
  while (reader.pos < reader.len) {
    const start = reader.pos;
    const [fieldNo, wireType] = reader.tag();
    if (fieldNo > SECTIONS_FIELD && front === head.length) front = start;
    if (fieldNo > TOOLS_FIELD) {
      back = start;
      break;
    }
    reader.skip(wireType, fieldNo);
  }
  if (parts.prompt !== view.systemPrompt || parts.promptRecord.length === 0) {
    parts.prompt = view.systemPrompt;
    parts.promptRecord =
      view.systemPrompt === ""
        ? new Uint8Array(0)
        : new BinaryWriter().uint32((PROMPT_FIELD << 3) | 2).string(view.systemPrompt).finish();
  }
  return [
    head.subarray(0, front),
    ...view.systemSections.map((s) => recordOf(parts.sections, s, SECTIONS_FIELD, SystemSection)),
    parts.promptRecord,
    head.subarray(front, back),
    ...view.tools.map((t) => recordOf(parts.tools, t, TOOLS_FIELD, ViewTool)),
    head.subarray(back),
  ];
}

/** Q of the digest with the compaction apart: sha256 of the request's encoding (32 zero
 * bytes without one), from `parts` when that request object was hashed before. */
function compactionDigest(request: CompactionRequest | undefined, parts?: PartRecords): Buffer {
  if (request === undefined) return CHAIN_START;
  let q = parts?.compactions.get(request);
  if (!q) {
    q = createHash("sha256").update(CompactionRequest.encode(request).finish()).digest();
    parts?.compactions.set(request, q);
  }
  return q;
}

/** The chained digest (ViewDelta.chain_sha256) of `view`, whose messages' chain values are
 * `values`: sha256(sha256(the view's encoding without its messages) || c_n), hex. With
 * `parts`, the sections, prompt and tools are not encoded again where they are known. With
 * `apart` (DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART), sha256(R' || c_n || Q): R' without
 * the compaction request either, Q the request's own sha256. */
function chainDigestWith(view: CompiledView, values: readonly Buffer[], parts?: PartRecords, apart = false): string {
  const encoding = parts
    ? Buffer.concat(restPieces(view, parts, apart))
    : CompiledView.encode({ ...view, messages: [], ...(apart ? { compaction: undefined } : {}) }).finish();
  const rest = createHash("sha256").update(encoding).digest();
  const last = values.length > 0 ? values[values.length - 1] : CHAIN_START;
  const h = createHash("sha256").update(rest).update(last);
  if (apart) h.update(compactionDigest(view.compaction, parts));
  return h.digest("hex");
}

/** The chained digest of a whole view, over all its messages (a stream continues it from its
 * base's chain values instead); with `compactionApart`, the one with the compaction request
 * hashed apart. */
export function chainDigest(view: CompiledView, compactionApart = false): string {
  return chainDigestWith(view, extendChain([], 0, view.messages), undefined, compactionApart);
}

/**
 * applyDelta for a delta with the chained digest, continued from `baseChain` (the chain
 * values of base's messages): only the appended messages and the view without its messages
 * are encoded and hashed. Returns the view and its chain values, the next delta's base. With
 * `parts` (kept from one step to the next, as the stream does), the sections, system prompt
 * and tools the view shares with the base are not encoded again.
 */
export function applyChainedDelta(
  base: CompiledView | null,
  delta: ViewDelta,
  baseChain: readonly Buffer[],
  parts?: PartRecords,
  compactionApart = false,
): { view: CompiledView; chain: Buffer[] } {
  if (base && baseChain.length !== base.messages.length) {
    throw new DeltaMismatch(`the base's chain has ${baseChain.length} values for ${base.messages.length} messages`);
  }
  const view = rebuild(base, delta);
  const chain = extendChain(baseChain, delta.keptMessages, delta.appendedMessages);
  const digest = chainDigestWith(view, chain, parts, compactionApart);
  if (digest !== delta.chainSha256) {
    throw new DeltaMismatch(`view ${view.compileId} rebuilt from a delta has chained digest ${digest}, the daemon's is ${delta.chainSha256}`);
  }
  return { view, chain };
}
