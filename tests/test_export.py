"""Trained policies outside training: ``actorrl.load_policy`` in plain Python, ``actorrl
export`` to ONNX (run with onnxruntime), TorchScript (torch.jit.load) and safetensors
(loaded into the documented model with plain torch), each checked against the torch
policy; checkpoints carry their format version, and a checkpoint written by actorrl 0.2
(format 1, kept in tests/data) is migrated and acts as it did then."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import actorrl
from actorrl.algorithms import checkpoints as ckpt
from actorrl.experiment.errors import UsageError
from tests.helpers.cluster import run_cli, run_dirs
from tests.helpers.extras import installed

V1_CHECKPOINT = Path(__file__).resolve().parent / "data" / "checkpoint_v1_ppo_cartpole"
"""A CartPole PPO checkpoint written by actorrl 0.2.0 (format 1; MeanStdFilter; a 16x16
MLP), with ``expected.json``: 8 observations, their filtered rows, greedy actions, logits
and values as 0.2.0 computed them (the command that made it is in the file)."""
RUN_TIMEOUT_S = 240.0
TINY = ["--env", "CartPole-v1", "--num-workers", "1", "--stop-reward", "none",
        "--checkpoint-every", "0", "--progress", "plain"]

needs_onnx = pytest.mark.skipif(
    not (installed("onnx") and installed("onnxscript") and installed("onnxruntime")),
    reason='the onnx extra is not installed (pip install -e ".[onnx]")')
needs_safetensors = pytest.mark.skipif(
    not installed("safetensors"),
    reason='the safetensors extra is not installed (pip install -e ".[safetensors]")')


@pytest.fixture
def v1_checkpoint(tmp_path: Path) -> Path:
    """A copy of the format-1 checkpoint (exports write next to it by default)."""
    return Path(shutil.copytree(V1_CHECKPOINT, tmp_path / "checkpoint_000008"))


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((V1_CHECKPOINT / "expected.json").read_text())


def _random_observations(count: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((count, 4)) * [1.0, 1.5, 0.15, 1.5]).astype(np.float32)


# ---- checkpoint formats ---------------------------------------------------------------------
@pytest.mark.unit
def test_a_format_1_checkpoint_is_migrated_and_acts_as_it_did(expected: dict) -> None:
    """The 0.2 checkpoint reads as the current format (its versions filled in) and its
    policy, through load_policy, filters and acts exactly as 0.2 computed."""
    folder, state = ckpt.read_checkpoint(V1_CHECKPOINT)
    assert json.loads((folder / ckpt.METADATA_FILE).read_text())["format_version"] == 1
    assert state["format_version"] == ckpt.FORMAT_VERSION == 2
    assert state["migrated_from_format"] == 1 and state["actorrl_version"] == "0.2"
    policy = actorrl.load_policy(V1_CHECKPOINT)
    assert (policy.algorithm, policy.env, policy.is_recurrent) == ("ppo", "CartPole-v1", False)
    rows = [policy.preprocess(np.array(o, np.float32)) for o in expected["observations"]]
    np.testing.assert_allclose(rows, expected["filtered"], rtol=1e-6, atol=1e-6)
    actions = [policy.compute_action(np.array(o, np.float32))
               for o in expected["observations"]]
    assert actions == expected["actions"] and all(type(a) is int for a in actions)
    _, extras = policy.torch_policy.compute_actions(np.asarray(rows), explore=False)
    np.testing.assert_allclose(extras["action_dist_inputs"], expected["action_dist_inputs"],
                               rtol=1e-5, atol=1e-6)


def test_a_format_1_checkpoint_restores_and_training_continues_in_format_2(tmp_path: Path
                                                                         ) -> None:
    """--restore of the 0.2 checkpoint: counters continue from its 3,200 env steps and
    the new checkpoint is format 2."""
    output = tmp_path / "results"
    proc = run_cli(["train", "--restore", str(V1_CHECKPOINT), "--stop-timesteps", "4000",
                    "--checkpoint-every", "0", "--output", str(output), "--progress",
                    "plain"], cwd=tmp_path, timeout_s=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    [run] = run_dirs(output)
    results = [json.loads(line) for line in (run / "result.jsonl").read_text().splitlines()]
    assert results[0]["training_iteration"] == 9 and results[0]["timesteps_total"] > 3200
    [checkpoint] = sorted((run / "checkpoints").iterdir())
    metadata = json.loads((checkpoint / ckpt.METADATA_FILE).read_text())
    assert metadata["format_version"] == 2 and metadata["actorrl_version"] == actorrl.__version__
    _, state = ckpt.read_checkpoint(checkpoint)
    assert state["format_version"] == 2 and "migrated_from_format" not in state


@pytest.mark.unit
def test_a_checkpoint_of_a_newer_format_is_refused_naming_both(tmp_path: Path) -> None:
    """A state file from a future actorrl: refused with both versions and the fix."""
    data = bytearray((V1_CHECKPOINT / ckpt.STATE_FILE).read_bytes())
    struct.pack_into("<I", data, 8, ckpt.FORMAT_VERSION + 1)  # the index's version field
    folder = tmp_path / "checkpoint_000001"
    folder.mkdir()
    (folder / ckpt.STATE_FILE).write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match=r"has checkpoint format 3, written by a "
                       r"newer actorrl; this actorrl \S+ reads formats 1 to 2: upgrade"):
        ckpt.read_checkpoint(folder)
    with pytest.raises(UsageError, match="upgrade actorrl"):
        actorrl.load_policy(folder)


@pytest.mark.unit
def test_explore_samples_and_a_state_is_refused_by_a_feed_forward_policy() -> None:
    policy = actorrl.load_policy(V1_CHECKPOINT)
    obs = np.zeros(4, np.float32)
    assert {policy.compute_action(obs, explore=True) for _ in range(200)} == {0, 1}
    with pytest.raises(ValueError, match="not recurrent"):
        policy.compute_action(obs, [np.zeros(4)])


# ---- exports of the feed-forward checkpoint ---------------------------------------------------
@needs_onnx
@pytest.mark.unit
def test_onnx_export_runs_in_onnxruntime_as_the_torch_policy(v1_checkpoint: Path) -> None:
    """Raw observations in (the filter is in the graph), the greedy actions and logits of
    the torch policy out, for any batch size."""
    import onnx
    import onnxruntime

    from actorrl.experiment.export import export_policy

    out = export_policy(v1_checkpoint, "onnx")
    assert out == v1_checkpoint / "policy.onnx"
    meta = {p.key: json.loads(p.value) for p in onnx.load(str(out)).metadata_props}
    assert meta["algorithm"] == "ppo" and meta["observation_filter"]["name"] == "MeanStdFilter"
    session = onnxruntime.InferenceSession(str(out))
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["action", "action_dist_inputs"]
    policy = actorrl.load_policy(v1_checkpoint)
    for batch in (1, 64):
        obs = _random_observations(batch)
        actions, logits = session.run(None, {"obs": obs})
        _, extras = policy.torch_policy.compute_actions(
            np.stack([policy.preprocess(o) for o in obs]), explore=False)
        np.testing.assert_allclose(logits, extras["action_dist_inputs"], rtol=1e-4,
                                   atol=1e-5)
        assert actions.tolist() == [policy.compute_action(o) for o in obs]


@pytest.mark.unit
def test_torchscript_export_loads_with_plain_torch(v1_checkpoint: Path, tmp_path: Path
                                                   ) -> None:
    import torch

    from actorrl.experiment.export import export_policy

    out = export_policy(v1_checkpoint, "torchscript", tmp_path / "p.pt")
    files = {"actorrl.json": ""}
    module = torch.jit.load(str(out), _extra_files=files)
    assert json.loads(files["actorrl.json"])["outputs"] == ["action", "action_dist_inputs"]
    policy = actorrl.load_policy(v1_checkpoint)
    obs = _random_observations(32, seed=2)
    actions, logits = module(torch.as_tensor(obs))
    assert actions.tolist() == [policy.compute_action(o) for o in obs]
    _, extras = policy.torch_policy.compute_actions(
        np.stack([policy.preprocess(o) for o in obs]), explore=False)
    np.testing.assert_allclose(logits.numpy(), extras["action_dist_inputs"], rtol=1e-4,
                               atol=1e-5)


DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "tracking-and-export.md"


def documented_safetensors_code() -> str:
    """The plain-torch code of the docs' safetensors section, as the page shows it."""
    text = DOCS_PAGE.read_text()
    section = text[text.index("### safetensors"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@needs_safetensors
@pytest.mark.unit
def test_safetensors_weights_load_into_the_documented_model(v1_checkpoint: Path,
                                                            expected: dict) -> None:
    """The weights load (strict) into the plain-torch model of the docs; with the filter
    from the file's metadata it computes 0.2's logits and values."""
    import torch
    from safetensors import safe_open

    from actorrl.experiment.export import export_policy

    out = export_policy(v1_checkpoint, "safetensors")
    with safe_open(str(out), "pt") as f:
        meta = json.loads(f.metadata()["actorrl"])
    assert meta["model"]["fcnet_hiddens"] == [16, 16] and meta["action_space"] == "Discrete(2)"
    code = documented_safetensors_code()
    assert code.count('"policy.safetensors"') == 2
    namespace: dict = {}
    exec(code.replace('"policy.safetensors"', repr(str(out))), namespace)  # the docs' code
    model, stats = namespace["model"], namespace["stats"]
    obs = torch.tensor(expected["observations"])
    x = ((obs - torch.tensor(stats["mean"])) / (torch.tensor(stats["std"]) + 1e-8)).clamp(
        -stats["clip"], stats["clip"]).float()
    with torch.no_grad():
        logits, values = model(x)
    np.testing.assert_allclose(logits.numpy(), expected["action_dist_inputs"], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(values.numpy(), expected["vf_preds"], rtol=1e-5, atol=1e-5)
    assert logits.argmax(-1).tolist() == expected["actions"]


@pytest.mark.unit
def test_a_policy_export_does_not_know_is_refused_naming_what_it_exports() -> None:
    from types import SimpleNamespace

    from actorrl.experiment.export import policy_kind

    class OtherPolicy:
        pass

    other = SimpleNamespace(torch_policy=OtherPolicy(), algorithm="ddpg")
    with pytest.raises(UsageError, match=r"does not know ddpg's policy \(OtherPolicy\): it "
                                         r"exports actor-critic policies.*load_policy"):
        policy_kind(other)  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_missing_extra_names_the_pip_command(v1_checkpoint: Path, monkeypatch) -> None:
    import importlib.util

    from actorrl.experiment.export import export_policy

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] in ("onnx", "safetensors")
                        else real(name, *a))
    with pytest.raises(UsageError, match=r'--format onnx needs the \'onnx\' extra.*pip '
                                         r'install -e "\.\[onnx\]"'):
        export_policy(v1_checkpoint, "onnx")
    with pytest.raises(UsageError, match=r'pip install -e "\.\[safetensors\]"'):
        export_policy(v1_checkpoint, "safetensors")


# ---- recurrent, Q-learning and continuous policies, through the CLI --------------------------
def SHARES_THE_RUNS(test):  # noqa: N802 (used as a mark)
    """For the tests that read the module's tiny runs: under ``--dist loadgroup`` they run
    in one pytest-xdist worker, so the runs are trained once; the first one's timeout
    covers training all of them (~100 s on 2 busy cores)."""
    return pytest.mark.timeout(600)(pytest.mark.xdist_group("test_export-trained")(test))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny runs, one results folder each: IMPALA LSTM (previous action and reward as
    inputs, MeanStdFilter), Ape-X, PPO, SAC and DDPG on Pendulum (continuous actions), A2C on a
    Dict observation with MultiDiscrete actions, and PPO with action masks (``masked``)."""
    base = tmp_path_factory.mktemp("export-runs")
    lstm_model = json.dumps({"use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [8],
                             "lstm_use_prev_action": True, "lstm_use_prev_reward": True,
                             "max_seq_len": 10})
    runs = {"impala": ["--set", f"model={lstm_model}", "--set",
                       "observation_filter=MeanStdFilter", "--stop-timesteps", "600"],
            "apex": ["--set", "learning_starts=200", "--set", "train_batch_size=32",
                     "--set", 'model={"fcnet_hiddens":[16]}', "--set", "hiddens=[16]",
                     "--stop-timesteps", "600"],
            "ppo": ["--env", "Pendulum-v1", "--set", "train_batch_size=400", "--set",
                    'model={"fcnet_hiddens":[16]}', "--stop-timesteps", "400"],
            "sac": ["--env", "Pendulum-v1", "--set", "learning_starts=200",
                    "--stop-timesteps", "400"],
            "ddpg": ["--env", "Pendulum-v1", "--set", "learning_starts=200",
                     "--stop-timesteps", "400"],
            "a2c": ["--env", "tests.actors.space_envs:make", "--set",
                    'env_config={"obs": "dict", "actions": "multidiscrete"}',
                    "--stop-timesteps", "400"],
            "masked": ["--env", "actorrl.envs.custom.masked:pick_best", "--set",
                       "train_batch_size=400", "--stop-timesteps", "400"]}
    folders = {}
    for name, args in runs.items():
        output = base / name
        algo = "ppo" if name == "masked" else name
        proc = run_cli(["train", algo, *TINY, *args, "--output", str(output)], cwd=base,
                       timeout_s=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        [folders[name]] = run_dirs(output)
    return folders


def _episode(policy, steps: int = 25) -> list[tuple[np.ndarray, int, float, list]]:
    """(obs, action, reward, state after) per step of one greedy CartPole episode."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    state, action, reward, rows = None, None, None, []
    for _ in range(steps):
        action, state = policy.compute_action(obs, state, prev_action=action,
                                              prev_reward=reward)
        rows.append((obs, action, 0.0 if reward is None else reward, state))
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    env.close()
    return rows


@SHARES_THE_RUNS
def test_a_recurrent_policy_takes_its_state_in_and_gives_it_out(trained: dict) -> None:
    policy = actorrl.load_policy(trained["impala"])
    assert policy.is_recurrent and len(policy.get_initial_state()) == 4
    rows = _episode(policy)
    assert len(rows) > 5 and not np.allclose(rows[0][3][0], rows[-1][3][0])
    with pytest.raises(ValueError, match="lstm_use_prev_action.*pass prev_action="):
        policy.compute_action(rows[0][0], rows[0][3])
    # The same steps again from the returned states: the same actions.
    state, previous, reward = None, None, None
    for obs, action, _, _ in rows:
        again, state = policy.compute_action(obs, state, prev_action=previous,
                                             prev_reward=reward)
        assert again == action
        previous, reward = action, 1.0


@SHARES_THE_RUNS
@needs_onnx
def test_recurrent_onnx_and_torchscript_carry_the_state_as_the_torch_policy(
        trained: dict, tmp_path: Path) -> None:
    """Step by step through an episode of the torch policy: the exported graphs, fed their
    own state out, pick the same actions and reach the same states."""
    import onnxruntime
    import torch

    from actorrl.experiment.export import export_policy

    policy = actorrl.load_policy(trained["impala"])
    rows = _episode(policy)
    session = onnxruntime.InferenceSession(str(export_policy(trained["impala"], "onnx",
                                                             tmp_path / "r.onnx")))
    names = [i.name for i in session.get_inputs()]
    assert names == ["obs", "state_in_0", "state_in_1", "state_in_2", "state_in_3",
                     "prev_actions", "prev_rewards"]
    scripted = torch.jit.load(str(export_policy(trained["impala"], "torchscript",
                                                tmp_path / "r.pt")))
    state = [np.zeros((1, 8), np.float32) for _ in range(4)]
    script_state = [torch.as_tensor(s) for s in state]
    prev_action, prev_reward = np.zeros(1, np.int64), np.zeros(1, np.float32)
    for obs, action, reward, state_after in rows:
        prev_reward[:] = reward
        inputs = [obs[None].astype(np.float32), *state, prev_action, prev_reward]
        out = session.run(None, dict(zip(names, inputs)))
        scripted_out = scripted(*[torch.as_tensor(x) for x in inputs[:1]], *script_state,
                                torch.as_tensor(prev_action), torch.as_tensor(prev_reward))
        assert int(out[0][0]) == action == int(scripted_out[0][0])
        state, script_state = out[2:], list(scripted_out[2:])
        for mine, theirs, ref in zip(state, script_state, state_after):
            np.testing.assert_allclose(mine[0], ref, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(theirs[0].numpy(), ref, rtol=1e-4, atol=1e-5)
        prev_action = np.array([action], np.int64)


@SHARES_THE_RUNS
@needs_onnx
def test_a_q_policy_exports_its_q_values(trained: dict, tmp_path: Path) -> None:
    """Ape-X: the graph's outputs are the Q-values and their argmax, as the torch policy."""
    import onnxruntime

    policy = actorrl.load_policy(trained["apex"])
    out = tmp_path / "q.onnx"
    proc = run_cli(["export", str(trained["apex"]), "--format", "onnx", "-o", str(out)],
                   cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out}"
    session = onnxruntime.InferenceSession(str(out))
    assert [o.name for o in session.get_outputs()] == ["action", "q_values"]
    obs = _random_observations(16, seed=4)
    actions, q_values = session.run(None, {"obs": obs})
    import torch

    with torch.no_grad():
        reference = policy.torch_policy.model(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(q_values, reference, rtol=1e-4, atol=1e-5)
    assert actions.tolist() == [policy.compute_action(o) for o in obs]


@SHARES_THE_RUNS
def test_export_cli_writes_next_to_the_checkpoint_and_refuses_bad_input(
        trained: dict, tmp_path: Path) -> None:
    proc = run_cli(["export", str(trained["apex"]), "--format", "torchscript"], cwd=tmp_path,
                   timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    [checkpoint] = sorted((trained["apex"] / "checkpoints").iterdir())
    assert proc.stdout.strip() == f"wrote {checkpoint / 'policy.pt'}"
    assert (checkpoint / "policy.pt").is_file()
    for args, message in (
            ([str(tmp_path / "none"), "--format", "onnx"], "does not exist"),
            ([str(trained["apex"]), "--format", "pickle"], "invalid choice: 'pickle'"),
            ([str(trained["apex"]), "--format", "torchscript", "-o",
              str(tmp_path / "no" / "p.pt")], "folder")):
        proc = run_cli(["export", *args], cwd=tmp_path, timeout_s=60)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


@SHARES_THE_RUNS
@needs_onnx
@pytest.mark.parametrize("algo", ["ppo", "sac", "ddpg"])
def test_a_continuous_policy_exports_the_env_action(trained: dict, tmp_path: Path,
                                                    algo: str) -> None:
    """Pendulum (normalize_actions): the greedy action in [-1, 1] (PPO's Gaussian mean,
    SAC's tanh of its mean, DDPG's actor) mapped onto the action bounds, in the graph as
    in load_policy."""
    import onnxruntime

    from actorrl.experiment.export import export_policy

    policy = actorrl.load_policy(trained[algo])
    assert policy.action_options["normalize"]
    session = onnxruntime.InferenceSession(str(export_policy(trained[algo], "onnx",
                                                             tmp_path / "c.onnx")))
    obs = np.stack([policy.observation_space.sample() for _ in range(32)]).astype(np.float32)
    actions, outputs = session.run(None, {"obs": obs})
    assert actions.shape == (32, 1) and outputs.shape == (32, 1 if algo == "ddpg" else 2)
    np.testing.assert_allclose(actions, np.stack([policy.compute_action(o) for o in obs]),
                               rtol=1e-5, atol=1e-5)
    mean = outputs[:, :1].astype(np.float64)
    normalized = np.tanh(mean) if algo == "sac" else mean
    np.testing.assert_allclose(actions, np.clip(-2.0 + (normalized + 1.0) * 2.0, -2.0, 2.0),
                               rtol=1e-5, atol=1e-5)


@SHARES_THE_RUNS
@needs_onnx
def test_a_structured_observation_policy_exports_on_flattened_rows(trained: dict,
                                                                   tmp_path: Path) -> None:
    """Dict observations, MultiDiscrete actions: the graph takes the rows preprocess()
    gives (the workers' flattening) and returns each component's argmax."""
    import onnxruntime

    from actorrl.experiment.export import export_policy

    policy = actorrl.load_policy(trained["a2c"])
    assert type(policy.observation_space).__name__ == "Dict"
    session = onnxruntime.InferenceSession(str(export_policy(trained["a2c"], "onnx",
                                                             tmp_path / "d.onnx")))
    raw = [policy.observation_space.sample() for _ in range(16)]
    rows = np.stack([policy.preprocess(o) for o in raw]).astype(np.float32)
    actions, _ = session.run(None, {"obs": rows})
    assert actions.shape == (16, 2)
    np.testing.assert_array_equal(actions, np.stack([policy.compute_action(o) for o in raw]))


@SHARES_THE_RUNS
@needs_onnx
def test_an_action_masked_policy_exports_its_mask(trained: dict, tmp_path: Path) -> None:
    """RLlib's action_mask / observations Dict: the graph masks the logits as the model
    does, so its greedy actions are legal ones, the torch policy's."""
    import onnxruntime

    from actorrl.experiment.export import export_policy

    policy = actorrl.load_policy(trained["masked"])
    session = onnxruntime.InferenceSession(str(export_policy(trained["masked"], "onnx",
                                                             tmp_path / "m.onnx")))
    rng = np.random.default_rng(5)
    raw = []
    for _ in range(64):
        obs = policy.observation_space.sample()
        obs["action_mask"][:] = 0
        obs["action_mask"][rng.choice(6, size=2, replace=False)] = 1
        raw.append(obs)
    rows = np.stack([policy.preprocess(o) for o in raw]).astype(np.float32)
    actions, _ = session.run(None, {"obs": rows})
    assert all(o["action_mask"][a] == 1 for o, a in zip(raw, actions))
    assert actions.tolist() == [policy.compute_action(o) for o in raw]
