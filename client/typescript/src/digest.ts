/**
 * A checkpoint's covered_digest, computed on the client: the canonical encoding that
 * checkpoint.proto documents, over events 1..N as ListEvents returns them (seq order),
 * hashed with sha256. Send it with CreateCheckpoint in COVERED_DIGEST_MODE_VERIFY.
 */
import { createHash } from "node:crypto";

import { ArtifactRef, BrowserElement, ContentPart, ToolCall } from "./gen/ctxcc/v1/common.js";
import { Event } from "./gen/ctxcc/v1/event.js";

class Encoder {
  readonly chunks: Buffer[] = [];
  raw(s: string): void {
    this.chunks.push(Buffer.from(s, "utf8"));
  }
  int(n: number): void {
    this.raw(`I${n};`);
  }
  // Lengths count UTF-8 bytes, not UTF-16 code units.
  str(s: string): void {
    this.raw(`S${Buffer.byteLength(s, "utf8")}:${s}`);
  }
  bytes(b: Uint8Array): void {
    this.raw(`B${b.length}:`);
    this.chunks.push(Buffer.from(b));
  }
  bool(b: boolean): void {
    this.raw(b ? "T" : "F");
  }
  absent(): void {
    this.raw("N");
  }
  list(k: number): void {
    this.raw(`L${k}:`);
  }
  record(name: string, fields: number): void {
    this.raw(`D${name.length}:${name}${fields}:`);
  }
  call(c: ToolCall): void {
    this.record("ToolCall", 3);
    this.str(c.callId);
    this.str(c.name);
    this.str(c.argumentsJson);
  }
  artifact(a: ArtifactRef): void {
    this.record("ArtifactRef", 6);
    this.str(a.artifactId);
    this.str(a.mimeType);
    this.int(a.sizeBytes);
    this.str(a.sha256);
    this.int(a.width);
    this.int(a.height);
  }
  element(el: BrowserElement): void {
    this.record("BrowserElement", 5);
    this.str(el.url);
    this.str(el.selector);
    this.str(el.tag);
    this.str(el.text);
    // Keys sort bytewise in UTF-8 (JavaScript's default sort compares UTF-16 units).
    const keys = Object.keys(el.attributes).sort((a, b) =>
      Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")),
    );
    this.list(keys.length);
    for (const k of keys) {
      this.list(2);
      this.str(k);
      this.str(el.attributes[k]);
    }
  }
  parts(parts: ContentPart[]): void {
    this.list(parts.length);
    for (const p of parts) {
      this.record("ContentPart", 3);
      const part = p.part;
      if (part?.$case === "text") {
        this.str(part.value);
        this.absent();
        this.absent();
      } else if (part?.$case === "attachment") {
        this.absent();
        this.artifact(part.value);
        this.absent();
      } else if (part?.$case === "browserElement") {
        this.absent();
        this.absent();
        this.element(part.value);
      } else {
        throw new Error("a content part has no content");
      }
    }
  }
  payload(ev: Event): void {
    const p = ev.payload;
    switch (p?.$case) {
      case "userMessage":
        this.record("UserMessage", 1);
        this.parts(p.value.parts);
        return;
      case "assistantMessage": {
        const m = p.value;
        this.record("AssistantMessage", 5);
        this.parts(m.parts);
        this.list(m.toolCalls.length);
        m.toolCalls.forEach((c) => this.call(c));
        this.str(m.reasoning);
        if (m.nativeState !== undefined) {
          this.record("NativeState", 3);
          this.str(m.nativeState.routeId);
          this.str(m.nativeState.kind);
          this.bytes(m.nativeState.data);
        } else {
          this.absent();
        }
        if (m.route !== undefined) {
          this.record("Route", 4);
          this.str(m.route.connection);
          this.str(m.route.protocol);
          this.str(m.route.endpoint);
          this.str(m.route.model);
        } else {
          this.absent();
        }
        return;
      }
      case "toolCall":
        this.call(p.value);
        return;
      case "toolResult": {
        const r = p.value;
        this.record("ToolResult", 5);
        this.str(r.callId);
        this.str(r.toolName);
        if (r.content?.$case === "text") {
          this.str(r.content.value);
          this.absent();
        } else if (r.content?.$case === "blob") {
          this.absent();
          this.record("BlobRef", 3);
          this.str(r.content.value.sha256);
          this.int(r.content.value.sizeBytes);
          this.str(r.content.value.preview);
        } else {
          this.absent();
          this.absent();
        }
        this.bool(r.isError);
        return;
      }
      case "importedMessage":
        this.record("ImportedMessage", 4);
        this.str(p.value.originSessionId);
        this.int(p.value.originSeq);
        this.int(p.value.role);
        this.parts(p.value.parts);
        return;
      case "attachment":
        this.record("Attachment", 1);
        this.artifact(p.value);
        return;
      case "browserElement":
        this.record("BrowserSelection", 1);
        this.element(p.value);
        return;
      case "turnStarted":
        this.record("TurnStarted", 1);
        this.str(p.value.turnId);
        return;
      case "turnCancelled":
        this.record("TurnCancelled", 2);
        this.str(p.value.reason);
        this.bool(p.value.keepReasoning);
        return;
      case "turnCompleted":
        this.record("TurnCompleted", 0);
        return;
      default:
        throw new Error(`event ${ev.seq} has no payload this client knows`);
    }
  }
}

/** Lower-case hex sha256 of the events' canonical encoding (a checkpoint's covered_digest). */
export function coveredDigest(events: Event[]): string {
  const h = createHash("sha256");
  for (const ev of events) {
    const e = new Encoder();
    e.list(3);
    e.int(ev.seq);
    e.str(ev.eventId);
    e.payload(ev);
    for (const c of e.chunks) h.update(c);
  }
  return h.digest("hex");
}
