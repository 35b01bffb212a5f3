"""The versions of provider bodies, each named by what it brought. A compile records the
version it rendered with (render.RENDERING, the latest) in its basis, and a rebuild
renders as that compile did (exact time travel): each change a version brings is made
only from it on (`view.rendering >= NAME`). Compiles recorded before versions were kept
are version 0 (render0).

1: bodies the providers' SDKs and API rules take (see render0 for what version 0 sent).
"""

from __future__ import annotations

# Anthropic bodies lead the current turn's assistant messages with their logged thinking
# blocks, and the estimate counts them (domain/thinking.py).
THINKING_BLOCKS = 2
# Gemini bodies carry the current turn's logged thought signatures, likewise counted.
THOUGHT_SIGNATURES = 3
# On Gemini 3 and later, a step of the current turn without a logged signature carries
# Google's stand-in (render_gemini.stand_in_signatures).
STAND_IN_SIGNATURES = 4
# The loop whose thinking state is sent back goes on across an interrupted tool's calls
# and from the first event of a log a checkpoint cut mid-turn, and a reused call id gets
# the signature logged under its own id (turn_thinking, render_gemini).
LOOPS_GO_ON = 5
# OpenAI and Anthropic bodies send a tool schema with no union at its top level, which
# both APIs refuse (render_common.flat_schema).
FLAT_SCHEMAS = 6
# Bodies each API takes as it states its limits: Gemini bodies carry no call ids (Vertex
# AI refuses them), Responses call ids over 64 characters are shortened and an empty one
# named, a failed call without output says so in OpenAI bodies, image/jpg is sent as
# image/jpeg, and an output cap fitted to the window leaves a margin (output_cap).
PROVIDER_LIMITS = 7
# Responses bodies lead an assistant message of the current tool loop with the reasoning
# item logged with it, where its place in the response is known, and the estimate counts
# it (domain/thinking.py, render_openai._reasoning); the state of an assistant message
# the model sees nothing of is sent with no body, whatever its kind (turn_thinking).
REASONING_ITEMS = 8
# OpenAI bodies send a tool schema without `properties` (an MCP server's tool that takes
# no arguments, `{"type": "object"}`) with `"properties": {}`: OpenAI refuses it without
# ("object schema missing properties", render_common.schema).
OBJECT_PROPERTIES = 9
# An image a format cannot carry in a message it sends as text is noted with that
# message's reason: a tool result's (an imported tool message's) and, in Chat, a system
# message's, which were noted as an assistant turn's and as "sent by reference only"
# (render_common.text_of, render_openai.openai_chat).
IMAGE_NOTES = 10
# A view with no message yet (compiled before the first user message: the system prompt
# and tools alone) is sent with the opener as its one user message in every format:
# Anthropic ("messages: at least one message is required"), Gemini (contents) and
# Responses (no input, even with instructions) refuse a request without one
# (provider_rules.OPENER).
EMPTY_VIEWS = 11
# OpenAI and Anthropic bodies send a tool schema whose top level is a local `$ref` (what
# pydantic makes of a recursive model, zod-to-json-schema of a named one) as the object
# it names, its definitions kept for the references below: OpenAI refused it ("schema
# must be a JSON Schema of 'type: \"object\"'") or, given the `type` and `properties`
# rendering 9 adds, showed the model no argument at all (render_common.schema).
TOP_LEVEL_REFS = 12
# The view's note on the output cap says when even its floor does not fit the window
# (an estimate over the window: it said the input and the output fit), and a cap at or
# under the floor is kept, not "lowered" to itself (output_cap.output_cap).
CAP_NOTES = 13
# OpenAI and Anthropic bodies resolve a top-level `$ref` only to a definition that
# describes an object (its `type` "object", a list holding "object", or none): one that
# names a string or an array schema was sent with that `type`, which both APIs refuse
# for every request that offers the tool; it is sent as registered, with `"type":
# "object"`, as before rendering 12, and a `["object", "null"]` definition as an object
# (render_common.schema).
REF_OBJECTS = 14
# Anthropic bodies send no final assistant turn of thinking blocks alone (a reply whose
# text was only whitespace, logged with its thinking): the API refuses "The final block
# in an assistant message cannot be `thinking`" (render_anthropic).
TRAILING_THINKING = 15
# Anthropic bodies strip the trailing whitespace of a final assistant turn's last block
# once its thinking blocks lead it: a turn merged from a reply ending in whitespace and a
# later message's thinking (its text whitespace) had the thinking last before the sort,
# left the text as it was, and ended with it: "final assistant content cannot end with
# trailing whitespace" (render_anthropic).
FINAL_TEXT_PAST_THINKING = 16

LATEST = FINAL_TEXT_PAST_THINKING
