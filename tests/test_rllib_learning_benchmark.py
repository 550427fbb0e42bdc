"""benchmarks/rllib_learning.py's pure parts: the bar an RLlib file sets (its ``stop`` or a
release test's ``pass_criteria``), which files are not run and why, and the outcome read
from a run's results."""

from __future__ import annotations

import json

import pytest

from tests.helpers.benchmark_scripts import load_benchmark, unload_benchmark


@pytest.fixture(scope="module")
def bench():
    module = load_benchmark("rllib_learning")
    yield module
    unload_benchmark(module)


def result(steps: int, reward: float | None, *, time_s: float = 1.0, iteration: int = 1,
           **learner: float) -> dict:
    return {"timesteps_total": steps, "episode_reward_mean": reward, "time_total_s": time_s,
            "training_iteration": iteration, "info": {"learner": learner}}


def test_bar_reads_rllib_2x_stop_keys_and_the_budget(bench) -> None:
    """A tuned file's stop: RLlib 2.x result paths read as actorrl's keys, the env-step
    budget beside the reward."""
    bar = bench.bar_of({"stop": {"sampler_results/episode_reward_mean": 150,
                                 "timesteps_total": 100000}})
    assert bar["key"] == "episode_reward_mean" and bar["reward"] == 150.0
    assert bar["timesteps"] == 100000 and bar["source"] == "stop"
    bar = bench.bar_of({"stop": {"env_runners/episode_return_mean": -500,
                                 "training_iteration": 400}})
    assert bar["reward"] == -500.0 and bar["timesteps"] is None and bar["iterations"] == 400


def test_bar_of_a_release_test_is_its_pass_criteria(bench) -> None:
    """pass_criteria's reward within its timesteps_total is the bar; the stop's time_total_s
    (RLlib's cluster hour) is kept as the time budget."""
    bar = bench.bar_of({"pass_criteria": {"sampler_results/episode_reward_mean": 20.0,
                                          "timesteps_total": 400000},
                        "stop": {"time_total_s": 7200}})
    assert (bar["source"], bar["reward"], bar["timesteps"], bar["time_s"]) == (
        "pass_criteria", 20.0, 400000, 7200)
    assert bench.bar_of({"pass_criteria": {"evaluation/episode_reward_mean": 400.0}}
                        )["key"] == "evaluation.episode_reward_mean"


def test_files_without_a_reward_or_of_a_missing_algorithm_are_not_run(bench) -> None:
    algorithms = {"PPO", "IMPALA"}
    assert bench.classify({"run": "PPO", "stop": {"timesteps_total": 400000}},
                          algorithms).startswith("no reward bar")
    assert bench.classify({"run": "IMPALA"}, algorithms).startswith("no reward bar")
    assert bench.classify({"run": "TD3", "stop": {"episode_reward_mean": 1}},
                          algorithms) == "algorithm missing: actorrl has no TD3"
    assert bench.classify({"run": "ppo", "stop": {"episode_reward_mean": 1}},
                          algorithms) is None


def test_budgets_beyond_two_cores_are_found_before_running(bench) -> None:
    """Atari: more env steps than 2 cores step in the time even without learning; MuJoCo or
    Atari without an env-step budget and a time budget over the limit; classic control is
    always tried (its cap decides)."""
    hour = 3600.0
    atari = {"reward": 18.0, "timesteps": 20_000_000, "time_s": None}
    reason = bench.budget_reason("ALE/Pong-v5", atari, hour, 30)
    assert reason.startswith("budget beyond") and "20,000,000 env steps" in reason
    assert bench.budget_reason("PongNoFrameskip-v4", {**atari, "timesteps": 400_000},
                               hour, 2) is None
    cheetah = {"reward": 9800.0, "timesteps": None, "time_s": 10800}
    assert "within 10,800 s on 16 workers" in bench.budget_reason("HalfCheetah-v2", cheetah,
                                                                   hour, 16)
    assert bench.budget_reason("HalfCheetah-v4", {**cheetah, "time_s": 1800}, hour, 1) is None
    assert bench.budget_reason("CartPole-v1", {**atari, "timesteps": None}, hour, 2) is None


