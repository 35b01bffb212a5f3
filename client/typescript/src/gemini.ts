/**
 * A Gemini generateContent response as the assistant event to log, thought signatures
 * included:
 *
 *   const resp = await ai.models.generateContent({ model: "gemini-3-pro-preview", contents, config });
 *   const logged = assistantFromGemini(resp, view.routeId);
 *   // run the calls; log their results under the call ids `logged` holds
 *
 * The parameter type is structural: `@google/genai`'s `GenerateContentResponse` is
 * assignable to it, and so is the REST response's JSON (the same camelCase fields). The
 * client depends on no SDK.
 */
import { randomBytes } from "node:crypto";

import { addText } from "./anthropic.js";
import type { ContentPart, ToolCall } from "./gen/ctxcc/v1/common.js";
import { Event } from "./gen/ctxcc/v1/event.js";

/** The native state kind of Gemini's thought signatures (see `assistantFromGemini`). */
export const GEMINI_THOUGHT_SIGNATURES = "gemini.thought_signatures";

/** A part's `functionCall`: `id` (the API may give none), `name`, and `args`, the JSON
 * object the model produced. */
export interface GeminiFunctionCall {
  readonly id?: string | null;
  readonly name?: string | null;
  readonly args?: unknown;
}

/** One part of a candidate's content, the fields the helper uses; parts of other kinds
 * (`inlineData`, `executableCode`, ...) are left out of the event. */
export interface GeminiPart {
  readonly text?: string | null;
  /** true on a thought summary (not logged: R-MISC-2). */
  readonly thought?: boolean | null;
  readonly functionCall?: GeminiFunctionCall | null;
  /** base64, on the first function call of each step Gemini 3 makes. */
  readonly thoughtSignature?: string | null;
}

/** A generateContent response (`GenerateContentResponse`), as much of it as the helper
 * reads: its first candidate's parts. */
export interface GeminiResponse {
  readonly candidates?: ReadonlyArray<{ readonly content?: { readonly parts?: readonly GeminiPart[] | null } | null }> | null;
}

/**
 * The assistant event to log for a Gemini generateContent response. Its first candidate's
 * text parts become the message's text parts (thought summaries, `thought: true`, are left
 * out: R-MISC-2), its `functionCall` parts its tool calls (`callId` = the call's id, or a
 * new unique one when the API gave none: log the tools' results under the ids the event
 * holds; `argumentsJson` = args), and the calls' thought signatures its native state of kind
 * `GEMINI_THOUGHT_SIGNATURES` on `routeId` (the compiled view's `routeId`), with data the
 * JSON object from each signed call's `callId` to its signature. Gemini 3 refuses a tool
 * loop whose signed call comes back without its signature; the daemon's Gemini body puts
 * each back on its call, on that route only and only in the turn that made it.
 *
 * Each call's arguments are `JSON.stringify(args)` (a missing or null args is `{}`); the SDK
 * hands over args as `JSON.parse` made them. A signature on a part other than a call is not
 * logged: the daemon has no place to send it back.
 */
export function assistantFromGemini(response: GeminiResponse, routeId: string): Event {
  const parts: ContentPart[] = [];
  const toolCalls: ToolCall[] = [];
  const signatures = new Map<string, string>();
  let afterText = false; // the previous part was text: this one continues its part
  for (const part of response.candidates?.[0]?.content?.parts ?? []) {
    const call = part.functionCall;
    if (call) {
      afterText = false;
      const callId = call.id || newCallId();
      toolCalls.push({ callId, name: String(call.name ?? ""), argumentsJson: JSON.stringify(call.args ?? {}) });
      if (part.thoughtSignature) signatures.set(callId, part.thoughtSignature);
    } else if (part.thought) {
      afterText = false; // a thought summary, left out, stands between texts
    } else if (part.text) {
      // Gemini may split one text over parts (a signature on the last): one part here,
      // since a view joins parts with line breaks.
      addText(parts, part.text, afterText);
      afterText = true;
    }
    // An empty part (a signature alone) joins nothing and breaks nothing.
  }
  const nativeState =
    signatures.size > 0
      ? { routeId, kind: GEMINI_THOUGHT_SIGNATURES, data: Buffer.from(JSON.stringify(Object.fromEntries(signatures)), "utf8") }
      : undefined;
  return Event.fromPartial({ payload: { $case: "assistantMessage", value: { parts, toolCalls, nativeState } } });
}

/** A call id for a function call the API gave none: unique in the session, the form the
 * Python client's `assistant_from_gemini` makes. */
const newCallId = (): string => `call_${randomBytes(8).toString("hex")}`;
