"""The TypeScript client's README gives TLS and a bearer token through `connect(target, {
credentials, metadata })`. Installed as that README says (the npm tarball, which bundles
@grpc/grpc-js), a project cannot import "@grpc/grpc-js" itself, so the client must hand out
its own copy (`grpc`, whose credentials its channel accepts) and take the token as a plain
`{ authorization: "Bearer …" }` too. Checked here with the type checker and against a real
daemon started with --auth-token-file, over TCP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.proc import REPO, DaemonProcess

TARBALL = REPO / ".tools" / "dist" / "ctxcc-client-0.1.0.tgz"
TOKEN = "correct-horse-battery-staple"
AGENT = """\
import { connect, grpc, CtxccError } from "@ctxcc/client";

const target = process.argv[2];
const token = process.argv[3];
const out: Record<string, string> = {};
async function sessionOrReason(ctx: ReturnType<typeof connect>): Promise<string> {
  try {
    return (await ctx.createSession()).sessionId === "" ? "empty" : "created";
  } catch (e) {
    return e instanceof CtxccError ? e.reason : String(e);
  } finally {
    ctx.close();
  }
}
const bearer = { authorization: `Bearer ${token}` };
out.record = await sessionOrReason(connect(target, { metadata: bearer }));
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${token}`);
out.metadata = await sessionOrReason(
  connect(target, { credentials: grpc.credentials.createInsecure(), metadata: md }),
);
out.none = await sessionOrReason(connect(target));
const wrong = { authorization: "Bearer nope-nope-nope-nope" };
out.wrong = await sessionOrReason(connect(target, { metadata: wrong }));
console.log("RESULT " + JSON.stringify(out));
"""


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "npm_config_offline": "true", "npm_config_audit": "false"}
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def project() -> Iterator[Path]:
    """A project with the client installed from its tarball, as the README's Install says."""
    assert TARBALL.exists(), "run `make clients`"
    root = Path(tempfile.mkdtemp(prefix="ctxcc-ts-creds-"))
    try:
        _run(["npm", "init", "-y"], root)
        _run(["npm", "pkg", "set", "type=module"], root)
        _run(["npm", "install", str(TARBALL)], root)
        (root / "agent.ts").write_text(AGENT)
        tsc = REPO / "client/typescript/node_modules/typescript/bin/tsc"
        types = REPO / "client/typescript/node_modules/@types"
        flags = ["--strict", "--target", "ES2022", "--module", "NodeNext"]
        flags += ["--moduleResolution", "NodeNext", "--skipLibCheck", "--typeRoots", str(types)]
        _run(["node", str(tsc), *flags, "--types", "node", "--outDir", "out", "agent.ts"], root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_token_as_a_record_or_the_clients_own_grpc_metadata(project: Path, short_tmp: Path) -> None:
    token = short_tmp / "token"
    token.write_text(TOKEN + "\n")
    d = DaemonProcess(short_tmp / "data", "--auth-token-file", str(token)).start()
    try:
        tcp = str(d.wait_ready()["tcp"])
        out = _run(["node", str(project / "out/agent.js"), tcp, TOKEN], project)
    finally:
        assert d.terminate() == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT ")) == {
        "record": "created",
        "metadata": "created",
        "none": "UNAUTHENTICATED",
        "wrong": "UNAUTHENTICATED",
    }