def test_passed_at_the_first_result_over_the_bar(bench) -> None:
    bar = {"key": "episode_reward_mean", "reward": 150.0, "timesteps": 100000}
    rows = [result(4000, None), result(8000, 90.0, time_s=2.0),
            result(12000, 151.0, time_s=3.5), result(16000, 170.0, time_s=5.0)]
    out = bench.outcome_of(rows, bar)
    assert (out["outcome"], out["reward"], out["env_steps"], out["seconds"]) == (
        "passed", 151.0, 12000, 3.5)


def test_failed_names_the_best_reward_and_the_learner_then(bench) -> None:
    """Not reached: the best reward and its env steps, the learner's stats at the best and
    last iterations (per policy for multi-agent), and whether the budget was spent."""
    bar = {"key": "episode_reward_mean", "reward": -200.0, "timesteps": 30000,
           "iterations": None, "time_s": None}
    rows = [result(10000, -1200.0, entropy=1.4, kl=0.01),
            result(20000, -350.0, entropy=0.9, kl=0.02),
            result(30000, -600.0, entropy=11.5, kl=0.01, vf_loss=3.0)]
    out = bench.outcome_of(rows, bar)
    assert out["outcome"] == "failed" and out["budget_spent"] is True
    assert (out["best_reward"], out["best_at_env_steps"], out["last_reward"]) == (
        -350.0, 20000, -600.0)
    assert out["learner_at_best"] == {"entropy": 0.9, "kl": 0.02}
    assert out["learner_at_last"] == {"entropy": 11.5, "kl": 0.01, "vf_loss": 3.0}
    multi = result(5000, 10.0)
    multi["info"]["learner"] = {"p0": {"entropy": 0.5}, "p1": {"kl": 0.25}}
    assert bench.learner_stats(multi) == {"p0.entropy": 0.5, "p1.kl": 0.25}
    capped = bench.outcome_of(rows[:2], bar)
    assert capped["budget_spent"] is False  # the cap stopped it at 20,000 of 30,000


def test_iteration_and_time_budgets_count_as_spent(bench) -> None:
    bar = {"key": "episode_reward_mean", "reward": 200.0, "timesteps": None,
           "iterations": 400, "time_s": None}
    assert bench.outcome_of([result(1000, 20.0, iteration=400)], bar)["budget_spent"]
    bar = {**bar, "iterations": None, "time_s": 180}
    assert bench.outcome_of([result(1000, 20.0, time_s=181.0)], bar)["budget_spent"]
    assert not bench.outcome_of([result(1000, 20.0, time_s=90.0)], bar)["budget_spent"]


def test_the_written_file_is_the_first_trial_with_the_bar_as_stop(bench) -> None:
    """A sweep runs its first trial (the count of trials is reported); a release test's
    pass_criteria becomes the stop actorrl train reads."""
    experiment = {"run": "PPO", "env": "CartPole-v0", "num_samples": 3,
                  "stop": {"episode_reward_mean": 200, "time_total_s": 180},
                  "config": {"num_sgd_iter": {"grid_search": [1, 4]},
                             "sgd_minibatch_size": {"grid_search": [128, 256, 512]}}}
    data, trials = bench.first_trial(experiment)
    assert trials == 18 and "num_samples" not in data
    assert data["config"] == {"num_sgd_iter": 1, "sgd_minibatch_size": 128}
    release = {"run": "DQN", "env": "ALE/Breakout-v5", "stop": {"time_total_s": 7200},
               "pass_criteria": {"sampler_results/episode_reward_mean": 20.0,
                                 "timesteps_total": 400000}, "config": {"lr": 1e-4}}
    written = bench.runnable_file(release, bench.bar_of(release))
    assert "pass_criteria" not in written
    assert written["stop"] == {"episode_reward_mean": 20.0, "timesteps_total": 400000}


def test_a_files_origin_and_its_env_as_run(bench) -> None:
    commit = "ce401bbbf12a123d1121f655527bc67aeddb3610"
    assert bench.origin(f"{commit}/rllib/tuned_examples/ppo/cartpole-ppo.yaml", {}) == (
        "rllib/tuned_examples/ppo/cartpole-ppo.yaml", commit)
    assert bench.origin("ppo/x.yaml", {"ppo/x.yaml": "abc"}) == ("ppo/x.yaml", "abc")
    assert bench.env_run("Pendulum-v0") == "Pendulum-v1"
    assert bench.env_run("HalfCheetah-v2") == "HalfCheetah-v5"
    assert bench.env_run("CartPole-v0") is None
    assert bench.is_heavy("ale_py:ALE/Breakout-v5") and bench.is_heavy("Hopper-v1")
    assert not bench.is_heavy("Pendulum-v1")


