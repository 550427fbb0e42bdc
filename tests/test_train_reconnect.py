"""``actorrl train --address`` while its job's coordinator is away: a real coordinator
(CURVE keys, tcp on loopback) and node, the coordinator SIGKILLed while the command
follows the job. The command says so in one line (what happened, how long it waits, how
to stop waiting) and in one more when the coordinator, restarted on the same address and
state directory, is back; Ctrl-C during the wait ends it at once.

Before, the command printed nothing while :meth:`Job.results
<actorrl.cluster.client.Job.results>` waited up to 120 s for the coordinator (it looked
hung), and a Ctrl-C then took 91 s. Every wait here is on a line of the command's output,
a process's exit or a reply, with a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actorrl.cluster.client import Client
from tests.helpers.cluster import CLI, cli_env, join_node, start_coordinator
from tests.helpers.procs import pids_alive, terminate
from transport.auth import generate_keys

pytestmark = pytest.mark.cluster


class Lines:
    """A child's stdout read line by line with deadlines (no sleeping)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""
        self.seen: list[str] = []

    def until(self, text: str, timeout_s: float) -> str:
        """The first new line containing ``text``; fails at the deadline or at EOF."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                self.seen.append(line)
                if text in line:
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no line with {text!r} within {timeout_s:g} s; output so far:\n"
                            + "\n".join(self.seen))
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    pytest.fail(f"the command exited ({self.proc.wait()}) before a line with "
                                f"{text!r}; output:\n" + "\n".join(self.seen))
                self.buffer += chunk


@contextlib.contextmanager
def keyed_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A coordinator (CURVE keys, tcp on 127.0.0.1, state in ``tmp_path/state``) and one
    node; at the end every process it saw (the commands' included) must be gone."""
    keys = str(tmp_path / "keys")
    generate_keys(keys)
    proc, address = start_coordinator(str(tmp_path), keys)
    cluster = Cluster(tmp_path, keys, address, proc)
    node = join_node(str(tmp_path), address, keys, "127.0.0.1", "n", 3, cluster.sessions)
    cluster.pids.update({proc.pid, node.pid})
    try:
        with Client(address, keys_dir=keys, bind_host=None) as client:
            assert client.wait_for_nodes(1, 60) == 1
        yield cluster
    finally:
        for train in cluster.trains:
            if train.poll() is None:  # a failed test: stopped as a user would (SIGTERM)
                terminate(train)
        for proc in (node, cluster.coordinator):
            terminate(proc)
        for session in cluster.sessions:
            shutil.rmtree(session, ignore_errors=True)
    assert pids_alive(sorted(cluster.pids), 60) == []


@dataclasses.dataclass
class Cluster:
    """What :func:`keyed_cluster` runs, and every pid it saw."""

    tmp: Path
    keys: str
    address: str
    coordinator: subprocess.Popen
    sessions: list[str] = dataclasses.field(default_factory=list)
    pids: set[int] = dataclasses.field(default_factory=set)
    trains: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def train(self, stop_timesteps: int) -> Lines:
        """``actorrl train apex --address`` on this cluster (plain progress), its output
        read line by line."""
        proc = subprocess.Popen(
            [*CLI, "train", "apex", "--address", self.address, "--keys", self.keys,
             "--num-workers", "1", "--set", "min_iter_time_s=0.5",
             "--set", "learning_starts=200", "--stop-timesteps", str(stop_timesteps),
             "--stop-time", "150", "--progress", "plain",
             "--output", str(self.tmp / "results")],
            cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
            env=cli_env())
        self.trains.append(proc)
        self.pids.add(proc.pid)
        return Lines(proc)

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator (its actors' node stops them and waits)."""
        self.coordinator.kill()
        self.coordinator.wait(10)

    def restart_coordinator(self) -> None:
        """The coordinator again, on the same address and state directory."""
        self.coordinator, address = start_coordinator(str(self.tmp), self.keys,
                                                      bind=self.address)
        assert address == self.address
        self.pids.add(self.coordinator.pid)

    def job_actor_pids(self) -> set[int]:
        """The pids of the actors the coordinator knows now."""
        with Client(self.address, keys_dir=self.keys, bind_host=None) as client:
            return {a["pid"] for a in client.actors()}


LOST_S = 90.0
"""How long noticing the loss may take: at the disconnect or, at the latest, when the
pending results call times out (10 s poll + 15 s), on a loaded machine."""


def _check_lost_line(line: str, address: str) -> None:
    """What happened, how long the command waits, how to stop waiting."""
    assert f"lost the coordinator at {address}" in line, line
    assert "reconnecting for up to 120 s" in line, line
    assert "Ctrl-C stops waiting" in line and "actorrl stop JOB" in line, line


def _follow_then_lose_the_coordinator(cluster: Cluster, timesteps: int) -> Lines:
    """``train --address`` on a job of ``timesteps``; once its first result is out the
    coordinator is SIGKILLed and the command's "lost" line checked. Returns its output."""
    out = cluster.train(timesteps)
    out.until("iter=1 ", 150)
    cluster.pids.update(cluster.job_actor_pids())
    cluster.kill_coordinator()
    _check_lost_line(out.until("lost the coordinator", LOST_S), cluster.address)
    return out


@pytest.mark.timeout(360)
def test_train_address_says_when_it_loses_the_coordinator_and_when_it_is_back(
        tmp_path: Path) -> None:
    """The command prints one line when the coordinator is lost (what happened, how long
    it waits, how to stop waiting) and one when it is back; then it follows the job,
    resumed by the restarted coordinator, to its stop criterion and exits 0."""
    with keyed_cluster(tmp_path) as cluster:
        out = _follow_then_lose_the_coordinator(cluster, 30_000)
        assert not any("reconnected" in line for line in out.seen), out.seen
        cluster.restart_coordinator()
        back = out.until("reconnected to the coordinator", 120)
        assert cluster.address in back, back
        out.until("timesteps_total=", 120)  # the resumed job's results go on
        assert out.proc.wait(240) == 0, "\n".join(out.seen)
        assert sum("lost the coordinator" in line for line in out.seen) == 1, out.seen
        cluster.pids.update(cluster.job_actor_pids())


@pytest.mark.timeout(300)
def test_ctrl_c_while_the_coordinator_is_away_ends_train_address_at_once(
        tmp_path: Path) -> None:
    """Ctrl-C while the command waits for a lost coordinator ends it with 130 within
    seconds, as its line says (before: its checkpoint, record and stop requests each
    waited out a 30-s connect timeout, 91 s measured)."""
    with keyed_cluster(tmp_path) as cluster:
        out = _follow_then_lose_the_coordinator(cluster, 1_000_000)
        out.proc.send_signal(signal.SIGINT)
        try:
            code = out.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("train --address was still running 20 s after Ctrl-C; output:\n"
                        + "\n".join(out.seen))
        assert code == 130, "\n".join(out.seen)
