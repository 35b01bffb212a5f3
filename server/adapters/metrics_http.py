"""The /metrics HTTP server: prometheus_client's WSGI app on a threading server that
holds a bounded number of connections, each for a bounded time.

prometheus_client's own server (`start_http_server`) takes every connection and waits
for its request for as long as the peer likes, a thread and a file descriptor each: on
the port a Kubernetes pod exposes to its cluster (0.0.0.0:9464), 3,000 connections that
sent half a request held 3,000 of the daemon's descriptors, and once they were all taken
compiles left instruction files out of their views ("Too many open files")."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

# A scrape is one short request on a connection of its own (wsgiref answers one request
# a connection); Prometheus scrapes a target with one at a time.
MAX_CONNECTIONS = 64
# A connection that has not sent its request (or taken the answer) by then is closed.
IDLE_TIMEOUT_S = 10.0


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (as prometheus_client's own server)."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's default backlog (5) left a burst of connections in SYN retries, a
    # second or more each, before the ones past the cap could even be turned away.
    request_queue_size = 128

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        # The family of the address given (an IPv6 host listens on IPv6).
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), _Handler)
        self.set_app(make_wsgi_app(registry))
        self._lock = threading.Lock()
        self._open: set[int] = set()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Past MAX_CONNECTIONS a new connection is closed at once."""
        with self._lock:
            if len(self._open) >= MAX_CONNECTIONS:
                return False
            self._open.add(id(request))
            return True

    def shutdown_request(self, request: Any) -> None:
        try:
            super().shutdown_request(request)
        finally:
            with self._lock:
                self._open.discard(id(request))


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> MetricsServer:
    """A MetricsServer on `host`:`port`, serving from a daemon thread."""
    server = MetricsServer(host, port, registry)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
