"""The Slurm recipe of docs/deploy.md, run under a real Slurm.

The test starts munged, slurmctld and slurmd on this machine (one node, this host, a
slurm.conf of its own in a temp folder: SlurmUser root, proctrack/linuxproc, no cgroups, so
it runs in a container), submits ``deploy/slurm/actorrl.sbatch`` -- the file docs/deploy.md
includes verbatim -- with ``sbatch`` for a small CartPole job, waits for Slurm to report the
batch job ended, and reads the job's results from the state directory the script gave the
coordinator. Every daemon and every process the Slurm job left is stopped afterwards.

Slurm's binaries come from Debian's ``slurm-wlm`` (``apt-get install slurm-wlm``; munge comes
with it). Without them the test is skipped, except under ``ACTORRL_CI=1``, where it fails
(CI installs them: .ci/run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.procs import pids_alive

pytestmark = [pytest.mark.slurm, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "slurm" / "actorrl.sbatch"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")
SBIN = ("/usr/sbin", "/usr/local/sbin")
JOB_TIMEOUT_S = 150.0
"""The whole Slurm job (coordinator, agent, 3 IMPALA iterations) at most; ~20 s measured
on 2 cores."""


def _which(name: str) -> str | None:
    """``name`` on PATH or in the sbin folders (root's daemons live there)."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _require_slurm() -> dict[str, str]:
    """The paths of Slurm's and munge's binaries; skips (fails under ``ACTORRL_CI=1``)
    when one is missing, and skips when not root (the daemons run as root here)."""
    found = {name: _which(name) for name in BINARIES}
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        message = (f"Slurm is not installed ({', '.join(missing)} not found): install it "
                   "with `apt-get install slurm-wlm` (Debian/Ubuntu; munge comes with it)")
        if os.environ.get("ACTORRL_CI"):
            pytest.fail(message + "; ACTORRL_CI is set, and CI installs it (.ci/run)")
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the test runs munged, slurmctld and slurmd as root (SlurmUser root); "
                    "run it as root, e.g. in a container")
    return {name: str(path) for name, path in found.items()}


