/**
 * An Anthropic Messages response as the assistant event to log, thinking blocks included:
 *
 *   const msg = await anthropic.messages.create({ ..., thinking: { type: "enabled", budget_tokens: 4000 } });
 *   await stream.step({ sessionId, route }, [assistantFromAnthropic(msg, view.routeId), ...results]);
 *
 * The parameter type is structural: `@anthropic-ai/sdk`'s `Message` (and `BetaMessage`) is
 * assignable to it, and so is the response's JSON. The client depends on no SDK.
 */
import type { ContentPart, ToolCall } from "./gen/ctxcc/v1/common.js";
import { Event } from "./gen/ctxcc/v1/event.js";

/** The native state kind of Claude's thinking blocks (see `assistantFromAnthropic`). */
export const ANTHROPIC_THINKING = "anthropic.thinking";

/** One block of a response's content: the fields of the block types the helper uses
 * (`text`; `thinking` and `signature`; `redacted_thinking`'s `data`; `tool_use`'s `id`,
 * `name` and `input`). Blocks of other types are left out of the event; the fields take null
 * as some of those (the beta API's `compaction` block's `signature`) hold it. */
export interface AnthropicContentBlock {
  readonly type: string;
  readonly text?: string | null;
  readonly thinking?: string | null;
  readonly signature?: string | null;
  readonly data?: string | null;
  readonly id?: string | null;
  readonly name?: string | null;
  readonly input?: unknown;
}

/** An Anthropic Messages response (`Message`), as much of it as the helper reads. */
export interface AnthropicMessage {
  readonly content: readonly AnthropicContentBlock[];
}

/**
 * The assistant event to log for an Anthropic Messages response. Its text blocks become the
 * message's text parts (adjacent ones, as Claude splits a text at each citation, one part: a
 * view joins parts with line breaks), its `tool_use` blocks its tool calls (`callId` = id, `name`,
 * `argumentsJson` = the input's JSON), and its `thinking` / `redacted_thinking` blocks,
 * unchanged and in order, its native state of kind `ANTHROPIC_THINKING` on `routeId` (the
 * compiled view's `routeId`, the route the request went to). With extended thinking on, the
 * API refuses a tool loop whose assistant turn does not start with those blocks; the
 * daemon's Anthropic body puts them back at the head of their turn, on that route only and
 * only in the turn that made them. The thinking text is not logged as reasoning: the model
 * gets it back through the blocks, and no other route may see it (R-MISC-2).
 *
 * The state's data is the blocks as a JSON array (`{type, thinking, signature}` and
 * `{type, data}`), and each call's arguments the input's `JSON.stringify` (a missing or null
 * input is `{}`). The SDK hands over the input as `JSON.parse` made it, so a number is what a
 * JavaScript number keeps of the response's (2.0 is 2, an integer past 2^53 the float it
 * became).
 */
export function assistantFromAnthropic(message: AnthropicMessage, routeId: string): Event {
  const parts: ContentPart[] = [];
  const toolCalls: ToolCall[] = [];
  const thinking: object[] = [];
  let afterText = false; // the previous block was text: this one continues its part
  for (const block of message.content ?? []) {
    if (block.type !== "text") afterText = false;
    switch (block.type) {
      case "text":
        // An empty block adds nothing and joins nothing: across it, text stays apart or
        // together as it was.
        if (block.text) {
          addText(parts, block.text, afterText);
          afterText = true;
        }
        break;
      case "tool_use":
        toolCalls.push({ callId: String(block.id), name: String(block.name), argumentsJson: JSON.stringify(block.input ?? {}) });
        break;
      case "thinking":
        thinking.push({ type: "thinking", thinking: block.thinking, signature: block.signature });
        break;
      case "redacted_thinking":
        thinking.push({ type: "redacted_thinking", data: block.data });
        break;
    }
  }
  const nativeState =
    thinking.length > 0 ? { routeId, kind: ANTHROPIC_THINKING, data: Buffer.from(JSON.stringify(thinking), "utf8") } : undefined;
  return Event.fromPartial({ payload: { $case: "assistantMessage", value: { parts, toolCalls, nativeState } } });
}

/** Adds `text` as a part of its own, or, right after text, to that part. */
export function addText(parts: ContentPart[], text: string, afterText: boolean): void {
  const last = parts[parts.length - 1];
  if (afterText && last?.part?.$case === "text") last.part.value += text;
  else parts.push({ part: { $case: "text", value: text } });
}
