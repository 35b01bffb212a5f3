"""The inspector's HTTP server (aiohttp, on the daemon's event loop) and its boundary
rules: every answer carries a strict Content-Security-Policy; a loopback-bound page
answers only loopback Host names (DNS rebinding); a browser's request made for another
site's page is refused unless it follows a link (Fetch Metadata); with an API token
configured, every page needs it (a bearer header, or the cookie the login form sets);
domain errors map to HTTP statuses through one table and never show a traceback."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

import jinja2
from aiohttp import web

from server.domain.errors import CtxccError, Reason
from server.service.inspection import InspectUseCases
from server.web import pages
from server.web.keys import HEADERS, INSPECT, TEMPLATES

log = logging.getLogger("ctxcc.web")
# Seconds a page's reader may take to read it: one that stops reading held its page
# (up to a few MB) and its handler for as long as the connection stayed open.
WRITE_TIMEOUT_S = 60.0
# Connections open at once, and the seconds one may stay without a request in progress
# (before its first, between two): aiohttp's default held a connection that never
# finished its request line for an hour, so 5,000 half-sent requests held 5,000 of the
# daemon's descriptors (those its compiles read instruction files with). A browser
# opens a few connections per origin; live pages hold one each (16 per session).
MAX_CONNECTIONS = 256
IDLE_S = 30.0
# Seconds the sign-in form's body (64 KiB at most) may take to arrive: the login page
# needs no token, and a body sent a byte at a time held its connection, a request in
# progress that IDLE_S does not end, for as long as it trickled (MAX_CONNECTIONS of them
# shut everyone out of the inspector).
FORM_READ_S = 30.0
# What a connection past MAX_CONNECTIONS gets, before any of its request is read.
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n"
    b"Retry-After: 1\r\n\r\n"
)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}
COOKIE = "ctxcc_ui"
# Set on a request whose body was given up: its connection is closed after the answer.
GIVEN_UP = web.RequestKey("given_up", bool)
# Domain reasons as HTTP statuses; anything not listed is a 400 (the request's fault).
STATUS = {
    Reason.SESSION_NOT_FOUND: 404,
    Reason.COMPILE_NOT_FOUND: 404,
    Reason.CHECKPOINT_NOT_FOUND: 404,
    Reason.ARTIFACT_NOT_FOUND: 404,
    Reason.SEQ_OUT_OF_RANGE: 404,
    Reason.UNAUTHENTICATED: 401,
    # Past a cap of the daemon's (a live page past its session's watchers): retry later.
    Reason.QUOTA_EXCEEDED: 429,
    Reason.RECORD_CORRUPT: 500,
    Reason.STORAGE_FAILURE: 503,
    Reason.SHUTTING_DOWN: 503,
    Reason.INTERNAL: 500,
}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# The names of the inspector's own files: anything else is not one (a 404, never asked
# of the file system).
STATIC_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class WebSettings:
    listen: str  # host:port
    token: str = ""  # the API's bearer token; empty: no login
    shutdown_timeout: float = 2.0


def _loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str | None:
    """The host name of a Host header (`name`, `name:port`, `[v6]`, `[v6]:port`), in
    lower case; None when it is none of those (`::1` unbracketed, `name:abc`,
    `name:80:x`, `[::1]x`, a port past 65535)."""
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        name, rest = header[1:end], header[end + 1 :]
    else:
        name, colon, port = header.partition(":")
        rest = colon + port
    if rest:
        port = rest[1:]
        if not rest.startswith(":") or not (port == "" or _port(port)):
            return None
    return name.lower()


def _host_refused(header: str) -> tuple[int, str, str] | None:
    """Why a loopback-bound page refuses this Host header (status, title, message), if
    it does. Read here, not through request.url: yarl raises on a malformed one (`::1`,
    `localhost:abc`), which made a 500 and a traceback."""
    host = _host_name(header)
    if host is None:
        return 400, "Bad request", "The Host header is not a host name and port."
    if not _loopback(host):
        return 421, "Wrong host", "This page answers only on its loopback address."
    return None


def _cross_site(request: web.Request) -> bool:
    """Whether a browser made this request for another site's page, other than by
    following a link (Fetch Metadata). Such a page cannot read the answer, but a GET made
    from it (an image, a no-cors fetch, an EventSource) still runs the page's work: a
    compile, a live watcher; and a page on the same host at another port is the same site
    to the cookie's SameSite rule, so it sends the sign-in cookie too. A link followed
    from elsewhere (a dashboard, a chat) opens the page as always; clients that are no
    browser send no such header."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is None or site in ("same-origin", "none"):
        return False
    followed = (
        request.method == "GET"
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and request.headers.get("Sec-Fetch-Dest") == "document"
    )
    return not followed


