"""τ² episodes end exactly as tau2's own orchestrator ends them, with tau2's reward.

Each case plays the same actions twice: through our env's step(), and through
``tau2.orchestrator.Orchestrator.run()`` itself (a replaying tau2 agent, and our
scripted user behind tau2's user interface), then scores tau2's run with tau2's
evaluator. Termination reason, reward and the number of steps must agree.
"""

import json

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from trace_gym.actions import format_tool_call, parse_action
from trace_gym.targets.tau2 import STOP_TOKEN

BAD_LOOKUP = format_tool_call("get_order_details", {"order_id": "#W0000000"})


def tau2_run(domain: str, task_id: str, actions: list[str], **limits):
    """tau2's orchestrator on the same actions; returns (termination reason, reward, tau2 steps)."""
    from tau2.agent.base import BaseAgent
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.base import BaseUser

    from trace_gym.targets.tau2 import ScriptedUser

    task = next(t for t in registry.get_tasks_loader(domain)(None) if t.id == task_id)
    environment = registry.get_env_constructor(domain)(solo_mode=False)

    class Replay(BaseAgent):
        def __init__(self):
            self.queue = list(actions)

        def generate_next_message(self, message, state):
            text = self.queue.pop(0) if self.queue else "Sorry, I have nothing more to do."
            parsed = parse_action(text)
            if parsed.kind == "tool_calls":
                calls = [
                    ToolCall(id=f"c{len(self.queue)}_{i}", name=c.name, arguments=c.arguments)
                    for i, c in enumerate(parsed.tool_calls)
                ]
                return AssistantMessage(role="assistant", tool_calls=calls), state
            return AssistantMessage(role="assistant", content=text), state

        def stop(self, message=None, state=None):
            pass

        def get_init_state(self, message_history=None):
            return None

        @classmethod
        def is_stop(cls, message):
            return bool(message.content) and STOP_TOKEN in message.content

    class Scripted(BaseUser):
        def __init__(self):
            super().__init__()
            self.user = ScriptedUser(task, environment)

        def get_init_state(self, message_history=None):
            return None

        def generate_next_message(self, message, state):
            if getattr(message, "tool_calls", None):
                self.user.observe_agent_calls(message.tool_calls)
            for user_message, _ in self.user.respond(message):  # retail: one text message per turn
                return UserMessage(role="user", content=user_message.content), state

        @classmethod
        def is_stop(cls, message):
            return ScriptedUser.is_stop(message)

    orchestrator = Orchestrator(domain, agent=Replay(), user=Scripted(), environment=environment, task=task, **limits)
    run = orchestrator.run()
    reward = evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=domain).reward
    return (
        run.termination_reason.value if hasattr(run.termination_reason, "value") else run.termination_reason,
        reward,
        orchestrator.step_count,
    )


def ours(domain: str, task_id: str, actions: list[str], **limits):
    env = gym.make(f"trace/tau2-{domain}-v0", split="base", **limits)
    env.reset(options={"task_id": task_id})
    terminated = truncated = False
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    assert terminated or truncated, "the episode did not end on the given actions"
    result = (env.unwrapped.termination_reason, reward, env.unwrapped.tau2_counts["steps"], terminated, truncated, info)
    env.close()
    return result


def test_ten_failing_tool_calls_end_as_tau2_ends_them():
    reason, reward, steps, terminated, truncated, info = ours("retail", "0", [BAD_LOOKUP] * 12)
    assert reason == "too_many_errors" and reward == 0.0 and terminated and not truncated
    assert info["reward_info"]["termination_reason"] == "too_many_errors"
    assert "too_many_errors" in info["reward_info"]["reason"]  # tau2's own note says why it scored 0
    assert (reason, reward, steps) == tau2_run("retail", "0", [BAD_LOOKUP] * 12)


def test_the_error_limit_counts_every_failing_call_of_one_message():
    several = json.dumps(
        [{"name": "get_order_details", "arguments": {"order_id": f"#W00000{i:02d}"}} for i in range(10)]
    )
    assert parse_action(several).kind == "tool_calls" and len(parse_action(several).tool_calls) == 10
    result = ours("retail", "0", [several])
    assert result[:3] == tau2_run("retail", "0", [several]) and result[0] == "too_many_errors"


@pytest.fixture(scope="module")
def oracle_actions():
    env = gym.make("trace/tau2-retail-v0", split="base")
    env.reset(options={"task_id": "0"})
    actions = env.unwrapped.oracle_actions()
    env.close()
    return actions


def test_nine_errors_then_the_solution_still_scores_one(oracle_actions):
    actions = [BAD_LOOKUP] * 9 + oracle_actions
    result = ours("retail", "0", actions)
    assert result[:2] == ("user_stop", 1.0)
    assert result[:3] == tau2_run("retail", "0", actions)


def test_every_message_counts_against_max_steps_and_beats_a_stop_on_the_same_step(oracle_actions):
    """Solving the task takes ``full`` tau2 steps; with exactly that limit tau2
    ends by max_steps, not by the user's stop, and scores 0."""
    _, reward, full, *_ = ours("retail", "0", oracle_actions)
    assert reward == 1.0 and full > 2 * len(oracle_actions) - 2  # user messages and tool results count too
    for limit in (full, full - 1, full - 3):
        reason, reward, steps, terminated, truncated, _ = ours("retail", "0", oracle_actions, max_steps=limit)
        assert (reason, reward, truncated, terminated) == ("max_steps", 0.0, True, False)
        assert (reason, reward, steps) == tau2_run("retail", "0", oracle_actions, max_steps=limit)
    assert ours("retail", "0", oracle_actions, max_steps=full + 1)[:3] == ("user_stop", 1.0, full)


def test_a_stuck_agent_is_stopped_by_tau2s_own_judge():
    """With a judge model, tau2's judge prompt goes to the endpoint after every step
    (once the window is full); its "yes" ends the episode with judge_stop, reward 0."""
    from openai_double import OpenAIDouble

    prompts = []

    def judge(body):
        prompts.append(body["messages"][-1]["content"])
        return {"content": "no" if len(prompts) == 1 else "Yes"}

    with OpenAIDouble(judge) as server:
        env = gym.make(
            "trace/tau2-retail-v0",
            split="base",
            judge_model="double",
            judge_base_url=server.base_url,
            judge_api_key=server.key,
            judge_window_size=3,
        )
        env.reset(options={"task_id": "0"})  # greeting + opening: 2 messages, below the window
        assert prompts == []
        _, reward, terminated, truncated, info = env.step("Could you repeat that?")
        env.close()
    assert len(prompts) == 2 and all("stuck-in-a-loop" in p and "Could you repeat that?" in p for p in prompts)
    assert terminated and not truncated and reward == 0.0
    assert info["reward_info"]["termination_reason"] == "judge_stop"


def test_without_a_judge_model_nothing_is_judged(oracle_actions):
    assert ours("retail", "0", ["Could you repeat that?"] * 3 + oracle_actions)[:2] == ("user_stop", 1.0)
