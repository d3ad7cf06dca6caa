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
