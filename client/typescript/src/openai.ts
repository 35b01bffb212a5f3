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
 * arguments as the model wrote them), and the reasoning item right before its first message
 * or call its native state of kind `OPENAI_REASONING` on `routeId` (the compiled view's
 * `routeId`): the item's id, summary and `encrypted_content`. OpenAI asks that a reasoning
 * model's items since the latest user message go back with its calls; the daemon's Responses
 * body sends it, stateless (`store: false`), on that route only and only in the turn that
 * made it.
 *
 * The API refuses a reasoning item that is not right before the item that followed it, and
 * an event keeps no order between its text and its calls: so only that item is logged (the
 * reasoning items before it, and any after the first message or call, are left out, as a
 * client that keeps no reasoning leaves them all), and only with its encrypted content (a
 * stateless request cannot name a stored item). A response with nothing but reasoning (cut
 * at its output cap) gives a message with only that state, which the daemon logs and sends
 * nowhere. The raw reasoning text is not logged (R-MISC-2).
 */
export function assistantFromOpenAIResponses(response: OpenAIResponse, routeId: string): Event {
  const parts: ContentPart[] = [];
  const toolCalls: ToolCall[] = [];
  let leading: Readonly<Record<string, unknown>> | undefined; // the last reasoning item before the first message or call
  let started = false;
  for (const it of response.output ?? []) {
    // Read as the untyped object it is: each field's shape is checked where it is used.
    const item: Readonly<Record<string, unknown>> = { ...it };
    if (item.type === "reasoning") {
      if (!started) leading = item;
    } else if (item.type === "message") {
      started = true;
      let afterText = false;
      for (const c of list(item.content)) {
        const text = c.type === "output_text" ? c.text : c.type === "refusal" ? c.refusal : null;
        if (typeof text === "string" && text) {
          addText(parts, text, afterText);
          afterText = true;
        }
      }
    } else if (item.type === "function_call") {
      started = true;
      const args = typeof item.arguments === "string" && item.arguments ? item.arguments : "{}";
      toolCalls.push({ callId: String(item.call_id ?? ""), name: String(item.name ?? ""), argumentsJson: args });
    }
  }
  let nativeState;
  if (leading && typeof leading.encrypted_content === "string" && leading.encrypted_content) {
    const summary = list(leading.summary).map((s) => ({ type: "summary_text" as const, text: String(s.text ?? "") }));
    const item = { type: "reasoning", id: String(leading.id ?? ""), summary, encrypted_content: leading.encrypted_content };
    nativeState = { routeId, kind: OPENAI_REASONING, data: Buffer.from(JSON.stringify([item]), "utf8") };
  }
  return Event.fromPartial({ payload: { $case: "assistantMessage", value: { parts, toolCalls, nativeState } } });
}
