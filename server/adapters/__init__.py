"""Adapters to the outside: tokenizers, workspace files, Prometheus, clock and ids."""
