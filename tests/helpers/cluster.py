"""Launchers for the ``actorrl`` commands as real subprocesses: the training CLI run to
completion, a coordinator started up to its READY line, node agents joining it."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actorrl.runtime.node.fork_server import PRELOAD_ENV
from tests.helpers.procs import REPO, child_env, ready_line, start_python, terminate
from transport.auth import generate_keys

CLI = [sys.executable, "-m", "actorrl.cli.main"]
CLUSTER_CLI = [sys.executable, "-m", "actorrl.cli.cluster"]
TAG_VARIABLE = "ACTORRL_TEST_CLI_RUN"
"""Set to a test's tag in a CLI run's environment (its actor processes inherit it)."""
SESSION_TIMEOUT_S = 4.0
"""Client-session timeout of test coordinators (a dead client's actors stop soon)."""


def cli_env(tag: str = "") -> dict[str, str]:
    """The environment of a CLI run: the repository importable, ``tag`` in
    :data:`TAG_VARIABLE`, no ``COLUMNS`` (tables lay out the same everywhere)."""
    env = child_env()
    if tag:
        env[TAG_VARIABLE] = tag  # inherited by every actor process of the run
    env.pop("COLUMNS", None)
    return env


def run_cli(args: list[str], cwd: Path | str, timeout_s: float = 60.0,
            python: list[str] | None = None, tag: str = "") -> subprocess.CompletedProcess:
    """Run the CLI (``python``: another entry point) to completion, bounded."""
    return subprocess.run([*(python or CLI), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, env=cli_env(tag))


def run_dirs(output: Path) -> list[Path]:
    """The results folders under ``output``."""
    return sorted(p for p in output.iterdir() if p.is_dir()) if output.exists() else []


def read(path: str | Path) -> str:
    """A text file's contents."""
    return Path(path).read_text(errors="replace")


def spawn(args: list[str], log_path: str, pass_fds: tuple[int, ...] = (),
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """``actorrl.cli.cluster ARGS`` as a subprocess with its output in ``log_path``
    (``env``: variables set for it)."""
    return start_python(["-m", "actorrl.cli.cluster", *args], log_path,
                        stdin=subprocess.DEVNULL, stdout=None, pass_fds=pass_fds, env=env)


@contextlib.contextmanager
def keyed_coordinator(tmp: str) -> Iterator[tuple[str, str, str]]:
    """A coordinator on 127.0.0.1 with fresh CURVE keys in ``tmp/keys``, for a ``with``
    block: ``(tmp, address, keys_dir)``; stopped at the end."""
    keys = os.path.join(tmp, "keys")
    generate_keys(keys)
    proc, address = start_coordinator(tmp, keys)
    try:
        yield tmp, address, keys
    finally:
        terminate(proc)


def start_coordinator(tmp: str, keys: str | None, bind: str | None = "tcp://127.0.0.1:0",
                      timeout_s: float = 60.0, insecure_loopback: bool = False
                      ) -> tuple[subprocess.Popen, str]:
    """Start ``actorrl coordinator start`` and wait for its READY line (a handshake);
    ``bind`` None: its default (ipc without keys). Its log is ``tmp/coordinator.log``."""
    read_fd, write_fd = os.pipe()
    args = ["coordinator", "start", "--state-dir", os.path.join(tmp, "state"),
            "--ready-fd", str(write_fd), "--session-timeout", str(SESSION_TIMEOUT_S)]
    if bind is not None:
        args += ["--bind", bind]
    if insecure_loopback:
        args += ["--insecure-loopback"]
    if keys:
        args += ["--keys", keys]
    log_path = os.path.join(tmp, "coordinator.log")
    proc = spawn(args, log_path, pass_fds=(write_fd,))
    os.close(write_fd)
    try:
        line = ready_line(proc, read_fd, "READY ", timeout_s, log_path)
    finally:
        os.close(read_fd)
    return proc, line.split()[1]


def join_node(tmp: str, address: str, keys: str | None, host: str | None, name: str,
              cpus: float, sessions: list[str], preload: str | None = None
              ) -> subprocess.Popen:
    """Start ``actorrl node join`` on loopback address ``host`` (None: the node's default,
    ipc only for an ipc coordinator); its log is ``tmp/node-NAME.log`` and its session
    directory is appended to ``sessions`` (for the test to remove, even after a SIGKILL).
    ``preload``: what its fork server imports (``ACTORRL_FORK_PRELOAD``), for a node that
    starts no RL actor: e.g. ``numpy`` instead of torch (~2 s of CPU for nothing)."""
    session = tempfile.mkdtemp(prefix="arl-node-")  # short: ipc paths max ~107 bytes
    sessions.append(session)
    args = ["node", "join", address, "--name", name, "--cpus", str(cpus),
            "--gpus", "0", "--session-dir", session]
    if host is not None:
        args += ["--host", host]
    if keys:
        args += ["--keys", keys]
    return spawn(args, os.path.join(tmp, f"node-{name}.log"),
                 env=None if preload is None else {PRELOAD_ENV: preload})


__all__ = ["CLI", "CLUSTER_CLI", "REPO", "cli_env", "join_node", "read", "run_cli",
           "run_dirs", "spawn", "start_coordinator"]


def read_jsonl(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed (a line that does not parse fails the test)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def open_pidfds(pids: set[int]) -> dict[int, int]:
    """pid -> pidfd for each pid still running (an exited one needs no waiting)."""
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
    return fds


def wait_pidfds_exit(pidfds: dict[int, int], timeout_s: float) -> None:
    """Wait until every process exits (its pidfd becomes readable); fail naming the ones
    still alive at the deadline."""
    poller = select.poll()
    for fd in pidfds.values():
        poller.register(fd, select.POLLIN)
    alive = dict(pidfds)
    deadline = time.monotonic() + timeout_s
    try:
        while alive:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                names = {pid: _cmdline(pid) for pid in alive}
                pytest.fail(f"processes still alive {timeout_s:g} s after the CLI exited: "
                            f"{names}")
            for fd, _ in poller.poll(remaining_ms):
                poller.unregister(fd)
                alive = {p: f for p, f in alive.items() if f != fd}
    finally:
        for fd in pidfds.values():
            os.close(fd)


def tagged_processes(tag: str) -> set[int]:
    """Live processes whose environment carries ``TAG_VARIABLE=tag`` (the CLI and every
    process it started, however deep)."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found = set()
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            entries = Path(environ).read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in entries:
            found.add(int(environ.split("/")[2]))
    return found


def assert_no_process_left(tag: str, timeout_s: float = 10.0) -> None:
    """Every process of the run has exited (waiting on pidfds up to ``timeout_s``)."""
    wait_pidfds_exit(open_pidfds(tagged_processes(tag)), timeout_s)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def read_tensorboard_events(path: Path) -> list[Any]:
    """The Event protobufs of a TensorBoard event file (TFRecord framing: length, length
    crc, Event protobuf, data crc)."""
    from tensorboardX.proto.event_pb2 import Event

    data = path.read_bytes()
    events = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        events.append(Event.FromString(data[pos + 12:pos + 12 + length]))
        pos += 12 + length + 4
    return events


def read_tensorboard_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from a TensorBoard event file."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for event in read_tensorboard_events(path):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
