"""The τ²-bench targets through gym.make and step(str), scored by tau2 itself."""

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from trace_gym.actions import format_tool_call
from trace_gym.errors import UnknownTaskError, UserSimulatorError
from trace_gym.freeze import live_tools
from trace_gym.registry import get_entry
from trace_gym.rollout import Episode, run_episode
from trace_gym.targets.tau2 import collector_paused
from trace_gym.tools import canonical_tools, load_frozen_tools
from trace_gym.trajectory import Trajectory

from trace_gym.agents import OracleAgent


def tau2_messages_from_record(trajectory: Trajectory):
    """Rebuild tau2's message list from our stored record, independently of the
    env's own conversion: the record must be enough to re-score the episode."""
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out = []
    for m in trajectory.messages:
        if m.role == "system" or m.name == "environment" or (m.role == "assistant" and m.error):
            continue  # the system prompt, and malformed turns that reached no one
        if m.role == "tool":
            out.append(
                ToolMessage(id=m.tool_call_id, role="tool", content=m.content, requestor=m.requestor, error=m.error)
            )
        elif m.tool_calls:
            calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments, requestor=m.requestor) for c in m.tool_calls]
            cls = UserMessage if m.role == "user" else AssistantMessage
            out.append(cls(role=m.role, tool_calls=calls))
        else:
            cls = UserMessage if m.role == "user" else AssistantMessage
            out.append(cls(role=m.role, content=m.content))
    return out


def tau2_reward(trajectory: Trajectory, domain: str) -> float:
    from datetime import datetime, timezone

    from tau2.data_model.simulation import SimulationRun
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.registry import registry

    from trace_gym.targets.tau2 import to_tau2_termination

    task = next(t for t in registry.get_tasks_loader(domain)(None) if t.id == trajectory.task_id)
    now = datetime.now(timezone.utc).isoformat()
    run = SimulationRun(
        id="check",
        task_id=task.id,
        timestamp=now,
        start_time=now,
        end_time=now,
        duration=0.0,
        termination_reason=to_tau2_termination(trajectory.termination_reason),
        messages=tau2_messages_from_record(trajectory),
    )
    with collector_paused():  # as the env scores: tau2 builds two databases
        return evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=domain).reward


def test_the_collector_is_paused_only_while_tau2_builds_and_scores(retail_env, monkeypatch):
    import gc

    import tau2.evaluator.evaluator as evaluator

    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()  # a caller that paused it itself keeps it paused
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

    seen = []  # is the collector on while tau2 builds a database and scores?

    def spying(function, name):
        def call(*args, **kwargs):
            seen.append((name, gc.isenabled()))
            return function(*args, **kwargs)

        return call

    env = retail_env.unwrapped
    monkeypatch.setattr(env, "_env_constructor", spying(env._env_constructor, "build"))
    monkeypatch.setattr(evaluator, "evaluate_simulation", spying(evaluator.evaluate_simulation, "score"))
    retail_env.reset(options={"task_id": env.task_ids[0]})
    assert gc.isenabled()
    retail_env.step("###STOP###")  # the agent stops: tau2 scores the episode
    assert gc.isenabled()
    assert seen == [("build", False), ("score", False)]


def test_threads_share_one_collector_pause_and_the_last_out_ends_it():
    import gc
    import threading

    inside, leave = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread is still inside: its pause holds
    leave.set()
    thread.join(10)
    assert gc.isenabled()


@pytest.mark.slow
@pytest.mark.parametrize("domain, count", [("retail", 114), ("airline", 50)])
def test_oracle_scores_one_on_every_task_and_tau2_agrees(domain, count):
    env = gym.make(f"trace/tau2-{domain}-v0", split="base")
    ids = env.unwrapped.task_ids
    assert len(ids) == count
    mismatches, failures = [], []
    for task_id in ids:
        traj = run_episode(env, OracleAgent(), env.spec.id, Episode(task_id, 0, 0))
        if traj.reward != 1.0:
            failures.append((task_id, traj.reward_info))
        stored = Trajectory.model_validate_json(traj.model_dump_json())  # what the JSONL file holds
        theirs = tau2_reward(stored, domain)
        if theirs != traj.reward:
            mismatches.append((task_id, traj.reward, theirs))
    env.close()
    assert not failures, failures[:3]
    assert not mismatches, mismatches[:3]