def _port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _answer(exc: web.HTTPException) -> web.Response:
    """An HTTP exception (a redirect, a 405 with its Allow header) as the response it
    stands for: aiohttp deprecates exceptions returned as responses (they are to be
    raised), and the boundary answers every request itself, with its headers."""
    return web.Response(status=exc.status, reason=exc.reason, headers=exc.headers, text=exc.text)


def _same(given: str, secret: str) -> bool:
    """Whether a header's value is `secret`, in constant time. aiohttp decodes a header's
    bytes that are not UTF-8 as lone surrogates, which a plain encode() refused (a 500
    and a traceback, before any sign-in): encoded as they came, they match no token."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), secret.encode())


def _cookie_value(token: str) -> str:
    # The cookie holds a digest, so a leaked cookie is not the API token itself.
    return hashlib.sha256(b"ctxcc-ui\x00" + token.encode()).hexdigest()


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("server.web", "templates"),
        autoescape=True,  # every template, whatever its name: escaping is the rule here
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    pages.install_filters(env)
    return env


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    kinds = {".css": "text/css", ".js": "text/javascript"}
    kind = next((v for k, v in kinds.items() if name.endswith(k)), None)
    files = resources.files("server.web") / "static"
    if kind is None or not STATIC_NAME.fullmatch(name) or name.startswith("."):
        raise web.HTTPNotFound()
    try:
        body = (files / name).read_bytes()
    except (OSError, ValueError):  # not there, a directory, a name the system refuses
        raise web.HTTPNotFound() from None
    return web.Response(body=body, content_type=kind, charset="utf-8")


async def _form_token(request: web.Request) -> str:
    """The token a sign-in form sent. A body the form never sends (multipart without its
    boundary or cut short, an unknown charset, a compression that is none) or a sender
    gone while it sent is the sender's fault: a 400, not an incident with a traceback. A
    body that has not arrived within FORM_READ_S is a 408. Either way its connection is
    closed once answered (_finish), nothing more of it read."""
    try:
        async with asyncio.timeout(FORM_READ_S):
            form = await request.post()
    except TimeoutError:
        request[GIVEN_UP] = True
        raise web.HTTPRequestTimeout(text="The sign-in form did not arrive in time.") from None
    except (ValueError, LookupError, web.RequestPayloadError, ConnectionError):
        request[GIVEN_UP] = True
        raise web.HTTPBadRequest(text="The sign-in form could not be read.") from None
    return str(form.get("token", ""))


async def _finish(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    if response.prepared:
        return response  # a stream (/live): it writes as it goes, to a bounded queue
    response.headers.update(SECURITY_HEADERS)
    if isinstance(response, web.Response):
        await _send(request, response)
    if request.get(GIVEN_UP) or not request.content.is_eof():
        # A body given up (too slow, or unreadable) or never read (a GET's, which a
        # browser never sends): the connection is closed once the answer is written,
        # rather than read on (aiohttp reads an unread body for up to 10 s more, and
        # logged a traceback each time such a body could not be decoded).
        request.protocol.force_close()
    return response


async def _send(request: web.Request, response: web.Response) -> None:
    """Write the page within WRITE_TIMEOUT_S, or close the connection (aiohttp's own
    write of a response sent here is a no-op; after a close it meets a ConnectionError,
    which aiohttp takes for a reader gone)."""
    try:
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        log.warning(
            "inspector: a page was not read within %.0f s; its connection is closed",
            WRITE_TIMEOUT_S,
        )
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        pass  # the reader went away: aiohttp's write of it meets the same


def build_app(inspect: InspectUseCases, settings: WebSettings) -> web.Application:
    loopback_only = _loopback(settings.listen.rpartition(":")[0].strip("[]"))
    env = environment()
    cookie = _cookie_value(settings.token) if settings.token else ""

    def render_error(status: int, title: str, message: str) -> web.Response:
        html = env.get_template("error.html").render(title=title, message=message, status=status)
        return web.Response(status=status, text=html, content_type="text/html", charset="utf-8")

    def authorized(request: web.Request) -> bool:
        if not settings.token:
            return True
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and _same(header[7:], settings.token):
            return True
        return _same(request.cookies.get(COOKIE, ""), cookie)

    @web.middleware
    async def boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            refused = _host_refused(request.host) if loopback_only else None
            if refused is not None:
                response: web.StreamResponse = render_error(*refused)
            elif _cross_site(request):
                response = render_error(
                    403,
                    "Cross-site request",
                    "This page answers another site's page only as a link followed.",
                )
            elif (
                request.path not in ("/login",)
                and not request.path.startswith("/static/")
                and (not authorized(request))
            ):
                response = _answer(web.HTTPSeeOther("/login"))
            else:
                response = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.status != 405:
                response = render_error(exc.status, exc.reason, exc.text or exc.reason)
            else:
                response = _answer(exc)
        except CtxccError as exc:
            response = render_error(STATUS.get(exc.reason, 400), exc.reason.value, exc.message)
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("inspector page failed (incident %s)", incident)
            response = render_error(500, "Internal error", f"incident {incident}")
        return await _finish(request, response)

    async def login_page(request: web.Request) -> web.StreamResponse:
        failed = False
        if request.method == "POST":
            given = await _form_token(request)
            if settings.token and _same(given, settings.token):
                response = _answer(web.HTTPSeeOther("/"))
                response.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", path="/")
                return response
            failed = True
        html = env.get_template("login.html").render(failed=failed, needed=bool(settings.token))
        return web.Response(
            status=401 if failed else 200, text=html, content_type="text/html", charset="utf-8"
        )

    app = web.Application(middlewares=[boundary], client_max_size=64 << 10)
    app[INSPECT] = inspect
    app[TEMPLATES] = env
    app[HEADERS] = SECURITY_HEADERS
    app.router.add_get("/static/{name}", _static)
    app.router.add_route("GET", "/login", login_page)
    app.router.add_route("POST", "/login", login_page)
    pages.add_routes(app)
    return app


class WebServer:
    def __init__(
        self, runner: web.AppRunner, listener: asyncio.AbstractServer, address: str
    ) -> None:
        self._runner = runner
        self._listener = listener
        self.address = address

    async def stop(self) -> None:
        self._listener.close()  # no new connections; the runner ends the open ones
        await self._runner.cleanup()
        await self._listener.wait_closed()


class _Turned(asyncio.Protocol):
    """A connection past MAX_CONNECTIONS: told so and closed, nothing of it read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY)
        transport.close()


