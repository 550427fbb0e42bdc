"""Node membership: a node whose heartbeats stop is pinged before it is declared lost, so an
agent starved of CPU (hundreds of actors on a saturated host) keeps its actors, while a
node that is really gone is lost with the ping's failure in the reason."""

from __future__ import annotations

import asyncio
import time

import pytest

from actorrl.runtime import Driver, Runtime
from actorrl.runtime.cluster.coordinator import Coordinator
from tests.helpers.waiting import wait_until


async def test_heartbeat_silence_is_decided_by_one_ping(tmp_path) -> None:
    """Two nodes silent past the heartbeat timeout: the one whose control endpoint answers
    a ping stays a member (the answer counts as a heartbeat), the one nobody answers for
    is lost, its reason naming both the silence and the failed ping."""
    async with Driver.start(str(tmp_path / "coordinator")) as driver:
        coordinator = Coordinator(driver.runtime, heartbeat_s=0.2, heartbeat_timeout_s=1.0)
        (tmp_path / "starved").mkdir()
        starved_agent = Runtime.start(str(tmp_path / "starved"), "starved-agent")
        try:
            starved = coordinator.membership.register(
                "n1", "starved", starved_agent.address, "127.0.0.1", 1, 0)
            gone = coordinator.membership.register(
                "n2", "gone", f"ipc://{tmp_path}/nobody-listens.sock", "127.0.0.1", 1, 0)
            lost: list[tuple[str, str]] = []
            coordinator.on_node_lost.append(lambda node, why: lost.append((node.name, why)))
            silent_since = time.monotonic() - 5.0
            starved.last_heartbeat = gone.last_heartbeat = silent_since
            coordinator.membership.check_heartbeats(time.monotonic(), stall=0.0)
            await wait_until(lambda: lost and not starved.probing, 10, "the pings' answers")
            assert [name for name, _ in lost] == ["gone"]
            assert "no heartbeat for" in lost[0][1] and "ping failed" in lost[0][1], lost
            # nothing listens there: refused at once, not after the 1.5 s connect timeout
            assert "refused the connection" in lost[0][1], lost
            assert set(coordinator.nodes) == {"n1"}
            assert starved.last_heartbeat > silent_since
        finally:
            starved_agent.close()


async def test_a_probe_connection_fails_at_once_when_refused_and_a_plain_one_waits() -> None:
    """``refused_is_lost`` (what membership probes use): a tcp port nobody listens on fails
    the call with "refused" long before the connect timeout; a plain connection to the
    same port keeps retrying, and reaches a server that starts listening there later."""
    import socket

    from transport.errors import PeerLostError
    from transport.rpc import RpcClient, RpcServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    prober = RpcClient(endpoint, connect_timeout_s=60, refused_is_lost=True)
    patient = RpcClient(endpoint, connect_timeout_s=60)
    try:
        # Decided by the refusal: a timeout would raise CallTimeoutError, not this.
        with pytest.raises(PeerLostError, match="refused the connection"):
            await prober.call("ping", timeout_s=30)
        server = RpcServer(lambda request: request.reply("pong"))
        reply = asyncio.ensure_future(patient.call("ping", timeout_s=30))
        server.bind(endpoint)
        server.start()
        try:
            assert await reply == "pong"
        finally:
            server.close()
    finally:
        prober.close()
        patient.close()


async def test_a_node_registering_again_replaces_its_old_registration(tmp_path) -> None:
    """A node agent back from a 3-5 s partition registers again (a new node id) before the
    coordinator lost its old registration: the new one replaces the old (lost, its actors
    dead, the reason saying why) under the same name; before, both stayed members, the old
    one a ghost whose endpoint still answered pings."""
    async with Driver.start(str(tmp_path / "coordinator")) as driver:
        coordinator = Coordinator(driver.runtime, heartbeat_s=0.2, heartbeat_timeout_s=1.0)
        (tmp_path / "agent").mkdir()
        agent = Runtime.start(str(tmp_path / "agent"), "agent")
        try:
            lost: list[tuple[str, str]] = []
            coordinator.on_node_lost.append(lambda node, why: lost.append((node.name, why)))
            first = coordinator.membership.register("n1", "f", agent.address, "127.0.0.1",
                                                    2, 0)
            again = coordinator.membership.register("n2", "f", agent.address, "127.0.0.1",
                                                    2, 0)
            assert set(coordinator.nodes) == {"n2"}
            assert again.name == "f" and not first.alive
            assert [name for name, _ in lost] == ["f"] and "registered again" in lost[0][1]
            # The same id registering again (a retried call) is the same member.
            assert coordinator.membership.register("n2", "f", agent.address, "127.0.0.1",
                                                   2, 0) is again
            assert set(coordinator.nodes) == {"n2"} and len(lost) == 1
        finally:
            agent.close()
