"""Creates one session and prints it, or the error it got: how a CreateSession waits out a
daemon that is restarting (see "Retries" in the README).

    CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock python create_session.py \\
      --session '{"project_id": "p1", "labels": {"team": "infra"}}' --retry-seconds 30

Prints `created {json}` (the session's id and creation fields) or `error CODE REASON` and
exits 1."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ctxcc_client import Client, CtxccError
from ctxcc_client.retry import RETRY_SECONDS
from google.protobuf import json_format

from ctxcc.v1 import session_pb2


def main(target: str, fields: str, retry_seconds: float) -> int:
    asked = json_format.Parse(fields, session_pb2.Session())
    with Client(target, retry_seconds=retry_seconds) as ctx:
        try:
            s = ctx.create_session(
                asked.session_id,
                workspace_id=asked.workspace_id,
                project_id=asked.project_id,
                labels=dict(asked.labels),
                project_root=asked.project_root,
                working_directory=asked.working_directory,
            )
        except CtxccError as err:
            print(f"error {err.code.name} {err.reason}", flush=True)
            return 1
    out = {
        "session_id": s.session_id,
        "workspace_id": s.workspace_id,
        "project_id": s.project_id,
        "labels": dict(s.labels),
        "project_root": s.project_root,
        "working_directory": s.working_directory,
    }
    print("created " + json.dumps(out, sort_keys=True, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--session", default="{}")
    parser.add_argument("--retry-seconds", type=float, default=RETRY_SECONDS)
    args = parser.parse_args()
    target = os.environ.get("CTXCC_TARGET", "127.0.0.1:50551")
    sys.exit(main(target, args.session, args.retry_seconds))
