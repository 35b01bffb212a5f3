"""What the composition root (server/app.py) reads from and sets up on the host before
it wires anything: the files settings name (auth token, kernel), the data directory's
permissions, the addresses and socket the gRPC server binds (TLS included), and the
names of the services and RPCs it serves.

Kept apart from app.py so that app.py stays the wiring: here are functions of the
configuration alone, which build no use case, servicer or store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from pathlib import Path

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2

from ctxcc.v1 import (
    artifact_service_pb2,
    compile_service_pb2,
    session_service_pb2,
    source_service_pb2,
    tool_service_pb2,
)
from server.adapters.tls import TlsFileError, load_tls
from server.compiler.system import DEFAULT_KERNEL
from server.config import Config, ConfigError
from server.transport.interceptor import method_label

log = logging.getLogger("ctxcc")

SERVICE_NAMES = tuple(
    f.services_by_name[name].full_name
    for f, name in (
        (session_service_pb2.DESCRIPTOR, "SessionService"),
        (compile_service_pb2.DESCRIPTOR, "CompileService"),
        (artifact_service_pb2.DESCRIPTOR, "ArtifactService"),
        (source_service_pb2.DESCRIPTOR, "SourceService"),
        (tool_service_pb2.DESCRIPTOR, "ToolService"),
    )
)


def rpc_methods() -> list[str]:
    """Metric names of every RPC the server answers: the API services and health."""
    pool = descriptor_pool.Default()
    services = (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
    return [
        method_label(f"/{service}/{method.name}")
        for service in services
        for method in pool.FindServiceByName(service).methods
    ]


ECHO_METHOD = "/ctxcc.debug.Echo/Echo"


def echo_handler() -> grpc.GenericRpcHandler:
    """A transport baseline for benchmarks: the request is a decimal size, the answer
    that many bytes. Off unless --debug-echo true; never part of the contract."""

    async def echo(request: bytes, context: object) -> bytes:
        return b"x" * min(int(request or b"0"), 64 << 20)

    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler("ctxcc.debug.Echo", {"Echo": handler})


def auth_token(cfg: Config) -> str:
    if not cfg.auth_token_file:
        return ""
    try:
        token = Path(cfg.auth_token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read auth_token_file: {exc}") from exc
    if len(token) < 16:
        raise ConfigError(
            f"auth_token_file {cfg.auth_token_file} holds {len(token)} characters"
            " (surrounding whitespace aside): a token must have at least 16"
        )
    # gRPC sends a header value only as printable ASCII (its clients refuse anything
    # else): a token of other characters would start a daemon no TCP client can call.
    if not all(" " <= c <= "~" for c in token):
        raise ConfigError(
            f"auth_token_file {cfg.auth_token_file} holds characters other than printable"
            " ASCII: gRPC clients cannot send them in the authorization header"
        )
    return token


def kernel_text(cfg: Config) -> str:
    if not cfg.kernel_file:
        return DEFAULT_KERNEL
    try:
        return Path(cfg.kernel_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read kernel_file {cfg.kernel_file}: {exc}") from exc


def add_port(
    server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials | None, setting: str
) -> int:
    """Binds one TCP address; a busy or unusable one is a configuration error naming the
    setting (exit 2), like a busy metrics or inspector port. gRPC reports the failure
    either as port 0 or, in newer releases, as a RuntimeError."""
    try:
        if creds is not None:
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0  # its text only says to turn on gRPC's debug log; gRPC logged the cause
    if port == 0:
        raise ConfigError(f"cannot serve gRPC on {address} ({setting}): address in use or invalid")
    return port


def gid(group: str) -> int:
    if group.isascii() and group.isdigit():
        return int(group)  # at most MAX_GID: config.resolve checked it
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"socket_group {group!r} does not exist") from None


def prepare_dirs(cfg: Config) -> None:
    """The data directory made (private), the directories sources come from checked."""
    private_data_dir(cfg)
    check_disk_reserve(cfg)
    warn_missing_dirs(cfg)


def _space(path: Path) -> tuple[int, int]:
    """(free, capacity) in bytes of the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def check_disk_reserve(cfg: Config) -> None:
    """Writes are taken once the reserve is in place with as much again free: a reserve
    over half the filesystem never is, and the daemon would stay read-only for good."""
    _, capacity = _space(cfg.data_dir)
    if 2 * cfg.disk_reserve_bytes > capacity:
        raise ConfigError(
            f"disk_reserve_bytes {cfg.disk_reserve_bytes} is over half of the data directory's"
            f" filesystem ({capacity} bytes): writes need the reserve held and as much again"
            " free, so none would ever be taken"
        )


