"""The web inspector: a read-only HTML transport beside gRPC over the same use cases."""
