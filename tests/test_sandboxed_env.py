"""A synthesized env through the sandbox, as a Gymnasium text env with the target's schemas."""

import os
import shutil
import subprocess

import pytest

from conftest import FIXTURE_ENVS, PYTHON
from trace_gym.agents import OracleAgent, RandomAgent
from trace_gym.errors import EnvContractError
from trace_gym.registry import get_entry
from trace_gym.rollout import Episode, run_episode
from trace_gym.sandbox.env import SandboxedEnv
from trace_gym.tools import canonical_json, load_frozen_tools, select_tools

ORDER_LOOKUP = FIXTURE_ENVS / "order-lookup"


def test_tools_are_the_targets_byte_for_byte_and_the_oracle_solves(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    obs, info = env.reset(seed=7)
    frozen = load_frozen_tools(get_entry("trace/tau2-retail-v0").tools_path)
    assert canonical_json(info["tools"]) == canonical_json(select_tools(frozen, ["get_order_details"]))
    assert obs.startswith("What is the status of my order #W")
    traj = run_episode(env, OracleAgent(), "trace/test-order-lookup-v0", Episode(None, 0, 7))
    assert traj.reward == 1.0 and traj.termination_reason == "env_done"
    assert traj.reward_info["components"] == {"used_tool": 1.0, "looked_up": 1.0, "correct_status": 1.0}
    env.close()


def test_seeds_give_different_tasks_and_the_same_seed_the_same(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    first = [env.reset(seed=s)[0] for s in (1, 2, 3, 1)]
    assert first[0] == first[3] and len(set(first)) == 3
    env.close()


def test_a_wrong_id_and_a_wrong_answer_score_low(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    env.reset(seed=3)
    obs, *_ = env.step('{"name": "get_order_details", "arguments": {"order_id": "#W0"}}')
    assert obs == "Error: Order not found"
    _, reward, terminated, _, info = env.step("It is on its way.")
    assert terminated and reward == 0.2 and info["reward_info"]["failed_components"] == ["correct_status", "looked_up"]
    env.close()


def test_hint_changes_only_the_system_prompt(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    plain_obs, plain = env.reset(seed=5)
    hint_obs, hinted = env.reset(seed=5, options={"hint": True})
    assert plain_obs == hint_obs and plain["tools"] == hinted["tools"]
    assert hinted["system_prompt"] != plain["system_prompt"] and "Hint" in hinted["system_prompt"]
    env.close()


def copy_env(tmp_path, replace: dict[str, str]):
    folder = tmp_path / "variant"
    shutil.copytree(ORDER_LOOKUP, folder)
    source = (folder / "env.py").read_text()
    for old, new in replace.items():
        assert old in source
        source = source.replace(old, new)
    (folder / "env.py").write_text(source)
    return folder


@pytest.mark.parametrize(
    "replace, fragment",
    [
        (
            {'TOOLS = ["get_order_details"]': 'TOOLS = ["get_order_details", "launch_rockets"]'},
            "does not have: launch_rockets",
        ),
        ({'TOOLS = ["get_order_details"]': "TOOLS = []"}, "non-empty list"),
        ({'return {"reward": reward,': 'return {"reward": float("nan"),'}, "finite number in [0, 1]"),
        ({'return {"reward": reward,': 'return {"reward": 1.5,'}, "finite number in [0, 1]"),
        ({'return {"observation": "Thanks!", "done": True}': 'return "Thanks!"'}, "step() must return"),
    ],
)
def test_contract_breaches_are_named(tmp_path, replace, fragment):
    env = None
    with pytest.raises(
        EnvContractError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
    ):
        env = SandboxedEnv(copy_env(tmp_path, replace), backend="bwrap")
        env.reset(seed=1)
        env.step("The order is pending.")
    if env is not None:
        env.close()


def test_gym_make_runs_a_registry_env_end_to_end_in_a_fresh_interpreter():
    code = (
        "import gymnasium as gym, trace_gym\n"
        "env = gym.make('trace/test-order-lookup-v0')\n"
        "obs, info = env.reset(seed=11)\n"
        "for action in env.unwrapped.oracle_actions():\n"
        "    obs, reward, terminated, truncated, info = env.step(action)\n"
        "print(reward, terminated, env.unwrapped.worker.backend.name)\n"
        "env.close()\n"
    )
    result = subprocess.run(
        [PYTHON, "-c", code],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    reward, terminated, backend = result.stdout.split()
    assert float(reward) == 1.0 and terminated == "True" and backend in ("docker", "bwrap")


def test_random_agent_is_far_from_the_oracle(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    rewards = [run_episode(env, RandomAgent(seed=s), "x", Episode(None, 0, s)).reward for s in range(8)]
    assert sum(rewards) / len(rewards) < 0.5
    env.close()


def test_misnamed_calls_are_answered_by_the_host_in_the_targets_words(sandbox_backend):
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    env.reset(seed=4)
    obs, *_ = env.step('{"name": "cancel_pending_order", "arguments": {}}')
    assert obs == "Error: Tool 'cancel_pending_order' not found."  # a target tool, but not one of TOOLS
    obs, *_ = env.step('{"name": "get_order_details", "arguments": {"orderId": "#W1"}}')
    assert obs == "Error: RetailTools.get_order_details() got an unexpected keyword argument 'orderId'"
    obs, *_ = env.step('{"name": "get_order_details", "arguments": {}}')
    assert obs == "Error: RetailTools.get_order_details() missing 1 required positional argument: 'order_id'"
    _, _, terminated, _, info = env.step("I don't know.")
    assert terminated and info["reward_info"]["components"]["used_tool"] == 0.0  # none of them reached env code
    env.close()


SET_ORDER_ENV = '''"""Transfer rationale: none; a probe of the string-hash seed."""
TOOLS = ["get_order_details"]


class Environment:
    def reset(self, seed, hint=False):
        names = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"}
        return {"system_prompt": ",".join(names), "user_message": "hi"}

    def step(self, action):
        return {"observation": "ok", "done": True}

    def reward(self):
        return {"reward": 0.0, "components": {}, "reason": ""}
'''


def test_every_worker_iterates_a_set_of_strings_in_the_same_order(sandbox_backend):
    """Two fresh workers replay one seed identically even when env code iterates a set of
    strings: the jail fixes the string-hash seed (a random one per worker made such envs
    fail `determinism` by chance, and would give GRPO's K rollouts of a seed different tasks)."""
    from trace_gym.sandbox import SandboxWorker

    orders = set()
    for _ in range(3):
        with SandboxWorker(SET_ORDER_ENV, backend=sandbox_backend) as worker:
            orders.add(worker.call("reset", seed=0, hint=False)["system_prompt"])
    assert len(orders) == 1, orders
