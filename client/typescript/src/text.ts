/**
 * Strings a request carries must be well-formed UTF-16: protobuf strings are UTF-8 on the
 * wire, and a lone surrogate has no UTF-8 form. The protobuf runtime would send U+FFFD in
 * its place, so the daemon would store other text than the caller's; the Python client
 * (UnicodeEncodeError) and the Go client (invalid UTF-8) refuse such a string before
 * anything is sent, and so does this one.
 */
import * as grpc from "@grpc/grpc-js";

import { CtxccError } from "./errors.js";

// String.prototype.isWellFormed (Node 20+; typed from lib ES2024, above this build's target).
const wellFormed = (s: string): boolean => (s as string & { isWellFormed(): boolean }).isWellFormed();

const snake = (name: string): string => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

function lone(s: string): string {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
      if (d >= 0xdc00 && d <= 0xdfff) {
        i++;
        continue;
      }
    } else if (c < 0xdc00 || c > 0xdfff) continue;
    return `U+${c.toString(16).toUpperCase()} at index ${i}`;
  }
  return "";
}

function refused(path: string, s: string): CtxccError {
  return new CtxccError(
    grpc.status.INVALID_ARGUMENT,
    "INVALID_FIELD",
    `${path} holds a lone UTF-16 surrogate (${lone(s)}), which UTF-8 cannot encode; nothing was sent`,
    { field: path },
  );
}

function walk(value: unknown, path: string, seen: Set<object>): void {
  if (typeof value === "string") {
    if (!wellFormed(value)) throw refused(path, value);
    return;
  }
  if (value === null || typeof value !== "object" || ArrayBuffer.isView(value) || seen.has(value)) return;
  seen.add(value);
  if (Array.isArray(value)) {
    value.forEach((v, i) => walk(v, `${path}[${i}]`, seen));
    return;
  }
  for (const [k, v] of Object.entries(value)) {
    // A map's keys are strings sent too (a message's own field names are ASCII).
    if (!wellFormed(k)) throw refused(`${path} key`, k);
    // A oneof as ts-proto holds it, payload: { $case: "userMessage", value }, is the field
    // named by $case, as in the proto.
    const one = v as { $case?: unknown; value?: unknown } | null;
    if (one !== null && typeof one === "object" && typeof one.$case === "string" && "value" in one) {
      walk(one.value, `${path}.${snake(one.$case)}`, seen);
    } else {
      walk(v, `${path}.${snake(k)}`, seen);
    }
  }
}

/**
 * Throws a CtxccError INVALID_ARGUMENT, reason INVALID_FIELD (the shape of the daemon's own
 * refusal of a malformed field), with metadata `field` naming where the first string of
 * `request` holding a lone surrogate is (e.g. "request.events[0].user_message.parts[0].text").
 */
export function refuseLoneSurrogates(request: unknown, path = "request"): void {
  walk(request, path, new Set());
}
