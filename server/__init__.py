"""ctxcc daemon: the context compiler sidecar."""