def _free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on this host right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_for(condition, timeout_s: float, what: str, logs: list[Path] = ()) -> None:
    """Poll ``condition()`` (short waits) until it is true; fail after ``timeout_s``
    naming ``what`` and showing the end of ``logs``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{_tail(p)}" for p in logs)
            pytest.fail(f"{what} within {timeout_s:g} s\n{tails}")
        time.sleep(0.2)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def _marked_pids(marker: str) -> list[int]:
    """Processes (other than this one) whose environment holds ``marker``: the daemons
    and everything the Slurm job started (sbatch, srun and slurmstepd pass it on)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _kill_marked(marker: str) -> list[int]:
    """SIGTERM, then SIGKILL, every process marked with ``marker``; the pids still alive
    after that (should be none)."""
    pids = _marked_pids(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        pids = pids_alive(pids, 5.0)
        if not pids:
            break
    return pids


SLURM_CONF = """\
# One-node Slurm for tests/test_slurm.py: root daemons, no cgroups (a container).
ClusterName=actorrltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MessageTimeout=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """munged, slurmctld and slurmd of one node, running until :meth:`stop`."""

    def __init__(self, root: Path, binaries: dict[str, str]) -> None:
        self.root = root
        self.bin = binaries
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.conf = root / "slurm.conf"
        self.marker = f"ACTORRL_TEST_SLURM={root}"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf),
                    "ACTORRL_TEST_SLURM": str(root)}
        self.daemons: list[subprocess.Popen] = []

    @property
    def logs(self) -> list[Path]:
        """The daemons' log files."""
        return [self.root / name for name in ("munged.log", "slurmctld.log", "slurmd.log")]

    def start(self) -> None:
        """Start munged, slurmctld and slurmd; return once the node is idle."""
        for folder in ("state", "spool", "munge"):
            (self.root / folder).mkdir(mode=0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        socket_path = self.root / "munge" / "munge.sock"
        self._daemon([self.bin["munged"], "--foreground", "--force",
                      f"--socket={socket_path}", f"--key-file={key}",
                      f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                      f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                      f"--log-file={self.root / 'munged.log'}"])
        _wait_for(socket_path.exists, 20, "munged did not create its socket", self.logs)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, ctld_port=ctld_port, slurmd_port=slurmd_port,
            munge_socket=socket_path, root=self.root, cpus=self.cpus))
        self._daemon([self.bin["slurmctld"], "-D", "-i", "-f", str(self.conf)])
        self._daemon([self.bin["slurmd"], "-D", "-f", str(self.conf)])
        _wait_for(lambda: self.node_state() in ("IDLE", "MIXED", "ALLOCATED"), 60,
                  "the Slurm node did not come up", self.logs)

    def _daemon(self, argv: list[str]) -> None:
        process = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.daemons.append(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = process.wait(0.2)
            pytest.fail(f"{Path(argv[0]).name} exited at once ({code})\n"
                        + "\n".join(f"--- {p}:\n{_tail(p)}" for p in self.logs))

    def scontrol(self, *args: str) -> str:
        """``scontrol ARGS`` against this Slurm; its output ('' when it fails)."""
        done = subprocess.run([self.bin["scontrol"], *args], env=self.env, text=True,
                              capture_output=True, timeout=30)
        return done.stdout if done.returncode == 0 else ""

    def node_state(self) -> str:
        """The node's state (IDLE, ...; '' while slurmctld does not answer)."""
        found = re.search(r"\bState=([A-Z_]+)", self.scontrol("show", "node", self.host))
        return found.group(1) if found else ""

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of job ``job_id`` ({} when unknown)."""
        text = self.scontrol("show", "job", "--oneliner", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def stop(self) -> list[int]:
        """Cancel every job, stop the daemons and kill what is left of their processes;
        the pids that would not die (should be none)."""
        if self.conf.exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run([self.bin["scancel"], "--full", "--user=root"], env=self.env,
                               capture_output=True, timeout=30)
        for process in reversed(self.daemons):  # slurmd, slurmctld, then munged
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        return _kill_marked(self.marker)


@pytest.fixture
def slurm() -> Iterator[Slurm]:
    """A one-node Slurm (munged, slurmctld, slurmd) for the test; everything stopped
    afterwards. Short folder: the munge socket path must fit 107 bytes."""
    binaries = _require_slurm()
    root = Path(tempfile.mkdtemp(prefix="arl-slurm-"))
    cluster = Slurm(root, binaries)
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"processes of the Slurm test still alive: {left}"


@pytest.mark.parametrize("ci", ["", "1"])
def test_missing_slurm_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    """Without Slurm's binaries the Slurm test is skipped with the apt command to install
    them, except under ``ACTORRL_CI=1``, where it fails (CI installs them)."""
    monkeypatch.setattr(sys.modules[__name__], "_which", lambda name: None)
    monkeypatch.setenv("ACTORRL_CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="apt-get install slurm-wlm"):
        _require_slurm()


def test_docs_include_the_sbatch_script_verbatim() -> None:
    """docs/deploy.md shows deploy/slurm/actorrl.sbatch through a snippet include (what
    the site renders is the file this module runs), and nothing else under ``#SBATCH``."""
    text = (REPO / "docs" / "deploy.md").read_text()
    assert '--8<-- "deploy/slurm/actorrl.sbatch"' in text
    assert not re.search(r"^#SBATCH", text, flags=re.M), \
        "a copy of the script in the docs would drift from the file"
    assert SCRIPT.read_text().startswith("#!/bin/bash\n")


@pytest.mark.timeout(240)
def test_the_documented_sbatch_script_runs_a_job_to_its_stop(
        slurm: Slurm, tmp_path: Path) -> None:
    """``sbatch deploy/slurm/actorrl.sbatch examples/cartpole-impala.yaml --set ...`` under
    slurmctld + slurmd: the script's coordinator, srun-started node agent and submitted job
    run; the job finishes at its stop (3 iterations) with its results in the state
    directory, and the script exits 0 (Slurm's COMPLETED, exit code 0:0)."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "actorrl.cli", "keys", "generate", str(keys)],
                   check=True, capture_output=True, timeout=60)
    state = tmp_path / "state"
    output = tmp_path / "slurm.out"
    env = {**slurm.env, "ACTORRL_KEYS_DIR": str(keys), "ACTORRL_STATE_DIR": str(state),
           "ACTORRL_SLURM_PORT": str(_free_ports(1)[0]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    cpus = min(slurm.cpus, 2)
    # --wait: sbatch returns when the job has ended, with the batch script's exit status.
    try:
        submitted = subprocess.run(
            [slurm.bin["sbatch"], "--wait", "--parsable", "--nodes=1",
             f"--cpus-per-task={cpus}", "--time=5", f"--output={output}", str(SCRIPT),
             "examples/cartpole-impala.yaml", "--set", "num_workers=1",
             "--set", "stop.training_iteration=3",
             # out of reach, so the job ends at its 3 iterations however fast it learns
             # (the file's own bar, 150, was once passed at iteration 2)
             "--set", "stop.episode_reward_mean=1000000"],
            cwd=REPO, env=env, text=True, capture_output=True, timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the Slurm job did not end within {JOB_TIMEOUT_S:g} s\n"
                    + "\n".join(f"--- {p}:\n{_tail(p)}" for p in (output, *slurm.logs)))
    log = _tail(output, 80)
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr, log)
    job_id = submitted.stdout.strip().splitlines()[0].split(";")[0]
    record = slurm.job(job_id)
    assert (record.get("JobState"), record.get("ExitCode")) == ("COMPLETED", "0:0"), \
        (record, log)

    jobs = sorted((state / "jobs").iterdir())
    assert len(jobs) == 1, jobs
    job = json.loads((jobs[0] / "job.json").read_text())
    assert job["state"] == "finished", job
    results = [json.loads(line) for line in (jobs[0] / "result.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == [1, 2, 3], log
    assert results[-1]["timesteps_total"] > 0
    # The script's own output: the node joined under its host name, the job's id and end.
    assert slurm.host in log and f"job {jobs[0].name} finished" in log, log
