/**
 * Delta views: a step's view sent as what changed against the last view the stream holds
 * (a ViewDelta), rebuilt whole here and checked against the digest the daemon states.
 */
import { createHash } from "node:crypto";
import { BinaryReader, BinaryWriter } from "@bufbuild/protobuf/wire";

import type { ViewDelta } from "./gen/ctxcc/v1/compile_service.js";
import { CompiledView, ViewMessage, type SystemSection } from "./gen/ctxcc/v1/view.js";

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
  if (delta.chainSha256) return applyChainedDelta(base, delta, extendChain([], 0, base?.messages ?? [])).view;
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

/** The chained digest (ViewDelta.chain_sha256) of `view`, whose messages' chain values are
 * `values`: sha256(sha256(the view's encoding without its messages) || c_n), hex. */
function chainDigestWith(view: CompiledView, values: readonly Buffer[]): string {
  const rest = createHash("sha256").update(CompiledView.encode({ ...view, messages: [] }).finish()).digest();
  const last = values.length > 0 ? values[values.length - 1] : CHAIN_START;
  return createHash("sha256").update(rest).update(last).digest("hex");
}

/** The chained digest of a whole view, over all its messages (a stream continues it from its
 * base's chain values instead). */
export function chainDigest(view: CompiledView): string {
  return chainDigestWith(view, extendChain([], 0, view.messages));
}

/**
 * applyDelta for a delta with the chained digest, continued from `baseChain` (the chain
 * values of base's messages): only the appended messages and the view without its messages
 * are encoded and hashed. Returns the view and its chain values, the next delta's base.
 */
export function applyChainedDelta(
  base: CompiledView | null,
  delta: ViewDelta,
  baseChain: readonly Buffer[],
): { view: CompiledView; chain: Buffer[] } {
  if (base && baseChain.length !== base.messages.length) {
    throw new DeltaMismatch(`the base's chain has ${baseChain.length} values for ${base.messages.length} messages`);
  }
  const view = rebuild(base, delta);
  const chain = extendChain(baseChain, delta.keptMessages, delta.appendedMessages);
  const digest = chainDigestWith(view, chain);
  if (digest !== delta.chainSha256) {
    throw new DeltaMismatch(`view ${view.compileId} rebuilt from a delta has chained digest ${digest}, the daemon's is ${delta.chainSha256}`);
  }
  return { view, chain };
}