def new_store_on_full_disk(cfg: Config) -> str:
    free, _ = _space(cfg.data_dir)
    return (
        f"cannot create a new store in {cfg.db_path}: the disk is too full to write"
        f" ({free} bytes free; writes need disk_reserve_bytes {cfg.disk_reserve_bytes}"
        " held back and as much again free)"
    )


def private_data_dir(cfg: Config) -> None:
    """The data directory holds every conversation: only the daemon's user may enter
    it. With a socket group and the socket inside, that group may pass through (not
    list) to reach the socket. RocksDB's own directory is always 0700."""
    try:
        cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(data_dir_error(cfg, exc)) from None
    if os.statvfs(cfg.data_dir).f_flag & os.ST_RDONLY:
        # Every request writes (the log, compile records, usage): nothing could be served.
        raise ConfigError(f"cannot use data_dir {cfg.data_dir}: it is on a read-only filesystem")
    sock = cfg.socket_path
    mode = 0o700
    try:
        if cfg.socket_group and sock is not None and sock.parent == cfg.data_dir:
            os.chown(cfg.data_dir, -1, gid(cfg.socket_group))
            mode = 0o710
        os.chmod(cfg.data_dir, mode)
    except PermissionError as exc:
        # A mount point owned by someone else (a Kubernetes volume): its owner decides.
        log.warning("cannot restrict the data directory %s: %s", cfg.data_dir, exc)
    except OSError as exc:
        raise ConfigError(data_dir_error(cfg, exc)) from None


def warn_missing_dirs(cfg: Config) -> None:
    """The workspace roots and the global directory are read at every compile, so one
    made later is used then; but a mistyped one only ever showed as instructions, rules
    and memory that never appear, or every project refused with PATH_OUTSIDE_ROOT."""
    named = [("workspace_roots", root) for root in cfg.workspace_roots]
    if cfg.global_dir is not None:
        named.append(("global_dir", cfg.global_dir))
    for setting, path in named:
        if not path.is_dir():
            log.warning("%s %s is not a directory (yet): nothing is read from it", setting, path)


def data_dir_error(cfg: Config, exc: OSError) -> str:
    """A data directory the daemon cannot make or use is a setting to fix (exit 2)."""
    # mkdir(exist_ok=True) says "File exists" only when what exists is not a directory.
    why = f"{exc.filename} is not a directory" if isinstance(exc, FileExistsError) else str(exc)
    return f"cannot use data_dir {cfg.data_dir}: {why}"


def bind_tcp(server: grpc.aio.Server, cfg: Config) -> str | None:
    if cfg.listen == "none":
        return None
    host, _, _ = cfg.listen.rpartition(":")
    port = add_port(server, cfg.listen, tls(cfg), "listen")
    return f"{host}:{port}"


def tls(cfg: Config) -> grpc.ServerCredentials | None:
    if not cfg.tls_cert_file:
        return None
    try:
        cert, key, ca = load_tls(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
    except TlsFileError as exc:
        raise ConfigError(str(exc)) from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _answers(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at `path`: a stale file
    refuses them. Anything else (no permission to connect, a full backlog) counts as in
    use: the file is not ours to remove."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def bind_unix(server: grpc.aio.Server, cfg: Config) -> str | None:
    path = cfg.socket_path
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot bind Unix socket {path} (socket): {exc}") from None
    # A socket file left here by a daemon that is gone is stale; but the socket may lie
    # outside the data directory whose lock we hold (the image's /run/ctxcc), where another
    # daemon may be serving on it: that one is not taken over.
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            if _answers(path):
                raise ConfigError(
                    f"cannot bind Unix socket {path} (socket): another process is serving "
                    "on it; stop it, or give this daemon another --socket"
                )
            path.unlink()
    old = os.umask(0o117)  # the socket is born 0660, never briefly world-accessible
    try:
        try:
            bound = server.add_insecure_port(f"unix:{path}")
        except RuntimeError:
            bound = 0  # as in add_port
        if bound == 0:
            raise ConfigError(f"cannot bind Unix socket {path} (socket)")
    finally:
        os.umask(old)
    return str(path)