def test_the_retail_oracle_looks_up_every_id_it_writes_and_keeps_the_gold_order(retail_env):
    """tau2 lists the writes of 31 train tasks without the reads their ids come from; the
    oracle, a demonstration for the warm start, reads the user, each order before its
    first write and each product a write picks an item of, and keeps every gold action
    in tau2's order (the slow test above scores each task 1.0)."""
    from trace_gym.actions import parse_action
    from trace_gym.targets.tau2.lookups import with_lookups
    from trace_gym.tools import changes_state

    env = retail_env.unwrapped
    added = 0
    for task_id in env.task_ids:
        retail_env.reset(options={"task_id": task_id})
        calls = [parse_action(a).tool_calls[0] for a in env.oracle_actions() if parse_action(a).is_tool_call]
        gold = [(a.name, a.arguments) for a in env.get_task(task_id).evaluation_criteria.actions or []]
        made = [(c.name, c.arguments) for c in calls]
        it = iter(made)
        assert all(g in it for g in gold), task_id  # the gold actions, in order, as a subsequence
        added += len(made) > len(gold)
        db = env._tau2_env.tools.db
        for n, call in enumerate(calls):
            if not changes_state(call.name):
                continue
            before = {(c.name, str(c.arguments)) for c in calls[:n]}
            assert any(c.name.startswith("find_user_id") for c in calls[:n]), task_id
            if "order_id" in call.arguments:
                assert ("get_order_details", str({"order_id": call.arguments["order_id"]})) in before, task_id
            for item in call.arguments.get("new_item_ids") or []:
                [product] = [p.product_id for p in db.products.values() if item in p.variants]
                assert ("get_product_details", str({"product_id": product})) in before, task_id
    assert added >= 31  # the tasks whose gold list names ids it never read
    assert with_lookups([("cancel_pending_order", {"order_id": "#Wnone"})], db, "nobody") == [
        ("cancel_pending_order", {"order_id": "#Wnone"})
    ]  # no user to be told: the gold list as it is


def test_tau2_agrees_on_failed_episodes_too(retail_env):
    from trace_gym.agents import RandomAgent

    for task_id in ["0", "5", "17"]:
        traj = run_episode(retail_env, RandomAgent(seed=3), "trace/tau2-retail-v0", Episode(task_id, 0, 1))
        assert traj.reward == tau2_reward(Trajectory.model_validate_json(traj.model_dump_json()), "retail")


def test_skipping_the_write_scores_zero_and_names_db(retail_env):
    obs, info = retail_env.reset(options={"task_id": "0"})
    assert info["task_id"] == "0" and info["tools"] and "policy" in info["system_prompt"]
    actions = retail_env.unwrapped.oracle_actions()
    reads_only = [a for a in actions if "exchange_delivered_order_items" not in a]
    for action in reads_only:
        obs, reward, terminated, truncated, step_info = retail_env.step(action)
        if terminated:
            break
    assert terminated and reward == 0.0
    assert step_info["reward_info"]["failed_components"] == ["DB"]
    assert step_info["reward_info"]["components"] == {"DB": 0.0, "COMMUNICATE": 1.0}


def test_not_saying_the_required_information_names_communicate(retail_env):
    task_id = next(
        t
        for t in retail_env.unwrapped.task_ids
        if retail_env.unwrapped.get_task(t).evaluation_criteria.communicate_info
    )
    retail_env.reset(options={"task_id": task_id})
    for action in retail_env.unwrapped.oracle_actions()[:-2]:
        retail_env.step(action)
    _, reward, terminated, _, step_info = retail_env.step("Is there anything else I can help you with?")
    assert terminated and reward == 0.0
    assert step_info["reward_info"]["failed_components"] == ["COMMUNICATE"]


