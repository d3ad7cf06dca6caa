"""No stage but evaluation plays a held-out task (issues 28 and 30).

Every τ² episode started in this process is recorded (task id and split) by a
thin wrapper around the real ``Tau2Env._start``; each stage below then runs for
real, and the test fails if any of its tasks is in the test split evaluation
scores. Found this way: the synthesis prompt's live tool results came from the
target's default split, which for τ² is ``test``.
"""

from __future__ import annotations

import pytest

from trace_gym.registry import get_entry, make

RETAIL = "trace/tau2-retail-v0"


@pytest.fixture
def started(monkeypatch):
    from trace_gym.targets.tau2 import Tau2Env

    seen: list[tuple[str, str]] = []
    real = Tau2Env._start

    def recording(self, seed, options):
        start = real(self, seed, options)
        seen.append((self.split, self._task.id))
        return start

    monkeypatch.setattr(Tau2Env, "_start", recording)
    return seen


def held_out() -> set[str]:
    env = make(RETAIL, split="test")
    try:
        return set(env.unwrapped.task_ids)
    finally:
        env.close()


def test_the_synthesis_prompt_shows_train_tasks_only(started):
    from trace_gym.synthesis.prompt import target_context

    context = target_context(get_entry(RETAIL))
    assert context.tool_results and started
    assert {split for split, _ in started} == {"train"}
    assert not {task for _, task in started} & held_out()


def test_training_on_the_target_plays_train_tasks_only(started):
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.trainer import _env_plan

    tasks, kwargs, _ = _env_plan(GRPOTrainingConfig(env_ids=[RETAIL], out="x"))
    assert kwargs[RETAIL]["split"] == "train" and not set(tasks[RETAIL]) & held_out()
    env = make(RETAIL, **kwargs[RETAIL])
    try:
        env.reset(options={"task_id": tasks[RETAIL][0]})
    finally:
        env.close()
    assert started and {split for split, _ in started} == {"train"}


def test_training_logs_the_tasks_and_seeds_it_played(monkeypatch):
    """Each iteration's log row names every group it played (draws included), so a
    run's output says which tasks and seeds it trained on."""
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc, episode_key

    def rows_of(reward):
        def play(self, env_id, keys, group_ids, backend, rows, record):
            for g in group_ids:
                for s in range(self.config.rollouts_per_group):
                    rows[g * self.config.rollouts_per_group + s] = {
                        "prompt_ids": [1],
                        "completion_ids": [2],
                        "logprobs": [0.0],
                        "env_mask": [1],
                        "env_reward": reward if s else 0.0,
                        "hinted": False,
                    }

        return play

    monkeypatch.setattr(EnvRolloutFunc, "_play_env", rows_of(1.0))
    rollout = EnvRolloutFunc(GRPOTrainingConfig(env_ids=[RETAIL], out="x", spot_check=False), pool=None, tokenizer=None)
    rollout.play([episode_key(RETAIL, task="12"), episode_key("trace/x-v0", seed=77)], backend=None)
    summary = rollout.records[-1].summary()
    assert summary["played"] == [f"{RETAIL}|task 12", "trace/x-v0|seed 77"]


def test_a_config_whose_stages_would_play_a_held_out_task_is_refused_in_one_line(tmp_path):
    """A rollout or GEPA split that holds a held-out task (the test split, or τ²'s ``base``,
    every task) and given trajectories with one are refused before any work; the train
    split and trajectories of train tasks pass."""
    from conftest import run_cli

    from trace_gym.config import ConfigError
    from trace_gym.pipeline import config_from_data

    def config(**tables):
        return config_from_data({"run": {"target": RETAIL, "dir": str(tmp_path / "run")}, **tables})

    for split in ("test", "base"):
        with pytest.raises(ConfigError, match=rf"\[rollout\] split: '{split}' holds \d+ of .* held-out 'test' tasks"):
            config(rollout={"split": split})
    with pytest.raises(ConfigError, match=r"\[gepa\] split: 'base' holds 40 of"):
        config(
            run={"target": RETAIL, "dir": str(tmp_path / "run"), "stages": ["rollout", "gepa"]},
            gepa={"split": "base", "budget": 20},
        )
    config(rollout={"split": "train"})
    config(gepa={"split": "base"})  # (no gepa stage in this run: nothing plays that split)

    mixed = tmp_path / "mixed.jsonl"
    task = sorted(held_out())[0]
    made = run_cli("rollout", "--env", RETAIL, "--agent", "oracle", "--task-ids", f"0,{task}", "--out", str(mixed),
                   "--no-progress")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConfigError, match=rf"\[rollout\] trajectories: episode .* plays task {task} of"):
        config(rollout={"trajectories": str(mixed)})
    toml = tmp_path / "run.toml"
    toml.write_text(f'[run]\ntarget = "{RETAIL}"\ndir = "{tmp_path / "run"}"\n\n[rollout]\nsplit = "base"\n')
    result = run_cli("run", str(toml), "--check")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "only evaluation plays them" in result.stderr
