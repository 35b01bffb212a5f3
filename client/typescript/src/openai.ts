/**
 * An OpenAI Responses API response as the assistant event to log, reasoning items included:
 *
 *   const resp = await openai.responses.create({ model: "o4-mini", ...body });
 *   const logged = assistantFromOpenAIResponses(resp, view.routeId);
 *   // run the calls; log their results under the calls' callId
 *
 * The parameter type is structural: the `openai` SDK's `Response` is assignable to it, and
 * so is the response's JSON. The client depends on no SDK.
 */
import { addText } from "./anthropic.js";
import type { ContentPart, ToolCall } from "./gen/ctxcc/v1/common.js";
import { Event } from "./gen/ctxcc/v1/event.js";

/** The native state kind of OpenAI's reasoning items (see `assistantFromOpenAIResponses`). */
export const OPENAI_REASONING = "openai.reasoning";

/** One item of a response's output. Only `type` is typed: the helper reads the fields of
 * the item types it uses (`message`: `content`; `function_call`: `call_id`, `name`,
 * `arguments`; `reasoning`: `id`, `summary`, `encrypted_content`) and checks their shape
 * as it reads them, so that every item type of the SDK's output union (some with fields of
 * these names holding other things) is assignable; items of other types (`web_search_call`,
 * ...) are left out of the event. */
export interface OpenAIOutputItem {
  /** "message", "function_call", "reasoning", or another one. */
  readonly type: string;
}

/** A Responses API response (`Response`), as much of it as the helper reads. */
export interface OpenAIResponse {
  readonly output?: readonly OpenAIOutputItem[] | null;
}

/** `value`'s objects when it is an array (of parts, of summary texts), else none. */
function list(value: unknown): Array<Record<string, unknown>> {
  return Array.isArray(value) ? value.filter((v): v is Record<string, unknown> => typeof v === "object" && v !== null) : [];
}

/**
 * The assistant event to log for an OpenAI Responses API response. The `output_text` (and
 * `refusal`) parts of its message items become the message's text (one part per message
 * item: a view joins parts with line breaks), its `function_call` items its tool calls
 * (`callId` = `call_id`, which the `function_call_output` names; `argumentsJson` = the
 * arguments as the model wrote them), and its `reasoning` items its native state of kind
 * `OPENAI_REASONING` on `routeId` (the compiled view's `routeId`): each item's id, summary
 * and `encrypted_content`. OpenAI asks that a reasoning model's items since the latest user
 * message go back with its calls; the daemon's Responses body sends them, stateless
 * (`store: false`), on that route only and only in the turn that made them. An item without
 * encrypted content (a stored response's, named by id alone) cannot go back statelessly and
 * is left out; the raw reasoning text is not logged (R-MISC-2).
 */
export function assistantFromOpenAIResponses(response: OpenAIResponse, routeId: string): Event {
  const parts: ContentPart[] = [];
  const toolCalls: ToolCall[] = [];
  const reasoning: Array<{ type: "reasoning"; id: string; summary: Array<{ type: "summary_text"; text: string }>; encrypted_content: string }> = [];
  for (const it of response.output ?? []) {
    // Read as the untyped object it is: each field's shape is checked where it is used.
    const item: Readonly<Record<string, unknown>> = { ...it };
    if (item.type === "message") {
      let afterText = false;
      for (const c of list(item.content)) {
        const text = c.type === "output_text" ? c.text : c.type === "refusal" ? c.refusal : null;
        if (typeof text === "string" && text) {
          addText(parts, text, afterText);
          afterText = true;
        }
      }
    } else if (item.type === "function_call") {
      const args = typeof item.arguments === "string" && item.arguments ? item.arguments : "{}";
      toolCalls.push({ callId: String(item.call_id ?? ""), name: String(item.name ?? ""), argumentsJson: args });
    } else if (item.type === "reasoning" && typeof item.encrypted_content === "string" && item.encrypted_content) {
      const summary = list(item.summary).map((s) => ({ type: "summary_text" as const, text: String(s.text ?? "") }));
      reasoning.push({ type: "reasoning", id: String(item.id ?? ""), summary, encrypted_content: item.encrypted_content });
    }
  }
  const nativeState =
    reasoning.length > 0 ? { routeId, kind: OPENAI_REASONING, data: Buffer.from(JSON.stringify(reasoning), "utf8") } : undefined;
  return Event.fromPartial({ payload: { $case: "assistantMessage", value: { parts, toolCalls, nativeState } } });
}
