"""ctxcc daemon: the context compiler sidecar."""

__version__ = "0.1.0"
