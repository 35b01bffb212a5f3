"""The daemon's encoding of a view's fields 1-5 and 12-18 from records cached per value
(convert_view.front_bytes, back_fields_bytes) against protobuf's own encoding of the same
fields, over views whose ids, boundary, route, layers, pressure layer, budget, decision,
fallback reasons, checkpoint and provider state vary from one encoding to the next (as
from step to step): a record kept for another value, or put at another place, fails."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.view import (
    Decision,
    EstimateMethod,
    FallbackReason,
    Layer,
    LayerTokens,
    OutputCapSource,
    RouteParams,
)
from server.domain.model import NativeState, Route
from server.transport.convert_view import (
    back_fields_bytes,
    front_bytes,
    head_back_fields,
    head_front,
)
from tests.unit.test_lent import VIEW

_COUNTS = st.integers(0, 2**32 - 1)
_LAYERS = st.lists(st.builds(LayerTokens, st.sampled_from(Layer), _COUNTS, _COUNTS), max_size=5)
_ROUTE = st.none() | st.builds(
    RouteParams,
    ratio=st.floats(allow_nan=False),
    overhead_tokens=st.integers(-(2**40), 2**40),
    delta_samples=_COUNTS,
    full_samples=_COUNTS,
    counter_kind=st.sampled_from(["", "exact", "é"]),
    framing_tokens=st.floats(allow_nan=False),
)
_STATE = st.none() | st.builds(NativeState, st.text(max_size=3), st.text(max_size=3), st.binary())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            _LAYERS,
            st.sampled_from(Layer),
            st.tuples(_COUNTS, st.floats(allow_nan=False), st.sampled_from(EstimateMethod)),
            _ROUTE,
            st.sampled_from(OutputCapSource) | st.none(),
            st.sampled_from(Decision),
            st.lists(st.sampled_from(FallbackReason), max_size=3).map(tuple),
            st.sampled_from(["", "ck1", "ck2"]),
            _STATE,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_fields_after_the_tools_encode_as_protobuf_encodes_them(steps: list[Any]) -> None:
    for layers, pressure, (tokens, util, method), route, cap, decision, reasons, ck, state in steps:
        budget = replace(
            VIEW.budget,
            estimated_input_tokens=tokens,
            utilization=util,
            estimate_method=method,
            route=route,
            output_cap_source=cap,
        )
        view = replace(
            VIEW,
            layers=tuple(layers),
            pressure_layer=pressure,
            budget=budget,
            decision=decision,
            fallback_reasons=reasons,
            checkpoint_id=ck,
            provider_state=state,
        )
        assert back_fields_bytes(view) == head_back_fields(view).SerializeToString(
            deterministic=True
        )


_TEXT = st.sampled_from(["", "a", "é", "c-1"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_TEXT, _TEXT, st.integers(0, 2**64 - 1), st.builds(Route, _TEXT, _TEXT, _TEXT)),
        min_size=1,
        max_size=6,
    )
)
def test_the_fields_before_the_sections_encode_as_protobuf_encodes_them(steps: list[Any]) -> None:
    """The ids and boundary of each view, and its route's fields encoded once per route."""
    for compile_id, session_id, boundary, route in steps:
        view = replace(
            VIEW,
            compile_id=compile_id,
            session_id=session_id,
            event_boundary=boundary,
            route=route,
        )
        assert front_bytes(view) == head_front(view).SerializeToString(deterministic=True)
