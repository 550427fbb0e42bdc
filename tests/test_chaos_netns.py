"""``benchmarks/chaos.py`` with its node agents in network namespaces (``--network netns``):
each node agent, and every actor it starts, runs in a namespace of its own joined to the
coordinator's by a veth pair, advertises that namespace's address, and a partition is a
real link cut (the node's veth down for a few seconds, then up).

Needs root and iproute2's ``ip`` (making namespaces and links). Without them, or where
``ip netns add`` fails (a container without CAP_SYS_ADMIN / CAP_NET_ADMIN), these tests
are skipped, saying why; they are not failed under ``ACTORRL_CI=1`` either, since whether
a CI container may make namespaces is the container's setting, not something CI installs.
``tests/test_chaos.py`` runs the loopback version everywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import Any

import pytest

from tests.test_chaos import _chaos

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("chaos")]


def _require_netns() -> None:
    """Skip, saying why, unless this process can make a network namespace."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (the benchmark makes namespaces, veths "
                    "and a bridge); run as root, e.g. in a container")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (apt-get install iproute2)")
    probe = f"arlchaos-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=30)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` fails here ({made.stderr.strip()}): this container "
                    "may not make network namespaces")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)


def _ours(listing: list[str]) -> set[str]:
    """The benchmark's namespaces or links (by name prefix) among ``listing``."""
    return {name for name in listing if name.startswith(("arlchaos-", "arlc"))}


def _namespaces_and_links() -> set[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                timeout=30).stdout.split("\n")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           timeout=30).stdout.splitlines()
    return _ours([line.split(" ")[0] for line in namespaces if line.strip()]
                 + [line.split(":")[1].strip().split("@")[0] for line in links
                    if line.count(":") >= 2])


@pytest.mark.timeout(150)
def test_a_job_survives_a_node_cut_off_by_its_link_in_a_namespace():
    """Three node agents in namespaces; the job's actors are reached at their node's
    namespace address (not 127.0.0.1); at the third result one node's link is cut for 6 s
    (twice the coordinator's heartbeat timeout, so the node is lost and its actors are
    replaced or the job rolls back) and restored. The job must finish, its result stream
    must hold the invariants, and nothing may be left: no process, session folder,
    shared-memory segment, namespace, veth or bridge."""
    _require_netns()
    chaos = _chaos()
    before = _namespaces_and_links()
    out = chaos.main(["--network", "netns", "--jobs", "apex", "--no-undisturbed",
                      "--faults-at", "3:partition", "--partition-s", "6",
                      "--set", "apex.stop.episode_reward_mean=1000",
                      "--set", "apex.stop.training_iteration=10",
                      "--set", "apex.job.checkpoint_interval_s=0"])
    assert out["network"] == "netns", out
    hosts = out["node_hosts"]
    assert sorted(hosts) == ["n1", "n2", "n3"], out
    assert len(set(hosts.values())) == 3 and not any(
        h.startswith("127.") for h in hosts.values()), hosts
    [job] = out["jobs"]
    run = job["faults"]
    # Every actor advertises the address of its node's namespace.
    assert run["actor_hosts"], run
    for where, host in run["actor_hosts"].items():
        assert host == hosts[where.rsplit("@", 1)[1]], run["actor_hosts"]
    [fault] = run["faults"]
    assert fault["kind"] == "partition" and fault["how"] == "link down", fault
    assert fault["actors"] >= 1, fault  # the node cut off hosted some of the job
    assert run["state"] == "finished", run
    # The cut node was lost: its actors were replaced, or the job rolled back.
    assert run["job_failures"] >= 1 or run["num_worker_restarts"] >= 1, run
    assert run["invariant_problems"] == [], run
    assert out["processes_left"] == [] and out["session_folders_left"] == [], out
    assert out["shm_segments_left"] == [], out
    assert out["namespaces_left"] == [] and out["links_left"] == [], out
    assert _namespaces_and_links() == before


@pytest.mark.timeout(120)
def test_ctrl_c_still_removes_the_cluster_and_its_namespaces(monkeypatch: Any):
    """A Ctrl-C once the cluster runs in its namespaces (here: as the first job starts)
    ends the benchmark with KeyboardInterrupt after it stopped every process and removed
    every namespace, veth and the bridge."""
    _require_netns()
    chaos = _chaos()
    before = _namespaces_and_links()
    made: list[Any] = []
    real_start = chaos.ChaosCluster.start

    def start(self: Any) -> None:
        made.append(self)
        real_start(self)

    def interrupted(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(chaos.ChaosCluster, "start", start)
    monkeypatch.setattr(chaos, "run_job", interrupted)
    with pytest.raises(KeyboardInterrupt):
        chaos.main(["--network", "netns", "--jobs", "apex", "--nodes", "2"])
    [cluster] = made
    assert cluster.network is not None and len(cluster.network.made_namespaces) == 2
    assert cluster.network.namespaces_left() == [] and cluster.network.links_left() == []
    assert _namespaces_and_links() == before
    assert chaos.marked_processes(str(cluster.root), deadline_s=0) == []
    assert not any(os.path.exists(s) for s in cluster.sessions)