def test_the_docs_table_counts_outcomes_by_env_family(bench) -> None:
    records = [{"env": "CartPole-v0", "outcome": "passed"},
               {"env": "ray.rllib.examples.env.multi_agent.MultiAgentCartPole",
                "outcome": "failed"},
               {"env": "Pendulum-v1", "outcome": "not run"},
               {"env": "ale_py:ALE/Breakout-v5", "outcome": "not run"}]
    assert [bench.family(r["env"]) for r in records] == [
        "CartPole", "multi-agent CartPole", "Pendulum", "Atari"]
    assert bench.family({"grid_search": ["BreakoutNoFrameskip-v4", "QbertNoFrameskip-v4"]}
                        ) == "Atari"
    assert bench.family("HalfCheetahBulletEnv-v0") == "PyBullet"
    assert bench.family("HalfCheetah-v2") == "MuJoCo"
    table = bench.markdown_table({"results": records, "experiments": 4, "passed": 1,
                                  "failed": 1, "not run": 2}).splitlines()
    assert table[2:] == ["| multi-agent CartPole | 1 | 0 | 1 | 0 |",
                         "| CartPole | 1 | 1 | 0 | 0 |", "| Pendulum | 1 | 0 | 0 | 1 |",
                         "| Atari | 1 | 0 | 0 | 1 |", "| **all** | 4 | **1** | 1 | 2 |"]


def test_versions_differing_only_in_what_actorrl_ignores_run_once(bench) -> None:
    """framework, API-stack switches and RLlib's renamed keys (num_sgd_iter / num_epochs,
    stop paths) do not make another experiment; a changed value or env does."""
    old = {"run": "PPO", "env": "Pendulum-v0", "stop": {"episode_reward_mean": -500},
           "config": {"framework": "tf", "num_sgd_iter": 6, "num_workers": 0}}
    new = {"run": "PPO", "env": "Pendulum-v1",
           "stop": {"env_runners/episode_return_mean": -500},
           "config": {"framework": "torch", "num_epochs": 6, "num_env_runners": 0,
                      "enable_connectors": True, "_enable_rl_module_api": True}}
    assert bench.canonical(old) == bench.canonical(new)
    assert bench.canonical(old) != bench.canonical(
        {**old, "config": {**old["config"], "lr": 1e-3}})
    assert bench.canonical(old) != bench.canonical({**old, "env": "CartPole-v0"})


def test_a_probes_pace_is_its_last_iterations(bench) -> None:
    """Replay algorithms sample fast before learning starts: the pace is the last
    iteration's, the whole run's only when one iteration finished."""
    rows = [result(10000, None, time_s=20.0), result(11000, None, time_s=40.0)]
    assert bench.probe_pace(rows) == 50.0
    assert bench.probe_pace(rows[:1]) == 500.0
    assert bench.probe_pace([]) is None


def test_experiment_globs_keep_one_test_of_a_file_that_holds_many(bench, tmp_path, capsys
                                                                  ) -> None:
    """``--experiment`` selects by experiment name inside the files ``--only`` kept (the
    release tests' hard_learning_tests.yaml holds a dozen); ES is not an actorrl
    algorithm, so nothing trains here."""
    tests = tmp_path / "release" / "rllib_tests" / "learning_tests"
    tests.mkdir(parents=True)
    tests.joinpath("hard_learning_tests.yaml").write_text(
        "".join(f"{name}:\n  env: CartPole-v1\n  run: ES\n"
                "  pass_criteria: {episode_reward_mean: 150, timesteps_total: 1000}\n"
                for name in ("dqn-breakout-v4", "es-humanoid", "dqn-pong-v4")))
    bench.main([str(tmp_path), "--only", "*learning_tests.yaml", "--experiment", "dqn-*",
                "--experiment", "nothing"])
    printed = json.loads(capsys.readouterr().out)
    assert [r["experiment"] for r in printed["results"]] == ["dqn-breakout-v4", "dqn-pong-v4"]
    assert {r["outcome"] for r in printed["results"]} == {"not run"}
