"""compile_view: the one entry point of the core. Inputs in, CompiledView out.

The service has already chosen the checkpoint (see checkpoints.py) and loaded the
events the projection needs; everything here is pure and deterministic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from server.compiler import renderings
from server.compiler.budget import BudgetConfig, ModelLimits, judge
from server.compiler.builtin_tools import LOAD_RULE, READ_TOOL_RESULT, TOOL_SEARCH
from server.compiler.compaction import compaction_request, prompt_room, working_set_start
from server.compiler.estimate import estimate
from server.compiler.incremental import project_incremental
from server.compiler.output_cap import output_cap
from server.compiler.path_memo import TurnPaths, path_union
from server.compiler.projection import (
    COMPACTION_IN_PROVIDER_TOKENS,
    HISTORY_IN_PROVIDER_TOKENS,
    PLAUSIBLE_DELTAS,
    PROJECTION,
    SUMMARY_CUT,
    ImagePolicy,
    Projection,
    as_projected,
    request_byte_cap,
)
from server.compiler.projection_memo import (
    ActiveTurn,
    ProjectionMemo,
    SentThinking,
    active_turn,
    event_texts,
    extends,
)
from server.compiler.prompt_memo import (
    PromptInputs,
    any_prompt,
    section_text_digests,
    system_prompt,
)
from server.compiler.render import RENDERING
from server.compiler.route_model import BOUNDS, CounterKind, RatioBounds, ratio_of
from server.compiler.sources import SourceInputs, matches_paths
from server.compiler.system import (
    DEFAULT_KERNEL,
    ApprovalMode,
    EnvironmentInfo,
    prefix_digest,
)
from server.compiler.textscan import FoundPaths
from server.compiler.tokens import COUNTING, MESSAGE_OVERHEAD, TokenCounter
from server.compiler.tool_cap import (
    TOOL_CAPPING,
    capped_candidates,
    description_cap,
    fitted,
    tool_cap,
    with_deferred,
)
from server.compiler.tool_search import query_of, search_tools
from server.compiler.turn_thinking import SINCE, sent_thinking
from server.compiler.view import (
    VOLATILE_SECTIONS,
    CompiledView,
    Decision,
    FallbackReason,
    Layer,
    LayerTokens,
    RouteParams,
    SectionKind,
    SystemSection,
    ToolOrigin,
    ToolSpec,
    ToolVisibility,
    ViewTool,
)
from server.compiler.work import Check, checked, unchecked
from server.domain.grown import Grown
from server.domain.model import (
    AssistantMessage,
    Event,
    NativeState,
    Route,
    Session,
    ToolCall,
    ToolResult,
)
from server.domain.records import Checkpoint, RouteModel, RouteState
from server.domain.replacing import replaced
from server.domain.tools import REGISTRY_SEARCHES, ToolRegistry


@dataclass(frozen=True, slots=True)
class CompileInputs:
    compile_id: str
    session: Session
    # The whole log up to the boundary, or only the events after `checkpoint`.
    events: Sequence[Event]
    event_boundary: int
    route: Route
    limits: ModelLimits = ModelLimits()
    route_state: RouteState | None = None
    # What usage on this route (any session) taught the daemon; None before any report.
    route_model: RouteModel | None = None
    counter_kind: CounterKind = CounterKind.SCALED
    kernel_text: str = DEFAULT_KERNEL
    approval_mode: ApprovalMode = ApprovalMode.ON_REQUEST
    environment: EnvironmentInfo = EnvironmentInfo()
    sources: SourceInputs = SourceInputs()
    exclude_sections: frozenset[SectionKind] = frozenset()
    tools: tuple[ToolSpec, ...] = ()
    # Deferred tools activated over the SearchTools RPC in the current turn.
    activated_tools: tuple[str, ...] = ()
    checkpoint: Checkpoint | None = None
    # The latest user message when the checkpoint covers it (re-injected verbatim).
    current_user: Event | None = None
    fallback_reasons: tuple[FallbackReason, ...] = ()
    images: ImagePolicy = ImagePolicy()
    budget_config: BudgetConfig = field(default_factory=BudgetConfig)
    # Section digests of the session's previous compile, to report what changed.
    previous_sections: tuple[tuple[int, str], ...] | None = None
    # The caller's own output cap for provider bodies, 0 when it gave none.
    requested_max_output: int = 0
    # How tool-call arguments are counted (tokens.COUNTING): a rebuild counts as the
    # daemon that recorded the compile did.
    counting: int = COUNTING
    # How the log is projected (projection.PROJECTION): a rebuild projects as the daemon
    # that recorded the compile did.
    projection: int = PROJECTION
    # How provider bodies are rendered (render.RENDERING): likewise.
    rendering: int = RENDERING
    # Whether the route's tool cap applies (tool_cap.TOOL_CAPPING; 0: never): likewise.
    tool_capping: int = TOOL_CAPPING


def tool_tokens(spec: ToolSpec, counter: TokenCounter) -> int:
    return (
        MESSAGE_OVERHEAD
        + counter.count(spec.name)
        + counter.count(spec.description)
        + counter.count(spec.input_schema_json)
    )


def searched_in_turn(
    turn: Sequence[Event],
    registry: Sequence[ToolSpec],
    *,
    any_script: bool = True,
    forms: bool = True,
) -> set[str]:
    """Deferred tools found by tool_search calls of this turn that have a result: the
    search is re-run, deterministically, on the call's query (R-TOOL-2), with the words
    of the tool capping version the compile applies (`any_script`: from version 3;
    `forms`, plurals folded: from version 4)."""
    answered = {e.payload.call_id for e in turn if isinstance(e.payload, ToolResult)}
    found: set[str] = set()
    for e in turn:
        p = e.payload
        calls = (
            p.tool_calls
            if isinstance(p, AssistantMessage)
            else ((p,) if isinstance(p, ToolCall) else ())
        )
        for call in calls:
            if call.name == TOOL_SEARCH.name and call.call_id in answered:
                found.update(_found(registry, query_of(call.arguments_json), any_script, forms))
    return found


def _found(
    registry: Sequence[ToolSpec], query: str, any_script: bool, forms: bool
) -> frozenset[str]:
    """The names `query` finds in `registry`, remembered by a ToolRegistry."""
    searches = registry.searches if isinstance(registry, ToolRegistry) else None
    key = (query, any_script, forms)
    names = searches.get(key) if searches is not None else None
    if names is None:
        found = search_tools(registry, query, any_script=any_script, forms=forms)
        names = frozenset(s.name for s in found)
        if searches is not None and len(searches) < REGISTRY_SEARCHES:
            searches[key] = names
    return names


@dataclass(frozen=True, slots=True)
class ToolChoice:
    tools: tuple[ViewTool, ...]
    # Direct tools offered through tool_search instead (the route's tool cap), and
    # activated tools the cap left out.
    deferred_by_cap: int = 0
    notes: tuple[str, ...] = ()


def select_tools(
    inputs: CompileInputs,
    counter: TokenCounter,
    *,
    references_blobs: bool,
    loadable_rules: bool,
    turn_start: int,
) -> ToolChoice:
    registry = inputs.tools
    cap = tool_cap(inputs.route.protocol) if inputs.tool_capping >= 1 else None
    direct = sorted(
        (s for s in registry if s.visibility == ToolVisibility.DIRECT), key=lambda s: s.name
    )
    prefix, over = capped_candidates(direct, cap)
    # What tool_search finds on this route: the registry's deferred tools and, when the
    # direct ones may not all fit, those after the prefix (tool_cap.py).
    searchable = with_deferred(registry, over) if over else registry
    by_name = {s.name: s for s in searchable}
    # Activated overflow tools are sent as the registry has them.
    original = {s.name: s for s in registry}
    deferred = any(s.visibility == ToolVisibility.DEFERRED for s in registry)
    # Only deferred tools are activated: without any, the turn need not be searched.
    activated_names = set(inputs.activated_tools) | (
        searched_in_turn(
            inputs.events[turn_start:] if turn_start >= 0 else (),
            searchable,
            any_script=inputs.tool_capping >= 3,
            forms=inputs.tool_capping >= 4,
        )
        if deferred or over
        else set()
    )
    activatable = sorted(
        (
            original[n]
            for n in activated_names
            if n in by_name and by_name[n].visibility == ToolVisibility.DEFERRED
        ),
        key=lambda s: s.name,
    )
    over_names = {s.name for s in over}
    registry_deferred = [s for s in activatable if s.name not in over_names]
    builtins = []
    if deferred:
        builtins.append((TOOL_SEARCH, ToolOrigin.BUILTIN_TOOL_SEARCH))
    if references_blobs:
        builtins.append((READ_TOOL_RESULT, ToolOrigin.BUILTIN_READ_TOOL_RESULT))
    if loadable_rules:
        builtins.append((LOAD_RULE, ToolOrigin.BUILTIN_LOAD_RULE))
    notes: tuple[str, ...] = ()
    hidden = 0
    if cap is None or len(direct) + len(registry_deferred) + len(builtins) <= cap:
        shown_direct, activated = direct, registry_deferred
    else:
        # Over the cap: the built-ins (tool_search among them, without which the rest
        # would be unreachable), the prefix and the activated tools take their slots
        # first; then as many more direct tools, in name order, as fit.
        if not deferred:
            builtins.insert(0, (TOOL_SEARCH, ToolOrigin.BUILTIN_TOOL_SEARCH))
        room = cap - len(builtins) - len(prefix)
        activated = activatable[:room]
        left_out = len(activatable) - len(activated)
        taken = {s.name for s in activated}
        rest = [s for s in over if s.name not in taken]
        extra = rest[: room - len(activated)]
        shown_direct = [*prefix, *extra]
        hidden = len(rest) - len(extra)
        if hidden:
            notes += (
                f"{hidden} of the {len(direct)} direct tools are offered through "
                f"tool_search in this view, as deferred tools are: the route's protocol "
                f"{inputs.route.protocol!r} takes at most {cap} tools a request",
            )
        if left_out:
            notes += (
                f"{left_out} tools activated this turn are not offered in this view: the "
                f"route's protocol {inputs.route.protocol!r} takes at most {cap} tools a "
                "request",
            )
        hidden += left_out
    chosen = [(s, ToolOrigin.DIRECT) for s in shown_direct] + [
        (s, ToolOrigin.ACTIVATED) for s in activated
    ]
    # Built-ins come last so registry tools keep their cache-friendly positions.
    chosen += builtins
    # Descriptions the route's provider would refuse as too long are cut (tool_cap.py).
    longest = description_cap(inputs.route.protocol) if inputs.tool_capping >= 2 else None
    out, cut = _view_tools(chosen, counter, longest)
    if cut:
        notes += (
            f"the descriptions of {len(cut)} tools ({', '.join(cut[:5])}"
            f"{', ...' if len(cut) > 5 else ''}) are cut to {longest} characters in this "
            f"view: the route's protocol {inputs.route.protocol!r} refuses longer ones",
        )
    return ToolChoice(out, hidden, notes)


def _view_tools(
    chosen: Sequence[tuple[ToolSpec, ToolOrigin]], counter: TokenCounter, longest: int | None
) -> tuple[tuple[ViewTool, ...], list[str]]:
    """The chosen tools, each name once (the first), descriptions fitted to `longest`,
    counted as sent; and the names of those whose description was cut."""
    taken_names: set[str] = set()
    out = []
    cut = []
    for spec, origin in chosen:
        if spec.name not in taken_names:
            taken_names.add(spec.name)
            shown = fitted(spec, longest)
            if shown is not spec:
                cut.append(spec.name)
            out.append(ViewTool(shown, origin, tool_tokens(shown, counter)))
    return tuple(out), cut


def tools_digest(tools: Sequence[ViewTool]) -> str:
    """The tool definitions as providers receive them, in order."""
    h = hashlib.sha256()
    for t in tools:
        for text in (t.spec.name, t.spec.description, t.spec.input_schema_json):
            h.update(f"{len(text.encode())}:".encode())
            h.update(text.encode())
    return h.hexdigest()


def section_digests(
    sections: Sequence[SystemSection],
    tools: Sequence[ViewTool] = (),
    known: tuple[tuple[int, str], ...] | None = None,
) -> tuple[tuple[int, str], ...]:
    """`known`: the sections' own digests (prompt_memo.Prompt.digests), if made already."""
    digests = list(known if known is not None else section_text_digests(sections))
    if tools:
        digests.append((int(SectionKind.TOOLS), tools_digest(tools)[:32]))
    return tuple(digests)