class _Admission(asyncio.Protocol):
    """A connection, taken by aiohttp or turned away when it is made: asyncio makes the
    protocols of all the connections one wake-up accepts (up to 100) before it makes any
    of those connections, so counting aiohttp's connections when the protocol was made
    let a burst of 600 connects leave 301 open past a cap of 256."""

    def __init__(self, server: web.Server, most: int) -> None:
        self._server, self._most = server, most

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self._server.connections) >= self._most:
            _Turned().connection_made(transport)
            return
        # aiohttp counts it among its connections here, before the next one is made.
        handler = self._server()
        transport.set_protocol(handler)
        handler.connection_made(transport)


def _capped(server: web.Server, most: int) -> Callable[[], asyncio.BaseProtocol]:
    """aiohttp's protocol factory, turning connections away past `most` open ones."""

    def make() -> asyncio.BaseProtocol:
        return _Admission(server, most)

    return make


async def start_web(inspect: InspectUseCases, settings: WebSettings) -> WebServer:
    host, _, port = settings.listen.rpartition(":")
    host = host.strip("[]")
    runner = web.AppRunner(
        build_app(inspect, settings),
        access_log=None,  # URLs carry session ids; the daemon's logs carry no client data
        shutdown_timeout=settings.shutdown_timeout,
        keepalive_timeout=IDLE_S,
    )
    await runner.setup()
    assert runner.server is not None
    try:
        # Listened on here rather than through aiohttp's TCPSite, whose factory cannot be
        # wrapped: the cap on connections needs to see each one come.
        listener = await asyncio.get_running_loop().create_server(
            _capped(runner.server, MAX_CONNECTIONS), host, int(port), reuse_port=False
        )
    except OSError:
        await runner.cleanup()
        raise
    bound = listener.sockets[0].getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    return WebServer(runner, listener, f"{shown}:{bound[1]}")
