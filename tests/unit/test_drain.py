"""The shutdown drain's answer to "did every admitted call finish in time?"."""

from __future__ import annotations

from server.transport.drain import Drain


async def test_an_idle_daemon_is_idle_even_with_no_grace() -> None:
    # With --grace-period 0 the deadline has passed at once: an idle daemon must still
    # say idle (it logged "calls still running" on every such shutdown).
    assert await Drain().wait_idle(0) is True


async def test_a_running_call_past_the_grace_is_reported() -> None:
    drain = Drain()
    ticket = drain.admit(counted=True)
    assert ticket is not None
    with ticket.running():
        assert await drain.wait_idle(0.05) is False
    assert await drain.wait_idle(0) is True