def cache_prefix_digest(
    sections: Sequence[SystemSection], tools: Sequence[ViewTool], stable: str | None = None
) -> str:
    """Everything in front of the providers' cache breakpoints: the tools (first in
    Anthropic bodies, part of the cached prefix at OpenAI and Gemini) and the stable
    system sections. Without tools it is the stable sections' digest alone (`stable`,
    when made already)."""
    stable = stable if stable is not None else prefix_digest(sections)
    if not tools:
        return stable
    return hashlib.sha256(f"{tools_digest(tools)}:{stable}".encode()).hexdigest()


def changed_sections(
    now: tuple[tuple[int, str], ...], before: tuple[tuple[int, str], ...] | None
) -> tuple[SectionKind, ...]:
    """The cached prefix's parts (stable sections and tools) that differ from `before`:
    each is a prompt-cache bust. Volatile sections sit after the breakpoints and count
    for nothing."""
    if before is None:
        return ()
    a, b = dict(now), dict(before)
    return tuple(
        SectionKind(k)
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and k not in VOLATILE_SECTIONS
    )


def active_texts(inputs: CompileInputs, turn: ActiveTurn) -> tuple[Sequence[str], int]:
    """What the model is working on: the latest user message and every step after it;
    and the seq of that user message when its texts go before the turn's (-1: not)."""
    user = inputs.current_user
    if user is not None and (turn.start < 0 or inputs.events[turn.start].seq != user.seq):
        return (*event_texts(user), *turn.texts), user.seq
    return turn.texts, -1