def test_malformed_actions_and_unknown_tools_are_observations(retail_env):
    retail_env.reset(options={"task_id": "3"})
    obs, reward, terminated, truncated, info = retail_env.step(
        '{"name": "get_order_details", "arguments": {"order_id": '
    )
    assert obs.startswith("Error: invalid tool call") and not terminated and info["action_kind"] == "malformed"
    obs, *_ = retail_env.step(format_tool_call("launch_rockets", {}))
    assert "launch_rockets" in obs and "not found" in obs.lower()
    obs, *_ = retail_env.step(format_tool_call("get_order_details", {"order": "#W1"}))
    assert obs.startswith("Error:")


def test_truncation_after_max_steps_scores_zero():
    """tau2 counts every message: the user's opening (1), the agent's call (2) and its result (3)."""
    env = gym.make("trace/tau2-retail-v0", max_steps=3)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(format_tool_call("list_all_product_types", {}))
    assert truncated and not terminated and reward == 0.0
    assert env.unwrapped.termination_reason == "max_steps" and env.unwrapped.tau2_counts["steps"] == 3
    assert "termination" in info["reward_info"]["failed_components"]
    obs, reward, terminated, _, info = env.step("hello?")
    assert info["after_end"] and reward == 0.0 and "episode is over" in obs
    env.close()


def test_seeded_reset_is_deterministic_and_samples_the_split():
    env = gym.make("trace/tau2-retail-v0", split="test")
    firsts = [env.reset(seed=s)[1]["task_id"] for s in (1, 2, 1)]
    assert firsts[0] == firsts[2]
    assert set(firsts) <= set(env.unwrapped.task_ids) and len(env.unwrapped.task_ids) == 40
    env.close()


def test_unknown_task_and_split_are_one_clear_error(retail_env):
    with pytest.raises(UnknownTaskError, match="no task 'nope'"):
        retail_env.reset(options={"task_id": "nope"})
    with pytest.raises(UnknownTaskError, match="no split 'dev'"):
        gym.make("trace/tau2-retail-v0", split="dev")
    with pytest.raises(ValueError, match="user must be one of 'scripted', 'llm', got 'human'"):
        gym.make("trace/tau2-retail-v0", user="human")


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "mock"])
def test_frozen_tool_schemas_equal_the_live_package(domain):
    env_id = f"trace/tau2-{domain}-v0"
    frozen = load_frozen_tools(get_entry(env_id).tools_path)
    assert canonical_tools(frozen) == canonical_tools(live_tools(env_id))


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "mock"])
def test_frozen_result_shapes_equal_the_live_package(domain):
    from trace_gym.freeze import live_result_shapes
    from trace_gym.result_shapes import load_result_shapes
    from trace_gym.tools import canonical_json

    env_id = f"trace/tau2-{domain}-v0"
    frozen = load_result_shapes(get_entry(env_id).path)
    assert frozen is not None and set(frozen["tools"]) == {
        t["function"]["name"] for t in load_frozen_tools(get_entry(env_id).tools_path)
    }
    assert canonical_json(frozen) == canonical_json(live_result_shapes(env_id))


@pytest.mark.slow
@pytest.mark.parametrize("domain, tasks", [("retail", None), ("airline", None), ("telecom", 40), ("mock", None)])
def test_every_answer_tau2_gives_to_its_gold_actions_has_the_frozen_shape(domain, tasks):
    """The fidelity check must accept the target itself: tau2's tools, run on tau2's
    own DB along every task's gold actions, answer only in the frozen shapes."""
    from tau2.data_model.message import ToolCall
    from tau2.registry import registry

    from trace_gym.result_shapes import load_result_shapes, result_problems

    shapes = load_result_shapes(get_entry(f"trace/tau2-{domain}-v0").path)
    answered, problems = 0, []
    for task in registry.get_tasks_loader(domain)(None)[:tasks]:
        env = registry.get_env_constructor(domain)(solo_mode=False)
        init = task.initial_state
        if init is not None:
            env.set_state(
                initialization_data=init.initialization_data,
                initialization_actions=init.initialization_actions,
                message_history=init.message_history or [],
            )
        for action in (task.evaluation_criteria.actions if task.evaluation_criteria else None) or []:
            call = ToolCall(id="gold", name=action.name, arguments=action.arguments, requestor=action.requestor)
            response = env.get_response(call)
            if action.requestor == "assistant":
                answered += 1
                problems += [(task.id, action.name, p) for p in result_problems(shapes, action.name, response.content)]
    assert answered > 0 and not problems, problems[:3]


