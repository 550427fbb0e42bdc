"""Episode videos (the ``video`` extra): ``actorrl evaluate --video DIR`` writes one mp4 per
episode, and ``record_env`` (``monitor``) records training's evaluation episodes into the
results folder; the mp4s are read back (frame count and frame shape against the env's own
``rgb_array`` render). Without moviepy the error names the extra.

One tiny PPO run on CartPole (1 worker, 2 envs, evaluation every iteration) is shared by
the tests that need a checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from actorrl.algorithms import get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.experiment.errors import UsageError
from tests.helpers.cluster import run_cli, run_dirs
from tests.helpers.extras import installed

needs_video = pytest.mark.skipif(not installed("moviepy"),
                                 reason="the video extra (moviepy) is not installed")

RUN_TIMEOUT_S = 240.0
SHARES_THE_TRAINING = pytest.mark.xdist_group("test_videos-trained")


def render_shape(env_id: str = "CartPole-v1") -> tuple[int, ...]:
    """The shape of one ``rgb_array`` frame of the env, rendered directly."""
    env = gym.make(env_id, render_mode="rgb_array")
    try:
        env.reset(seed=0)
        return tuple(env.render().shape)
    finally:
        env.close()


def read_frames(path: Path) -> list[np.ndarray]:
    """Every frame of an mp4, decoded (imageio's ffmpeg reader, which moviepy installs)."""
    import imageio

    reader = imageio.get_reader(str(path))
    try:
        return [np.asarray(frame) for frame in reader]
    finally:
        reader.close()


def about_one_frame_per_step(frames: int, reward: float) -> bool:
    """A CartPole episode's video has its reset frame and one per step (the return):
    moviepy derives the frame count from a float duration, which may lose one."""
    return abs(frames - (int(reward) + 1)) <= 1


def ppo_config(**changes: object):
    return load_config(get_algorithm("ppo").config_cls, dict(changes))


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``actorrl train ppo`` for 1200 env steps, evaluating 2 episodes after every
    iteration with ``record_env: true``."""
    base = tmp_path_factory.mktemp("videos")
    output = base / "results"
    proc = run_cli(["train", "ppo", "--env", "CartPole-v1", "--num-workers", "1",
                    "--set", "num_envs_per_worker=2", "--set", "train_batch_size=400",
                    "--set", "min_iter_time_s=0", "--set", "evaluation_interval=1",
                    "--set", "evaluation_duration=2", "--set", "record_env=true",
                    "--seed", "1", "--stop-timesteps", "1200", "--output", str(output)],
                   cwd=base, timeout_s=RUN_TIMEOUT_S, tag=f"videos-{base.name}")
    dirs = run_dirs(output)
    return {"proc": proc, "base": base, "run": dirs[0] if dirs else None}


@needs_video
@pytest.mark.process
@SHARES_THE_TRAINING
def test_record_env_writes_the_evaluation_episodes_into_the_results_folder(recorded_run):
    """Every evaluation's episodes are in ``<run>/videos/iteration<N>-...mp4``: as many as
    the evaluation counted, each with frames of the env's render shape."""
    proc, run = recorded_run["proc"], recorded_run["run"]
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in (run / "result.jsonl").read_text().splitlines()]
    videos = sorted((run / "videos").glob("*.mp4"))
    assert videos, list(run.iterdir())
    shape = render_shape()
    for result in results:
        iteration = result["training_iteration"]
        mine = [v for v in videos if v.name.startswith(f"iteration{iteration}-")]
        assert len(mine) == result["evaluation"]["episodes_this_iter"] >= 2, \
            (iteration, [v.name for v in videos])
        assert all(v.name.startswith(f"iteration{iteration}-worker2-env") for v in mine)
    frames = read_frames(videos[0])
    assert len(frames) > 1 and frames[0].shape == shape