def _named_paths(
    inputs: CompileInputs, turn: ActiveTurn, memo: ProjectionMemo | None, known: bool, check: Check
) -> TurnPaths:
    """The paths the active texts name. Continuing a memo of the same turn (its events
    start the log, so the turn's texts start with the ones it scanned), only the texts
    after those are scanned: a step in a long turn costs its new texts, not the turn."""
    texts, user_seq = active_texts(inputs, turn)
    old = memo.paths if memo is not None and known else None
    if (
        old is not None
        and turn.start >= 0
        and old.turn_start == turn.start
        and old.user_seq == user_seq
    ):
        union = path_union(texts, old.union, check)
        return old if union is old.union else TurnPaths(turn.start, user_seq, union)
    return TurnPaths(turn.start, user_seq, path_union(texts, None, check))


def _scan_notes(named: FoundPaths) -> tuple[str, ...]:
    if not named.capped:
        return ()
    return (f"rule globs were matched against the first {len(named.paths)} paths named",)


def _window_notes(inputs: CompileInputs) -> tuple[str, ...]:
    """A window known neither to the catalog nor from the request is budgeted by R-BUD-4's
    defaults: said in the view, since a misspelt model name ends up here too."""
    if inputs.limits.context_window > 0:
        return ()
    return (
        f"the context window of model {inputs.route.model!r} is unknown (not in the "
        "catalog, and the request's limits give none): budgeted with the unknown-window "
        "watermark and reserve",
    )


