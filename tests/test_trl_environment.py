"""Registry envs for TRL's own trainer (``GRPOTrainer(environment_factory=...)``):
the tools TRL reads off the generated class are the env's own schemas, τ²'s oracle
played through those methods scores 1, and one real GRPO step of TRL's tool loop
runs over a registry env with a tiny random Qwen2.5 (its stock template)."""

from __future__ import annotations

import inspect

import pytest

from trace_gym.actions import parse_action
from trace_gym.errors import TraceGymError
from trace_gym.trl_environment import dataset, environment_factory, tool_methods

pytest.importorskip("trl")

RETAIL = "trace/tau2-retail-v0"


@pytest.fixture(scope="module")
def retail():
    return environment_factory(RETAIL)  # a target: its train split


def test_the_methods_trl_reads_are_the_envs_tools(retail):
    from transformers.utils import get_json_schema

    import gymnasium as gym

    env = gym.make(RETAIL, split="train")  # (the tools are the same in every split)
    _, info = env.reset(seed=0)
    env.close()
    methods = {n for n, _ in inspect.getmembers(retail, inspect.isfunction) if not n.startswith("_")}
    assert methods - {"reset", "get_reward"} == {t["function"]["name"] for t in info["tools"]}
    instance = retail()
    for tool in info["tools"]:
        theirs = get_json_schema(getattr(instance, tool["function"]["name"]))["function"]
        ours = tool["function"]
        assert theirs["description"] == " ".join(ours["description"].split())
        want, got = ours["parameters"], theirs.get("parameters", {"properties": {}})
        assert sorted(got.get("required", [])) == sorted(want.get("required", []))
        for name, spec in want["properties"].items():
            assert got["properties"][name]["type"] == spec["type"], (tool["function"]["name"], name)
            if spec["type"] == "array":
                assert got["properties"][name]["items"] == {"type": spec["items"]["type"]}


def test_the_oracle_played_through_the_methods_scores_one_and_a_stop_is_scored(retail):
    rows = dataset(RETAIL, range(3))
    assert all(row["task_id"] and row["prompt"][0]["role"] == "system" for row in rows)
    env = retail()
    env.reset(**rows[0])
    for action in env._env.unwrapped.oracle_actions():
        parsed = parse_action(action)
        for call in parsed.tool_calls if parsed.kind == "tool_calls" else []:
            assert not getattr(env, call.name)(**call.arguments).startswith("Error")
    assert env.get_reward() == 1.0
    env.reset(**rows[0])  # the model stops at once: τ² scores an agent that did nothing
    assert env.get_reward() == 0.0 and env._env.unwrapped.termination_reason == "agent_stop"


def test_the_rows_and_the_env_play_the_train_split_never_the_held_out_one(retail):
    from trace_gym.registry import held_out_tasks

    rows = dataset(RETAIL, range(40))
    assert rows and not {row["task_id"] for row in rows} & held_out_tasks(RETAIL)
    assert retail()._env.unwrapped.task_ids and not set(retail()._env.unwrapped.task_ids) & held_out_tasks(RETAIL)
    for make_held_out in (
        lambda: dataset(RETAIL, range(1), split="test"),
        lambda: environment_factory(RETAIL, split="test"),
    ):
        with pytest.raises(TraceGymError, match="split='test' is the held-out split"):
            make_held_out()


@pytest.mark.parametrize("name", ["look-up", "reset", "get_reward"])
def test_a_tool_that_cannot_be_a_method_is_refused(name):
    good = {"type": "function", "function": {"name": "look_up", "parameters": {}}}
    assert set(tool_methods("trace/x-v0", [good])) == {"look_up"}
    bad = {"type": "function", "function": {"name": name, "parameters": {}}}
    with pytest.raises(TraceGymError, match=f"trace/x-v0: tool '{name}' cannot be a method"):
        tool_methods("trace/x-v0", [good, bad])


@pytest.mark.slow
def test_one_grpo_step_of_trls_tool_loop_over_a_registry_env(retail, tmp_path):
    from datasets import Dataset
    from families import family_tokenizer, tiny_model
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = family_tokenizer("qwen2_5")
    seen = []

    class Watched(retail):
        def get_reward(self):
            seen.append(super().get_reward())
            return seen[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=16,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=tiny_model(tokenizer, arch="qwen2"),
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(dataset(RETAIL, range(2))),
        environment_factory=Watched,
    )
    trainer.train()
    assert len(seen) == 2 and all(r == 0.0 for r in seen)  # a random model: both rollouts scored, none solved
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert logged and "rewards/Watched/mean" in logged[0]