@needs_video
@pytest.mark.process
@SHARES_THE_TRAINING
def test_evaluate_video_writes_one_mp4_per_episode(recorded_run, tmp_path):
    """``actorrl evaluate RUN --video DIR``: ``episode-<k>.mp4`` for each episode, with one
    frame per step plus the reset's, of the env's render shape; the result lists them in
    the order of ``episode_rewards`` (CartPole pays 1 per step)."""
    assert recorded_run["proc"].returncode == 0, recorded_run["proc"].stderr
    out = tmp_path / "clips"
    proc = run_cli(["evaluate", str(recorded_run["run"]), "--episodes", "3", "--seed", "5",
                    "--video", str(out), "--json"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert sorted(p.name for p in out.iterdir()) == [f"episode-{k}.mp4" for k in range(3)]
    assert len(result["videos"]) == 3
    shape = render_shape()
    for path, reward in zip(result["videos"], result["episode_rewards"]):
        frames = read_frames(Path(path))
        assert about_one_frame_per_step(len(frames), reward), (path, len(frames), reward)
        assert all(frame.shape == shape for frame in frames)


@needs_video
@pytest.mark.unit
@SHARES_THE_TRAINING
def test_more_episodes_than_parallel_envs_are_each_recorded(recorded_run, tmp_path,
                                                           monkeypatch):
    """Envs that run several episodes each still give one file per episode, numbered by
    the episode's seed offset."""
    from actorrl.experiment import evaluate

    assert recorded_run["proc"].returncode == 0, recorded_run["proc"].stderr
    monkeypatch.setattr(evaluate, "MAX_PARALLEL_ENVS", 2)
    result = evaluate.evaluate_checkpoint(recorded_run["run"], 5, seed=3,
                                          video=tmp_path / "v")
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == \
        [f"episode-{k}.mp4" for k in range(5)]
    lengths = [len(read_frames(Path(p))) for p in result.videos]
    assert all(about_one_frame_per_step(n, r) for n, r in zip(lengths,
                                                               result.episode_rewards)), \
        (lengths, result.episode_rewards)
    again = evaluate.evaluate_checkpoint(recorded_run["run"], 1, seed=3, video=tmp_path / "w")
    assert len(read_frames(Path(again.videos[0]))) == \
        len(read_frames(tmp_path / "v" / "episode-0.mp4"))  # episode 0 is seeded 3 in both


@pytest.mark.unit
def test_without_moviepy_the_errors_name_the_video_extra(tmp_path, monkeypatch, capsys):
    """evaluate --video and record_env both refuse, naming the extra to install."""
    from actorrl.cli.main import main

    monkeypatch.setitem(sys.modules, "moviepy", None)  # import moviepy -> ImportError
    checkpoint = Path(__file__).parent / "data" / "checkpoint_v1_ppo_cartpole"
    assert main(["evaluate", str(checkpoint), "--video", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "moviepy" in err and ".[video]" in err
    assert not (tmp_path / "v").exists()
    with pytest.raises(ConfigError, match=r"record_env.*moviepy.*\.\[video\]"):
        ppo_config(record_env=True, evaluation_interval=1)


@pytest.mark.unit
def test_record_env_settings(tmp_path):
    """RLlib's semantics: true -> <results>/videos, a relative path under the results
    folder, an absolute one as given; ``evaluation_config``'s wins; ``monitor`` is the old
    spelling; recording needs evaluation_interval."""
    if not installed("moviepy"):
        pytest.skip("the video extra (moviepy) is not installed")
    assert ppo_config().video_dir(tmp_path) is None
    assert ppo_config(record_env=True, evaluation_interval=1).video_dir(tmp_path) == \
        tmp_path / "videos"
    assert ppo_config(record_env="clips", evaluation_interval=2).video_dir(tmp_path) == \
        tmp_path / "clips"
    elsewhere = tmp_path / "elsewhere"
    assert ppo_config(record_env=str(elsewhere), evaluation_interval=1).video_dir("x") == \
        elsewhere
    assert ppo_config(evaluation_interval=1,
                      evaluation_config={"record_env": "eval"}).video_dir(tmp_path) == \
        tmp_path / "eval"
    assert ppo_config(evaluation_interval=1, record_env=True,
                      evaluation_config={"record_env": False}).video_dir(tmp_path) is None
    assert ppo_config(monitor=True, evaluation_interval=1).record_env is True
    with pytest.raises(ConfigError, match="evaluation_interval is not set"):
        ppo_config(record_env=True)
    with pytest.raises(ConfigError, match="record_env"):
        ppo_config(record_env=3, evaluation_interval=1)


@pytest.mark.unit
def test_videos_of_envs_that_cannot_render_are_refused_saying_why(tmp_path):
    """A multi-agent env, or one that ignores render_mode, is refused with the reason."""
    from actorrl.envs import MultiAgentEnv
    from actorrl.envs.video import check_recordable

    with pytest.raises(ValueError, match="multi-agent.*no render"):
        check_recordable(MultiAgentEnv(), "two-player")
    env = gym.make("CartPole-v1")  # render_mode None
    with pytest.raises(ValueError, match="does not render rgb_array.*render_mode is None"):
        check_recordable(env, "CartPole-v1")
    env.close()
    with pytest.raises(UsageError, match="--video and --render human"):
        from actorrl.experiment.evaluate import evaluate_checkpoint

        evaluate_checkpoint(tmp_path, 1, render="human", video=tmp_path / "v")
