"""The ``actorrl`` command run for real, as a subprocess: training writes a complete results
folder, checkpoints restore with continuing counters, evaluate and plot work on them,
signals stop a run cleanly with no process left behind, a crash is one error line, and
every kind of bad input is one message with exit code 2 and no results folder.

Trainings are tiny (1 worker, 0.5 s iterations, a few thousand env steps); every wait has a
deadline that fails with the output seen so far.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from actorrl.algorithms.checkpoints import read_checkpoint
from tests.helpers.cluster import (
    CLI,
    assert_no_process_left,
    cli_env,
    join_node,
    open_pidfds,
    read_jsonl,
    read_tensorboard_scalars,
    run_cli,
    run_dirs,
    start_coordinator,
    wait_pidfds_exit,
)
from tests.helpers.procs import descendants, pids_alive, terminate

TINY = ["--num-workers", "1", "--set", "min_iter_time_s=0.5", "--stop-time", "90"]
"""Settings that keep a test training small; each test adds its stop criterion."""
RUN_TIMEOUT_S = 240.0
FIRST_RESULT_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 60.0
QUICK_TIMEOUT_S = 60.0


# ---- helpers --------------------------------------------------------------------------
class LineReader:
    """Reads a child's stdout line by line with deadlines (no sleeping)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""
        self.lines: list[str] = []

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        """The first new line matching ``predicate``; fails at the deadline or EOF."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if predicate(line):
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no matching line within {timeout_s:g} s; stdout so far:\n"
                            + "\n".join(self.lines))
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    pytest.fail(f"the CLI closed stdout (exit {self.proc.poll()}) before a "
                                "matching line; stdout:\n" + "\n".join(self.lines))
                self.buffer += chunk


def start_cli(args: list[str], cwd: Path, stderr_path: Path, tag: str,
              new_session: bool = False) -> subprocess.Popen:
    """Start the CLI with stdout piped (not a TTY: plain progress lines); its processes
    carry ``tag`` in their environment."""
    with open(stderr_path, "w") as stderr:
        return subprocess.Popen([*CLI, *args], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=stderr, bufsize=0, env=cli_env(tag),
                                start_new_session=new_session)


def finish(proc: subprocess.Popen, timeout_s: float) -> str:
    """Wait (bounded) for exit; returns the rest of stdout. Kills the CLI on timeout."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the CLI did not exit within {timeout_s:g} s")
    return out.decode(errors="replace")


# ---- one shared tiny training ---------------------------------------------------------
SHARES_THE_TRAINING = pytest.mark.xdist_group("test_cli-trained")
"""For the tests that read the module's one training: under ``--dist loadgroup`` they run in
one pytest-xdist worker, so the training runs once, not once per worker."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An Ape-X run of ~1500 env steps with a YAML config file, a --set override, a
    checkpoint every iteration (all kept), and its exit status."""
    base = tmp_path_factory.mktemp("trained")
    config = base / "apex.yaml"
    config.write_text("train_batch_size: 64\nlearning_starts: 400\nlr: 0.002\n")
    output = base / "results"
    tag = f"trained-{base.name}"
    # Iterations of at least 300 env steps and no minimum time: ~5 results whatever the
    # machine's speed (with min_iter_time_s alone a fast machine took all 1500 in one).
    proc = run_cli(["train", "apex", *TINY, "--config", str(config), "--set", "lr=0.001",
                    "--set", "min_iter_time_s=0", "--set", "timesteps_per_iteration=300",
                    "--seed", "3", "--stop-timesteps", "1500", "--checkpoint-every", "1",
                    "--keep-checkpoints", "0", "--output", str(output)], cwd=base,
                   timeout_s=RUN_TIMEOUT_S, tag=tag)
    dirs = run_dirs(output)
    return {"proc": proc, "base": base, "output": output, "dirs": dirs, "tag": tag,
            "run": dirs[0] if dirs else None}


