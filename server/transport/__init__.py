"""gRPC transport: decode and validate, call the service, encode. The only layer that
knows protobuf and gRPC status codes."""