def test_telecom_oracle_with_scripted_user_side_actions():
    env = gym.make("trace/tau2-telecom-v0", split="test")
    rewards = []
    for task_id in env.unwrapped.task_ids[:6]:
        traj = run_episode(env, OracleAgent(), env.spec.id, Episode(task_id, 0, 0))
        assert any(m.requestor == "user" and m.tool_calls for m in traj.messages), "the user acted on the phone"
        rewards.append(traj.reward)
        assert traj.reward == tau2_reward(Trajectory.model_validate_json(traj.model_dump_json()), "telecom")
    assert rewards == [1.0] * 6
    env.close()


def test_llm_user_unreachable_endpoint_is_one_clear_error():
    env = gym.make("trace/tau2-retail-v0", user="llm", user_model="m", user_base_url="http://127.0.0.1:9/v1")
    with pytest.raises(UserSimulatorError, match=r"did not answer"):
        env.reset(seed=0)
    env.close()


def test_scripted_user_speaks_in_the_first_person(retail_env):
    obs, _ = retail_env.reset(options={"task_id": "0"})
    assert obs.startswith("I received my order #W2378156")
    assert "I am Yusuf Rossi in zip code 19122" in obs


@pytest.mark.parametrize(
    "scenario, spoken",
    [
        ("You want to check how much you paid.", "I want to check how much I paid."),
        (
            "If not, you want to return the watch you have received.",
            "If not, I want to return the watch I have received.",
        ),
        ("For some reason, you want to return it.", "For some reason, I want to return it."),
        ("If the agent asks you to confirm, you say yes.", "If the agent asks me to confirm, I say yes."),
        (
            "The agent can help you exchange it; it matters to you.",
            "The agent can help me exchange it; it matters to me.",
        ),
        ("You name is Daiki Silva and your email is d@x.com.", "My name is Daiki Silva and my email is d@x.com."),
        ("You're sure you've paid the refund you expect.", "I'm sure I've paid the refund I expect."),
        (
            "You prefer whatever saves you most money, and the delay caused you to miss it.",
            "I prefer whatever saves me most money, and the delay caused me to miss it.",
        ),
        ("The agent offered you a refund and told you so.", "The agent offered me a refund and told me so."),
    ],
)
def test_first_person_tells_the_subject_from_the_object(scenario, spoken):
    from trace_gym.targets.tau2.user import first_person

    assert first_person(scenario) == spoken


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "mock"])
def test_call_errors_are_worded_exactly_as_tau2_words_them(domain):
    """The host answers misnamed calls for synthesized envs; it must say what the target says."""
    from tau2.data_model.message import ToolCall
    from tau2.registry import registry

    from trace_gym.tools import call_error

    entry = get_entry(f"trace/tau2-{domain}-v0")
    tools, style = load_frozen_tools(entry.tools_path), entry.call_error_style()
    live = registry.get_env_constructor(domain)()
    for schema in tools + [{"type": "function", "function": {"name": "no_such_tool", "parameters": {}}}]:
        name = schema["function"]["name"]
        for arguments in ({"zzz": 1}, {}):
            theirs = live.get_response(ToolCall(id="x", name=name, arguments=arguments)).content
            ours = call_error(tools, name, arguments, style)
            if ours is None:  # a call whose names are right: tau2 runs it (no required arguments)
                assert not theirs.startswith(("Error: Tool", f"Error: {style.prefix}{name}()")), theirs
            else:
                assert ours == theirs