@SHARES_THE_TRAINING
def test_train_exits_zero_when_a_stop_criterion_is_met(trained: dict) -> None:
    """The run ends by itself at --stop-timesteps with exit code 0 and prints a summary."""
    proc = trained["proc"]
    assert proc.returncode == 0, proc.stderr
    assert "finished: timesteps_total" in proc.stdout
    assert "best episode_reward_mean" in proc.stdout
    assert [line for line in proc.stdout.splitlines() if line.startswith("result iter=")]
    assert "Traceback" not in proc.stderr
    assert_no_process_left(trained["tag"])


@SHARES_THE_TRAINING
def test_train_writes_a_complete_results_folder(trained: dict) -> None:
    """config.json (resolved, file + --set applied), progress.csv with rows, parseable
    result.jsonl with RLlib keys, a TensorBoard event file, checkpoints, run.json."""
    assert len(trained["dirs"]) == 1
    run: Path = trained["run"]
    assert run.name.startswith("apex_CartPole-v1_")
    config = json.loads((run / "config.json").read_text())
    assert config["algorithm"] == "apex"
    assert config["train_batch_size"] == 64 and config["replay"]["learning_starts"] == 400
    assert config["policy"]["lr"] == 0.001  # --set wins over the file
    assert config["num_workers"] == 1 and config["seed"] == 3

    results = read_jsonl(run / "result.jsonl")
    assert len(results) >= 2
    for key in ("episode_reward_mean", "episode_reward_min", "episode_reward_max",
                "episode_len_mean", "episodes_this_iter", "timesteps_total",
                "timesteps_this_iter", "num_steps_trained", "training_iteration",
                "time_this_iter_s", "time_total_s", "num_healthy_workers", "timestamp",
                "info"):
        assert key in results[-1], key
    assert [r["training_iteration"] for r in results] == list(range(1, len(results) + 1))
    assert results[-1]["timesteps_total"] >= 1500
    assert "learner_queue" in results[-1]["info"]

    lines = (run / "progress.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert "episode_reward_mean" in header and "info/learner_queue/size_mean" in header
    assert len(lines) == 1 + len(results)

    [events] = run.glob("events.out.tfevents.*")
    scalars = read_tensorboard_scalars(events)
    for tag in ("episode_reward_mean", "episode_reward_max", "episode_len_mean",
                "throughput/env_steps_per_s"):
        assert [step for step, _ in scalars[tag]] == [r["timesteps_total"] for r in results]
    assert [v for _, v in scalars["episode_len_mean"]] == pytest.approx(
        [r["episode_len_mean"] for r in results])

    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished" and status["exit_code"] == 0
    assert status["training_iteration"] == len(results)

    checkpoints = sorted((run / "checkpoints").iterdir())
    assert [c.name for c in checkpoints] == [f"checkpoint_{i:06d}"
                                             for i in range(1, len(results) + 1)]
    folder, state = read_checkpoint(checkpoints[-1])
    assert state["algorithm"] == "apex" and state["iteration"] == len(results)
    assert state["timesteps_total"] == results[-1]["timesteps_total"]
    weights = state["policies"]["default_policy"]["weights"]
    assert weights and all(isinstance(w, np.ndarray) for w in weights.values())
    assert "optimizer" in state["policies"]["default_policy"]
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["final"] is True and metadata["training_iteration"] == len(results)
    assert list((run / "logs").glob("worker-1-*.log")) and (run / "logs/driver.log").exists()


@SHARES_THE_TRAINING
def test_restore_continues_the_counters(trained: dict, tmp_path: Path) -> None:
    """A run restored from a checkpoint starts at the next iteration, above the
    checkpoint's timesteps_total, with the checkpoint's config as its base."""
    run: Path = trained["run"]
    _, state = read_checkpoint(run)
    target = state["timesteps_total"] + 500
    output = tmp_path / "resumed"
    proc = run_cli(["train", "apex", "--restore", str(run), "--stop-timesteps", str(target),
                    "--checkpoint-every", "0", "--output", str(output)], cwd=tmp_path,
                   timeout_s=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    [resumed] = run_dirs(output)
    results = read_jsonl(resumed / "result.jsonl")
    assert results[0]["training_iteration"] == state["iteration"] + 1
    assert results[0]["timesteps_total"] > state["timesteps_total"]
    assert results[0]["num_steps_trained"] >= state["num_steps_trained"]
    assert results[-1]["timesteps_total"] >= target
    config = json.loads((resumed / "config.json").read_text())
    assert config["train_batch_size"] == 64 and config["num_workers"] == 1
    status = json.loads((resumed / "run.json").read_text())
    assert status["restored_from"].endswith(f"checkpoint_{state['iteration']:06d}")
    [final] = sorted((resumed / "checkpoints").iterdir())
    assert final.name == f"checkpoint_{results[-1]['training_iteration']:06d}"


@SHARES_THE_TRAINING
def test_evaluate_prints_mean_and_std(trained: dict) -> None:
    """evaluate rolls out N greedy episodes of a checkpoint and prints mean/std."""
    checkpoint = sorted((trained["run"] / "checkpoints").iterdir())[0]
    proc = run_cli(["evaluate", str(checkpoint), "--episodes", "3", "--seed", "1"],
                   cwd=trained["base"])
    assert proc.returncode == 0, proc.stderr
    assert "3 episodes" in proc.stdout
    assert "return mean" in proc.stdout and "std" in proc.stdout


@SHARES_THE_TRAINING
def test_a_checkpoints_policy_loads_for_analysis_scripts(trained: dict) -> None:
    """load_checkpoint_policy (what benchmarks/pong_probe.py uses) gives the checkpoint's
    greedy policy with its weights, env and step count, from a results folder."""
    from actorrl.algorithms.checkpoints import read_checkpoint
    from actorrl.experiment.evaluate import load_checkpoint_policy

    loaded = load_checkpoint_policy(trained["run"])
    _folder, state = read_checkpoint(loaded.checkpoint)
    assert (loaded.algorithm, loaded.env) == ("apex", "CartPole-v1")
    assert loaded.timesteps_total == state["timesteps_total"] >= 1500
    saved = state["policies"]["default_policy"]["weights"]
    weights = loaded.policy.get_weights()
    assert saved and saved.keys() <= weights.keys()
    for key in saved:
        np.testing.assert_array_equal(np.asarray(weights[key]), np.asarray(saved[key]))
    actions, _extra = loaded.policy.compute_actions(np.zeros((2, 4), np.float32))
    assert actions.shape == (2,)


@SHARES_THE_TRAINING
def test_evaluate_json_is_seeded_and_complete(trained: dict) -> None:
    """--json gives every statistic; the same seed gives the same returns."""
    outputs = [run_cli(["evaluate", str(trained["run"]), "--episodes", "4", "--seed", "7",
                        "--json"], cwd=trained["base"]) for _ in range(2)]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(p.stdout) for p in outputs)
    assert first["episodes"] == 4 and len(first["episode_rewards"]) == 4
    assert first["episode_rewards"] == second["episode_rewards"]
    rewards = np.asarray(first["episode_rewards"])
    assert first["episode_reward_mean"] == pytest.approx(rewards.mean())
    assert first["episode_reward_std"] == pytest.approx(rewards.std())
    assert first["episode_reward_min"] >= 1.0  # CartPole pays 1 per step


@SHARES_THE_TRAINING
def test_plot_overlays_runs_into_a_png(trained: dict, tmp_path: Path) -> None:
    """plot writes a valid PNG for several runs, and next to the run for one."""
    second = tmp_path / "apex_copy"
    shutil.copytree(trained["run"], second, ignore=shutil.ignore_patterns("checkpoints"))
    out = tmp_path / "curves.png"
    proc = run_cli(["plot", str(trained["run"]), str(second), "-o", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    import matplotlib.image

    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100

    proc = run_cli(["plot", str(second)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (second / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- signals --------------------------------------------------------------------------
@pytest.mark.parametrize(("signum", "to_group", "exit_code"), [
    (signal.SIGINT, False, 130),
    (signal.SIGINT, True, 130),   # a terminal's Ctrl-C reaches every process of the group
    (signal.SIGTERM, False, 143),
], ids=["sigint", "ctrl-c-group", "sigterm"])
def test_signal_stops_cleanly(tmp_path: Path, signum: int, to_group: bool,
                              exit_code: int) -> None:
    """After the first result, a signal makes the CLI write a final checkpoint, flush the
    results, stop every actor and exit with 128 + signum; no child process survives."""
    output = tmp_path / "results"
    tag = f"signal-{tmp_path.name}"
    proc = start_cli(["train", "apex", *TINY, "--stop-timesteps", "1000000",
                      "--checkpoint-every", "0", "--output", str(output)], tmp_path,
                     tmp_path / "stderr.txt", tag, new_session=to_group)
    reader = LineReader(proc)
    try:
        reader.wait_for(lambda line: line.startswith("result iter="), FIRST_RESULT_TIMEOUT_S)
        children = descendants(proc.pid)
        assert len(children) >= 3, children  # worker, learner, replay shard
        pidfds = open_pidfds(children)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        rest = finish(proc, EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == exit_code, f"stdout:\n{rest}\nstderr:\n{stderr}"
    wait_pidfds_exit(pidfds, timeout_s=10.0)
    assert_no_process_left(tag)
    assert "Traceback" not in stderr, stderr
    [run] = run_dirs(output)
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "interrupted" and status["exit_code"] == exit_code
    checkpoints = sorted((run / "checkpoints").iterdir())
    assert checkpoints, "no final checkpoint written"
    _, state = read_checkpoint(checkpoints[-1])
    results = read_jsonl(run / "result.jsonl")
    assert results and state["iteration"] == results[-1]["training_iteration"]
    assert "interrupted" in rest


def test_second_signal_aborts_promptly(tmp_path: Path) -> None:
    """A second SIGINT (sent once the first is acknowledged) aborts the stop sequence:
    exit 130, status interrupted, and still no process left behind."""
    output = tmp_path / "results"
    tag = f"abort-{tmp_path.name}"
    proc = start_cli(["train", "apex", *TINY, "--stop-timesteps", "1000000",
                      "--checkpoint-every", "0", "--output", str(output)], tmp_path,
                     tmp_path / "stderr.txt", tag)
    reader = LineReader(proc)
    try:
        reader.wait_for(lambda line: line.startswith("result iter="), FIRST_RESULT_TIMEOUT_S)
        proc.send_signal(signal.SIGINT)
        reader.wait_for(lambda line: line.startswith("SIGINT received"), EXIT_TIMEOUT_S)
        proc.send_signal(signal.SIGINT)
        rest = finish(proc, EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, rest
    assert_no_process_left(tag)
    [run] = run_dirs(output)
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "interrupted", status
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()


# ---- failures -------------------------------------------------------------------------
def test_actor_crash_is_one_error_line(tmp_path: Path) -> None:
    """An actor whose constructor raises ends the run with exit code 1, one error line
    naming the problem and the logs folder, status "failed", and no process left."""
    output = tmp_path / "results"
    stderr_path = tmp_path / "stderr.txt"
    tag = f"crash-{tmp_path.name}"
    proc = start_cli(["train", "apex", *TINY, "--set",
                      'model={"custom_model": "no_such_module_xyz:Model"}',
                      "--output", str(output)], tmp_path, stderr_path, tag)
    try:
        stdout = finish(proc, RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert_no_process_left(tag)
    assert "starting apex" in stdout and "failed" in stdout
    stderr = stderr_path.read_text()
    assert proc.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("actorrl train: error: training failed:")
    assert "no_such_module_xyz" in lines[0] and "logs:" in lines[0]
    assert "Traceback" not in stderr
    [run] = run_dirs(output)
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert str(run / "logs") in lines[0]


@SHARES_THE_TRAINING
def test_debug_flag_shows_the_traceback(trained: dict, tmp_path: Path) -> None:
    """A failure outside training (a checkpoint whose config breaks the policy) is one
    line without --debug and a traceback with it."""
    folder, _ = read_checkpoint(trained["run"])
    broken = tmp_path / "checkpoint_000001"
    shutil.copytree(folder, broken)
    from actorrl.algorithms.checkpoints import (
        decode_state_file,
        encode_state_file,
    )

    state = decode_state_file(bytearray((broken / "state.bin").read_bytes()))
    state["config"]["model"] = {"custom_model": "no_such_module_xyz:Model"}
    with open(broken / "state.bin", "wb") as f:
        for chunk in encode_state_file(state):
            f.write(chunk)
    plain = run_cli(["evaluate", str(broken), "--episodes", "1"], cwd=tmp_path)
    assert plain.returncode == 1
    assert plain.stderr.count("\n") == 1 and "no_such_module_xyz" in plain.stderr
    assert "--debug" in plain.stderr and "Traceback" not in plain.stderr
    debug = run_cli(["evaluate", str(broken), "--episodes", "1", "--debug"], cwd=tmp_path)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


BAD_INPUTS = [
    (["train", "apx"], "unknown algorithm 'apx'", "Did you mean 'apex'"),
    (["train", "apex", "--env", "CartPol-v1"], "unknown environment id 'CartPol-v1'",
     "CartPole-v1"),
    (["train", "apex", "--set", "lrr=0.1"], "unknown config key 'lrr'", "did you mean 'lr'"),
    (["train", "impala", "--set", "lr=fast", "--set", "num_workers=1.5"],
     "lr must be a number", "num_workers must be an integer"),
    (["train", "a3c", "--set", "lr"], "must look like key=value", "'lr'"),
    (["train", "a2c", "--config", "missing.yaml"], "config file 'missing.yaml' does not exist",
     ""),
    (["train", "apex", "--config", "bad.yaml"], "not valid YAML", "bad.yaml"),
    (["train", "apex", "--config", "other.json"], "is for algorithm 'a3c'", "not 'apex'"),
    (["train", "apex", "--restore", "nowhere"], "checkpoint 'nowhere' does not exist", ""),
    (["train", "apex", "--stop-time", "soon"], "argument --stop-time", "'soon'"),
    (["train", "apex", "--num-workers", "-1"], "argument --num-workers", "must be >= 0"),
    (["evaluate", "nowhere", "--episodes", "2"], "checkpoint 'nowhere' does not exist", ""),
    (["plot", "nowhere"], "results folder 'nowhere' does not exist", ""),
]


@pytest.mark.parametrize(("args", "message", "detail"), BAD_INPUTS,
                         ids=[" ".join(a[:4]) for a, _, _ in BAD_INPUTS])
def test_bad_input_is_one_message_and_exit_2(tmp_path: Path, args: list[str], message: str,
                                             detail: str) -> None:
    """Each kind of bad input: a message naming the problem (and the choices), exit code
    2, no traceback, and no results folder."""
    (tmp_path / "bad.yaml").write_text("lr: [0.1\n")
    (tmp_path / "other.json").write_text(json.dumps({"algorithm": "a3c", "lr": 0.1}))
    output = tmp_path / "results"
    extra = ["--output", str(output)] if args[0] == "train" else []
    proc = run_cli([*args, *extra], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and detail in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dirs(output), "bad input left a results folder"


@SHARES_THE_TRAINING
def test_restore_of_another_algorithm_is_refused(trained: dict, tmp_path: Path) -> None:
    """A checkpoint restores only into its own algorithm (exit 2, nothing written)."""
    output = tmp_path / "results"
    proc = run_cli(["train", "a3c", "--restore", str(trained["run"]), "--output", str(output)],
                   cwd=tmp_path)
    assert proc.returncode == 2
    assert "is for algorithm 'apex', not 'a3c'" in proc.stderr
    assert not run_dirs(output)


# ---- --address and the cluster commands -------------------------------------------------
FAKE_CLIENT = r'''
import json, os, sys, types

class Job:
    id = "job-1"
    def __init__(self, config):
        self.config = config
        self.state = "running"
    def results(self):
        for i in range(1, int(os.environ["FAKE_JOB_RESULTS"]) + 1):
            yield {"episode_reward_mean": 10.0 * i, "episode_reward_min": 1.0,
                   "episode_reward_max": 20.0 * i, "episode_len_mean": 10.0 * i,
                   "episodes_this_iter": 3, "timesteps_total": 1000 * i,
                   "timesteps_this_iter": 1000, "num_steps_trained": 500 * i,
                   "training_iteration": i, "time_this_iter_s": 1.0,
                   "time_total_s": float(i), "num_healthy_workers": 2,
                   "timestamp": 0.0, "info": {"learner_queue": {"size_mean": 1.5}}}
        self.state = "finished"
    def checkpoint(self):
        print("FAKE checkpoint", flush=True)
        return {"path": "/coordinator/jobs/job-1/checkpoints/checkpoint_000002",
                "iteration": 2, "timesteps_total": 2000}
    def status(self):
        return {"job_id": self.id, "state": self.state, "stop_reason": "time_total_s >= 3",
                "checkpoint": {"path": "/coordinator/jobs/job-1/checkpoints/checkpoint_000003",
                               "iteration": 3}}
    def stop(self):
        print("FAKE job stopped", flush=True)
        return {"job_id": self.id, "state": "stopped"}

class Client:
    def __init__(self, address, keys_dir=None, *, bind_host="auto", connect_timeout_s=10.0):
        print("FAKE client", address, keys_dir, flush=True)
    def submit(self, config):
        # One write: concurrent trials submit from several threads (print writes the line
        # and its newline apart, so two lines could interleave).
        sys.stdout.write("FAKE submit " + json.dumps(config, sort_keys=True, default=repr)
                         + "\n")
        sys.stdout.flush()
        return Job(config)
    def close(self):
        print("FAKE closed", flush=True)

module = types.ModuleType("actorrl.cluster.client")
module.Client = Client
sys.modules["actorrl.cluster.client"] = module
from actorrl.cli.main import main
sys.exit(main(sys.argv[1:]))
'''


def _run_fake_remote(tmp_path: Path, args: list[str], num_results: int,
                     keys: list[str] | None = None, env: dict[str, str] | None = None
                     ) -> subprocess.CompletedProcess:
    """``train apex --address`` through :data:`FAKE_CLIENT` (``--keys /k`` unless ``keys``
    says otherwise), its job streaming ``num_results`` results."""
    full_env = cli_env()
    full_env.pop("ACTORRL_KEYS_DIR", None)
    full_env.update(FAKE_JOB_RESULTS=str(num_results), **(env or {}))
    return subprocess.run([sys.executable, "-c", FAKE_CLIENT, "train", "apex", "--address",
                           "tcp://10.0.0.1:7000", *(["--keys", "/k"] if keys is None else keys),
                           *args, "--output", str(tmp_path / "results")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT_S,
                          env=full_env)


def _fake_calls(stdout: str) -> tuple[list[str], dict]:
    """The stub's ``FAKE ...`` lines (the submission replaced by ``FAKE submit``) and the
    submitted mapping."""
    lines, submitted = [], {}
    for line in stdout.splitlines():
        if line.startswith("FAKE submit "):
            submitted = json.loads(line.removeprefix("FAKE submit "))
            line = "FAKE submit"
        if line.startswith("FAKE"):
            lines.append(line)
    return lines, submitted


@pytest.mark.timeout(300)
def test_address_trains_on_a_real_cluster_and_records_results(tmp_path: Path) -> None:
    """``train apex --address`` against a real coordinator and node (keyless, ipc, in
    their own processes): the job runs there, its results are followed and recorded in
    the local results folder, and once the criterion is met the job's checkpoint is a
    file on the coordinator's side and the job has ended (stopped by the command or by
    itself); the cluster keeps running no actor of it."""
    from actorrl.cluster.client import Client

    proc, address = start_coordinator(str(tmp_path), None, bind=None)
    sessions: list[str] = []
    node = join_node(str(tmp_path), address, None, None, "n", 3, sessions)
    try:
        with Client(address) as client:
            assert client.wait_for_nodes(1, 60) == 1
        train = run_cli(["train", "apex", "--address", address, *TINY,
                         "--set", "learning_starts=200", "--stop-timesteps", "1500",
                         "--output", str(tmp_path / "results")], tmp_path,
                        timeout_s=RUN_TIMEOUT_S)
        assert train.returncode == 0, train.stderr[-3000:]
        [run] = run_dirs(tmp_path / "results")
        results = read_jsonl(run / "result.jsonl")
        assert results and results[-1]["timesteps_total"] >= 1500
        assert [r["training_iteration"] for r in results] == list(
            range(1, len(results) + 1))
        status = json.loads((run / "run.json").read_text())
        assert status["status"] == "finished", status
        path, where = status["last_checkpoint"].split(" ", 1)
        assert where == "(on the coordinator's host)", status["last_checkpoint"]
        checkpoint = Path(path)
        assert checkpoint.is_relative_to(tmp_path / "state"), checkpoint
        assert checkpoint.exists(), checkpoint
        # What the coordinator received: the --set overrides and every stop criterion
        # (the command's own stop is proved deterministically with the stub client below).
        submitted = json.loads((tmp_path / "state" / "jobs" / status["job_id"]
                                / "job.json").read_text())["submission"]
        assert submitted["algorithm"] == "apex", submitted
        assert submitted["replay"]["learning_starts"] == 200, submitted
        assert submitted["min_iter_time_s"] == 0.5 and submitted["num_workers"] == 1, submitted
        assert submitted["stop"] == {"episode_reward_mean": 450, "timesteps_total": 1500,
                                     "time_total_s": 90}, submitted
        with Client(address) as client:
            [job] = client.jobs()
            # Stopped by the command, or finished by the same criterion on the coordinator.
            assert job["job_id"] == status["job_id"], job
            assert job["state"] in ("stopped", "finished"), job
            # The job's actors (still stopping, if the job only just ended) exit.
            assert pids_alive([a["pid"] for a in client.actors()], 60) == []
    finally:
        for p in (node, proc):
            terminate(p)
        for session in sessions:
            shutil.rmtree(session, ignore_errors=True)
    log = (tmp_path / "coordinator.log").read_text()
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]


def test_address_submits_the_resolved_config_and_stops_the_job_it_ended(tmp_path: Path
                                                                        ) -> None:
    """With --address the command connects with --keys, submits the resolved config (the
    --set overrides included) with every stop criterion, and once its own criterion is met
    it checkpoints the job, stops it and closes the client, in that order."""
    proc = _run_fake_remote(tmp_path, ["--set", "lr=0.0123", "--set", "learning_starts=321",
                                       "--stop-reward", "none", "--stop-timesteps", "2000",
                                       "--stop-time", "77"], 3)
    assert proc.returncode == 0, proc.stderr
    calls, submitted = _fake_calls(proc.stdout)
    assert calls == ["FAKE client tcp://10.0.0.1:7000 /k", "FAKE submit", "FAKE checkpoint",
                     "FAKE job stopped", "FAKE closed"], proc.stdout
    assert submitted["algorithm"] == "apex" and submitted["env"] == "CartPole-v1", submitted
    assert submitted["policy"]["lr"] == 0.0123, submitted
    assert submitted["replay"]["learning_starts"] == 321, submitted
    assert submitted["stop"] == {"timesteps_total": 2000, "time_total_s": 77}, submitted
    [run] = run_dirs(tmp_path / "results")
    assert [r["timesteps_total"] for r in read_jsonl(run / "result.jsonl")] == [1000, 2000]
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished" and status["job_id"] == "job-1", status
    assert "checkpoint_000002" in status["last_checkpoint"], status


@pytest.mark.parametrize("keys, env, expected", [
    ([], {"ACTORRL_KEYS_DIR": "~/env-keys"}, os.path.expanduser("~/env-keys")),
    (["--keys", "/flag-keys"], {"ACTORRL_KEYS_DIR": "/env-keys"}, "/flag-keys"),
    ([], {}, "None")])
def test_address_keys_come_from_the_flag_then_the_environment(
        tmp_path: Path, keys: list[str], env: dict[str, str], expected: str) -> None:
    """The client gets --keys, else $ACTORRL_KEYS_DIR (``~`` expanded), else no keys."""
    proc = _run_fake_remote(tmp_path, ["--stop-reward", "none"], 1, keys=keys, env=env)
    assert proc.returncode == 0, proc.stderr
    calls, _ = _fake_calls(proc.stdout)
    assert calls[0] == f"FAKE client tcp://10.0.0.1:7000 {expected}", proc.stdout


def test_address_job_that_ends_by_itself(tmp_path: Path) -> None:
    """When the job meets its own stop criteria first, the command reports the job's stop
    reason and final checkpoint and does not stop it again."""
    proc = _run_fake_remote(tmp_path, ["--stop-reward", "none"], 3)
    assert proc.returncode == 0, proc.stderr
    assert "FAKE job stopped" not in proc.stdout and "FAKE checkpoint" not in proc.stdout
    [run] = run_dirs(tmp_path / "results")
    assert len(read_jsonl(run / "result.jsonl")) == 3
    status = json.loads((run / "run.json").read_text())
    assert status["stop_reason"] == "time_total_s >= 3"
    assert "checkpoint_000003" in status["last_checkpoint"]


def test_address_without_a_client_module_is_a_clear_error(tmp_path: Path) -> None:
    """When actorrl.cluster.client cannot be imported, --address exits 2 saying so."""
    code = ("import sys; sys.modules['actorrl.cluster.client'] = None\n"
            "from actorrl.cli.main import main; sys.exit(main(sys.argv[1:]))")
    output = tmp_path / "results"
    proc = run_cli(["train", "apex", "--address", "tcp://127.0.0.1:1", "--output",
                    str(output)], cwd=tmp_path, python=[sys.executable, "-c", code])
    assert proc.returncode == 2
    assert "--address needs the cluster client (actorrl.cluster.client)" in proc.stderr
    assert not run_dirs(output)


def test_cluster_commands_are_registered_when_present(tmp_path: Path) -> None:
    """cli.py adds the subcommands of actorrl.cli.cluster.register(subparsers)."""
    code = r'''
import sys, types
module = types.ModuleType("actorrl.cli.cluster")
def register(subparsers):
    p = subparsers.add_parser("jobs", help="list jobs (fake)")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=lambda args: 7 if args.all else 0)
module.register = register
sys.modules["actorrl.cli.cluster"] = module
from actorrl.cli.main import main
sys.exit(main(sys.argv[1:]))
'''
    proc = run_cli(["jobs", "--all"], cwd=tmp_path, python=[sys.executable, "-c", code])
    assert proc.returncode == 7, proc.stderr
    listing = run_cli(["--help"], cwd=tmp_path, python=[sys.executable, "-c", code])
    assert "jobs" in listing.stdout and "train" in listing.stdout