def native_state_tokens(state: NativeState | None) -> int:
    # Opaque bytes: providers bill what the state stands for, unknowable here; its size
    # at ~4 bytes a token is the conservative stand-in (R-EST-3).
    return 0 if state is None else MESSAGE_OVERHEAD + (len(state.data) + 3) // 4


def compile_view(inputs: CompileInputs, counter: TokenCounter) -> CompiledView:
    """From scratch, the history projected in one piece."""
    return compile_incremental(inputs, counter, None, remember=False)[0]


def _native(
    inputs: CompileInputs,
    turn: ActiveTurn,
    projection: Projection,
    before: SentThinking | None,
) -> tuple[SentThinking | None, int, int]:
    """The thinking state the view's provider body sends back (turn_thinking.py), and
    the tokens and items of the native state the view holds."""
    replayed = {kind for kind, since in SINCE.items() if inputs.rendering >= since}
    native = projection.native_state
    tokens = items = 0
    # Thinking state is counted where the body sends it, each turn's once (below).
    if native is not None and native.kind not in replayed:
        tokens, items = native_state_tokens(native), 1
    sent = sent_thinking(
        inputs.events,
        turn,
        inputs.route.route_id,
        projection.messages,
        inputs.rendering,
        before,
    )
    if sent is None:
        return None, tokens, items
    return sent, tokens + sent.tokens, items + len(sent.thinking)


def _history_tokens(
    projection: int, history: int, model: RouteModel | None, bounds: RatioBounds
) -> int:
    """The history layer as its watermark (a share of the input budget, in the
    provider's tokens) takes it: the local count times the route model's ratio
    (projection 11 on; before, the local count, which a conservative counter's ratio of
    0.4 made 2.5 times the provider's and recommended a compaction nothing called for)."""
    if projection < HISTORY_IN_PROVIDER_TOKENS:
        return history
    return round(ratio_of(model, bounds) * history)


