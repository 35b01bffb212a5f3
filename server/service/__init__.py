"""Use cases: load what a step needs, call the pure compiler, record and publish."""
