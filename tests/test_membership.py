"""Node membership: a node whose heartbeats stop is pinged before it is declared lost, so an
agent starved of CPU (hundreds of actors on a saturated host) keeps its actors, while a
node that is really gone is lost with the ping's failure in the reason."""

from __future__ import annotations

import time

from actorrl.runtime import Driver, Runtime
from actorrl.runtime.coordinator import Coordinator
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
            assert set(coordinator.nodes) == {"n1"}
            assert starved.last_heartbeat > silent_since
        finally:
            starved_agent.close()
