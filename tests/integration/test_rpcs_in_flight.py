"""`ctxcc_rpcs_in_flight` counts calls in their handler, by method, from a real scrape: an
upload the client holds open counts 1 while a short call next to it counts nothing, and
both read 0 once they are answered."""

from __future__ import annotations

import asyncio
import hashlib
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import stubs_for

UPLOAD = "ArtifactService/UploadArtifact"
GET = "SessionService/GetSession"


def _in_flight(metrics: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "ctxcc_rpcs_in_flight":
            return {s.labels["method"]: s.value for s in family.samples}
    raise AssertionError("ctxcc_rpcs_in_flight is not exported")


async def _until(metrics: str, method: str, value: float) -> dict[str, float]:
    for _ in range(400):
        seen = await asyncio.to_thread(_in_flight, metrics)
        if seen.get(method) == value:
            return seen
        await asyncio.sleep(0.025)
    raise AssertionError(f"{method} never reached {value} in flight: {seen.get(method)}")


async def test_a_held_upload_counts_in_flight_until_it_ends(daemon: Daemon) -> None:
    metrics = str(daemon.endpoints.metrics)
    before = await asyncio.to_thread(_in_flight, metrics)
    # Every method's series exists from the start, at 0.
    assert before[UPLOAD] == 0 and before[GET] == 0
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
        )
        blob = b"x" * 100_000
        call = api.artifacts.UploadArtifact()
        head = apb.ArtifactHeader(
            session_id="s",
            mime_type="image/png",
            size_bytes=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
        )
        await call.write(apb.UploadArtifactRequest(header=head))
        await call.write(apb.UploadArtifactRequest(data=blob[:50_000]))
        held = await _until(metrics, UPLOAD, 1)
        await api.sessions.GetSession(spb.GetSessionRequest(session_id="s"))
        assert (await asyncio.to_thread(_in_flight, metrics))[GET] == 0
        assert held[GET] == 0
        await call.write(apb.UploadArtifactRequest(data=blob[50_000:]))
        await call.done_writing()
        assert (await call).artifact.size_bytes == len(blob)
        await _until(metrics, UPLOAD, 0)
    finally:
        await api.channel.close()
