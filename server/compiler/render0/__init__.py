"""The provider renderers as they were at rendering version 0, frozen.

A compile records the rendering version it rendered with (render.RENDERING, in its
basis), and exact time travel (`rebuild_compile_id`, `as_of_seq` at a recorded step)
renders a recorded compile's bodies as it did: byte for byte what the agent was given,
including what version 1 fixed (bodies an API refused: empty text blocks and tool
results, call names no API takes, image types a provider refuses, long Chat call ids;
see tests/conformance/test_sdk_roundtrip.py). Never change these modules: a change to the
bodies is a new version in render_*.py.
"""