def _compaction_room(
    projection: int, input_budget: int, model: RouteModel | None, bounds: RatioBounds
) -> int:
    """What a compaction prompt may hold in local tokens: it is read by the route's
    model, so it is sized in the tokens that model counts (projection 9 on; before, it
    filled the input budget in local tokens, which a ratio over 1 overflows)."""
    if projection < COMPACTION_IN_PROVIDER_TOKENS:
        return input_budget
    return prompt_room(input_budget, ratio_of(model, bounds), model.framing if model else 0.0)


def compile_incremental(
    inputs: CompileInputs,
    counter: TokenCounter,
    memo: ProjectionMemo | None,
    *,
    remember: bool = True,
    check: Check = unchecked,
    before_prompt: Callable[[PromptInputs], None] = any_prompt,
) -> tuple[CompiledView, ProjectionMemo | None, bool]:
    """The view, the memo for the next compile (when `remember`), and whether `memo` was
    verified and used; the view is the same byte for byte either way. `check` runs
    between units of work and may raise to stop the compile (work.py); so may
    `before_prompt`, called before the system prompt is made anew instead of taken from
    the memo (prompt_memo.py)."""
    counting = checked(counter, check, inputs.counting)
    # Whether the memo's events start the log: looked at once (O(events), in C).
    known = extends(memo, inputs.events)
    turn = active_turn(inputs.events, memo, known=known)
    turn_paths = _named_paths(inputs, turn, memo, known, check)
    named = turn_paths.union.found
    # Continuing a memo, the system prompt is nearly always the previous step's: the
    # memo holds it with its inputs (prompt_memo.py); from scratch it is made afresh.
    remembered = system_prompt(
        PromptInputs(
            inputs.sources,
            # Only rules matched by path read the paths: without one, a turn naming a new
            # path keeps the prompt (making it again walks every source).
            named.paths if matches_paths(inputs.sources) else (),
            inputs.kernel_text,
            inputs.approval_mode,
            inputs.environment,
            inputs.exclude_sections,
        ),
        counting,
        counter,
        memo.prompt if memo is not None else None,
        before_prompt,
    )
    prompt = remembered.prompt
    counter = counting
    built, sections = prompt.built, prompt.sections
    images = inputs.images
    if (
        inputs.projection >= 3
        and images.existing
        and request_byte_cap(inputs.route.protocol) is not None
    ):
        # What the request holds beside its messages, for the provider's limit on a whole
        # request (measured only when the view's images may meet it).
        registry = (*inputs.tools, LOAD_RULE, TOOL_SEARCH, READ_TOOL_RESULT)
        images = replaced(images, request_system_prompt=prompt.text, request_tools=registry)
    run = project_incremental(
        inputs.events,
        counter,
        checkpoint=inputs.checkpoint,
        current_user=inputs.current_user,
        route_id=inputs.route.route_id,
        # The memo holds no image, so it serves a compile of either projection.
        images=as_projected(
            images,
            inputs.events,
            inputs.current_user,
            inputs.projection,
            inputs.route.protocol,
            inputs.route.model,
        ),
        memo=memo,
        remember=remember,
        turn=turn,
        known=known,
        projection_version=inputs.projection,
    )
    projection = run.projection
    check()
    loadable = bool(built.loadable_rules) and SectionKind.RULE_INDEX not in inputs.exclude_sections
    choice = select_tools(
        inputs,
        counter,
        references_blobs=projection.references_blobs,
        loadable_rules=loadable,
        turn_start=turn.start,
    )
    tools = choice.tools
    ledger = {layer: [0, 0] for layer in Layer}
    for s in sections:
        ledger[Layer.PINNED][0] += s.tokens
        ledger[Layer.PINNED][1] += 1
    # Carried over from the memo with the messages: a step counts its new ones only.
    for layer, tokens, n in run.tally:
        ledger[layer][0] += tokens
        ledger[layer][1] += n
    for t in tools:
        ledger[Layer.TOOL_SCHEMA][0] += t.tokens
        ledger[Layer.TOOL_SCHEMA][1] += 1
    sent, native_tokens, native_items = _native(
        inputs, turn, projection, memo.thinking if memo is not None and known else None
    )
    ledger[Layer.NATIVE_STATE][0] += native_tokens
    ledger[Layer.NATIVE_STATE][1] += native_items
    layers = tuple(LayerTokens(layer, tok, n) for layer, (tok, n) in ledger.items())
    bounds = BOUNDS[inputs.counter_kind]
    model = inputs.route_model
    value, method, basis = estimate(
        layers,
        projection.messages,
        inputs.route_state,
        model,
        bounds,
        known=run.table,
        plausible_only=inputs.projection >= PLAUSIBLE_DELTAS,
    )
    pressure = max(layers, key=lambda row: (row.tokens, -int(row.layer))).layer
    last_output = inputs.route_state.last_output_tokens if inputs.route_state else None
    budget, decision = judge(
        inputs.limits,
        last_output,
        value,
        method,
        _history_tokens(inputs.projection, ledger[Layer.HISTORY][0], model, bounds),
        inputs.budget_config,
        baseline_tokens=basis.baseline_tokens,
        ledger_tokens=basis.ledger_tokens,
        dynamic_when_unknown=inputs.projection < 5,
        half_window=inputs.projection >= 7,
    )
    budget = replaced(
        budget,
        provider_overhead_tokens=value - basis.ledger_tokens,
        route=RouteParams(
            ratio=round(ratio_of(model, bounds), 6),
            overhead_tokens=round(model.overhead) if model else 0,
            delta_samples=model.delta_samples if model else 0,
            full_samples=model.full_samples if model else 0,
            counter_kind=inputs.counter_kind.value,
            framing_tokens=round(model.framing, 3) if model else 0.0,
        ),
    )
    cap, cap_source, cap_note = output_cap(
        inputs.limits,
        inputs.requested_max_output,
        budget.estimated_input_tokens,
        inputs.budget_config,
        with_margin=inputs.rendering >= renderings.PROVIDER_LIMITS,
        true_notes=inputs.rendering >= renderings.CAP_NOTES,
    )
    budget = replaced(budget, output_cap=cap, output_cap_source=cap_source)
    compaction = compaction_memo = None
    if decision is not Decision.OK:
        compaction, compaction_memo = compaction_request(
            projection.messages,
            inputs.checkpoint,
            working_set_start(projection.messages),
            inputs.event_boundary,
            _compaction_room(inputs.projection, budget.input_budget, model, bounds),
            counter,
            memo.compaction if memo is not None else None,
            images=inputs.projection >= 6,
            summary_cut=inputs.projection >= SUMMARY_CUT,
        )
    view = CompiledView(
        compile_id=inputs.compile_id,
        session_id=inputs.session.session_id,
        event_boundary=inputs.event_boundary,
        route=inputs.route,
        system_sections=sections,
        system_prompt=prompt.text,
        prefix_digest=cache_prefix_digest(sections, tools, prompt.stable_digest),
        messages=projection.messages,
        tools=tools,
        layers=layers,
        pressure_layer=pressure,
        budget=budget,
        decision=decision,
        changed_sections=changed_sections(
            section_digests(sections, tools, prompt.digests), inputs.previous_sections
        ),
        provider_state=projection.native_state,
        fallback_reasons=inputs.fallback_reasons,
        checkpoint_id=inputs.checkpoint.checkpoint_id if inputs.checkpoint else "",
        notes=built.notes
        + _scan_notes(named)
        + projection.notes
        + ((cap_note,) if cap_note else ())
        + _window_notes(inputs)
        + choice.notes,
        basis=basis,
        compaction=compaction,
        rendering=inputs.rendering,
        thinking=sent.thinking if sent is not None else (),
        tools_deferred_by_cap=choice.deferred_by_cap,
    )
    next_memo = run.memo
    # Thinking state found against messages of the memo's own list (the view's are the
    # memo's and the step's after them) holds nothing the memo does not.
    if sent is not None and not (
        isinstance(sent.messages, Grown)
        and next_memo is not None
        and sent.messages.shares(next_memo.messages)
    ):
        sent = None
    if next_memo is not None and (
        compaction_memo is not next_memo.compaction
        or remembered is not next_memo.prompt
        or turn_paths is not next_memo.paths
        or sent is not next_memo.thinking
    ):
        # None is counted in the memo's bytes: the compaction prompt and the system
        # prompt are the view's, which the views kept for repeats count, and a memo holds
        # one of each at most; the paths are capped (textscan.MAX_PATH_BYTES); the
        # thinking state is the events', and its messages the memo's.
        next_memo = replaced(
            next_memo,
            compaction=compaction_memo,
            prompt=remembered,
            paths=turn_paths,
            thinking=sent,
        )
    return view, next_memo, run.reused
