"""The context compiler core: pure functions from frozen inputs to a CompiledView.

No I/O lives here (checked by the import-linter contracts in pyproject.toml): no
gRPC, protobuf, storage, files, clock, environment or randomness. Same inputs give
a byte-identical view and digest.
"""
