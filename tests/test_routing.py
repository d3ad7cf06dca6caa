"""Routing by the base model's label scores, and the evaluation figures built on it."""

import pytest

from conftest import capability
from trace_gym.artifacts import Identification
from trace_gym.evaluation import gold_route, method_result, results_table, routing_accuracy
from trace_gym.identification.stats import Label
from trace_gym.routing import RouteCapability, Router, RoutingError, capabilities_from_identification
from trace_gym.trajectory import Message, Trajectory

CAPS = [
    RouteCapability("precise_arguments", "Call tools with exactly the right argument values.", "adapter-a"),
    RouteCapability("complete_actions", "Carry out every state-changing action the request needs.", "adapter-b"),
    RouteCapability(
        "communicates_required_info", "Tell the user the amounts and counts the task requires.", "adapter-c"
    ),
]


class FixedScores:
    """A backend whose scores are given: tests the router's own decision logic."""

    name = "fixed"

    def __init__(self, by_task: dict[str, dict[str, float]]):
        self.by_task = by_task
        self.asked: list[str] = []

    def score(self, conversation, labels, *, adapter=None, tools=None):
        assert adapter is None  # the router is the base model
        task = conversation[-1]["content"].split("Task:\n", 1)[1].split("\n\n", 1)[0]
        self.asked.append(task)
        return dict(self.by_task[task])


def test_argmax_ties_to_none_and_calibration_subtracts_the_content_free_prior():
    prior = {"A": -1.0, "B": -3.0, "C": -3.0, "none": -6.0}
    backend = FixedScores(
        {
            "N/A": prior,
            "t1": {"A": -1.5, "B": -1.8, "C": -3.0, "none": -6.0},
            "t2": {"A": -2.0, "B": -2.0, "C": -2.0, "none": -2.0},
        }
    )
    plain = Router(backend, CAPS)
    assert plain.route("t1").capability == "precise_arguments"  # A has the highest raw score
    assert plain.route("t2").capability is None  # a tie goes to the base model
    calibrated = Router(backend, CAPS, calibrate=True)
    decision = calibrated.route("t1")
    assert decision.label == "B" and decision.adapter == "adapter-b"  # B rose by 1.2 over its prior, A fell
    assert decision.calibrated["B"] == pytest.approx(1.2) and decision.scores["B"] == -1.8
    assert decision.names["B"] == "complete_actions" and decision.names["none"] == "none"
    assert decision.named(decision.scores) == {
        "precise_arguments": -1.5,
        "complete_actions": -1.8,
        "communicates_required_info": -3.0,
        "none": -6.0,
    }
    calibrated.route("t2")
    assert backend.asked.count("N/A") == 1  # the prior is computed once


def test_router_refuses_what_it_cannot_do():
    with pytest.raises(RoutingError, match="at least one capability"):
        Router(FixedScores({}), [])
    with pytest.raises(RoutingError, match="cannot score labels"):
        Router(object(), CAPS)
    with pytest.raises(RoutingError, match="no score for the labels"):
        Router(FixedScores({"t": {"A": 0.0}}), CAPS).route("t")


def test_router_prompt_lists_labels_descriptions_and_examples():
    caps = [RouteCapability("x", "Do X.", "ax", examples=["I need X done " * 50, "second", "third"])]
    prompt = Router(FixedScores({}), caps, max_examples=2, example_chars=60).prompt("my task")
    text = prompt[-1]["content"]
    assert "A. x: Do X." in text and "none. The task needs none" in text and "Task:\nmy task" in text
    assert text.count("A task that needed it") == 2 and "third" not in text and "..." in text


def _trajectory(episode, task, success, route=None):
    return Trajectory(
        episode_id=episode,
        env_id="trace/tau2-retail-v0",
        task_id=task,
        agent="routed",
        messages=[Message(role="user", content=f"task {task}")],
        reward=float(success),
        terminated=True,
        truncated=False,
        steps=1,
        started_at="2026-01-01T00:00:00",
        wall_s=1.0,
        agent_info={"route": route} if route is not None else {},
    )


def test_routing_accuracy_and_method_figures_by_hand():
    groups = {"precise_arguments": {"1", "2"}, "complete_actions": {"2", "3"}}
    routed = ["precise_arguments", "complete_actions"]
    assert gold_route("2", groups, routed) == {"precise_arguments", "complete_actions"}
    assert gold_route("9", groups, routed) == {"none"}
    trajectories = [
        _trajectory("e1", "1", True, {"capability": "precise_arguments"}),  # right
        _trajectory("e2", "2", False, {"capability": "complete_actions"}),  # right (either lacking one)
        _trajectory("e3", "3", True, {"capability": None}),  # wrong: it lacked complete_actions
        _trajectory("e4", "9", False, {"capability": None}),  # right: lacked none
    ]
    acc = routing_accuracy(trajectories, groups, routed)
    assert acc["accuracy"] == 0.75 and acc["episodes"] == 4
    assert acc["confusion"]["complete_actions"]["none"] == 1 and acc["confusion"]["none"]["none"] == 1
    result = method_result(
        "trace", trajectories, groups=groups, routed_capabilities=routed, cost={"train_rollouts": 640}
    )
    assert result.pass_1 == 0.5 and result.tasks == 4
    assert result.pass_1_ci[0] < 0.5 < result.pass_1_ci[1]
    assert result.by_capability["precise_arguments"] == {"tasks": 2, "pass_1": 0.5}
    assert result.by_capability["complete_actions"] == {"tasks": 2, "pass_1": 0.5}
    table = results_table([result])
    assert "| trace | 4 | 0.500 |" in table and "| 0.750 | 640 |" in table


def test_capabilities_from_identification_reads_selection_and_lacking_examples(tmp_path):
    Identification(
        [
            capability("precise_arguments", "Exact values."),
            capability("complete_actions", "Every write."),
            capability("policy_adherence", "Rules.", selected=False),
        ],
        labels=[Label("e1", "precise_arguments", "LACKING"), Label("e2", "precise_arguments", "PRESENT")],
    ).save(tmp_path)
    caps = capabilities_from_identification(
        tmp_path,
        {"precise_arguments": "pa"},
        trajectories=[_trajectory("e1", "1", False), _trajectory("e2", "2", True)],
    )
    assert [(c.name, c.adapter, c.examples) for c in caps] == [("precise_arguments", "pa", ["task 1"])]
    with pytest.raises(RoutingError, match="no file at .*capabilities.json"):
        capabilities_from_identification(tmp_path / "missing", {})


@pytest.mark.slow
def test_local_router_picks_the_capability_the_task_names():
    """The embedded model as the router, through LocalHF.score: a task that names its
    label is routed there. SmolLM2-135M prefers the first label whatever the task, so
    the fixture uses calibration and names B and C (never A, which the bias would give)."""
    from trace_gym.llm import EMBEDDED_DEFAULT, make_backend

    router = Router(make_backend(EMBEDDED_DEFAULT), CAPS, max_examples=0, calibrate=True)
    for label, wanted in (("B", "complete_actions"), ("C", "communicates_required_info")):
        decision = router.route(" ".join([label] * 12))
        assert decision.capability == wanted, decision


def label_double(choose, act=None):
    """An OpenAI-compatible server for the router: a scoring request (logprobs) is answered
    with top_logprobs that put ``choose(prompt, labels)`` first; anything else by ``act``."""
    import re

    def answer(body):
        if not body.get("logprobs"):
            return act(body)
        prompt = body["messages"][-1]["content"]
        labels = dict(re.findall(r"^([A-Z])\. ([a-z_]+):", prompt, re.M))
        wanted = choose(prompt, labels)
        others = [label for label in [*labels, "none"] if label != wanted]
        return {
            "content": wanted,
            "top_logprobs": [{"token": wanted, "logprob": -0.05}]
            + [{"token": label, "logprob": -4.0 - i} for i, label in enumerate(others)],
        }

    return answer


def names_a_capability(prompt, labels):
    """What a capable model does with a task that names its capability."""
    task = prompt.split("Task:\n", 1)[1]
    return next((label for label, name in labels.items() if name in task), "none")


def test_openai_router_picks_the_capability_the_task_names():
    from openai_double import OpenAIDouble
    from trace_gym.llm import make_backend

    with OpenAIDouble(label_double(names_a_capability)) as server:
        router = Router(make_backend("openai:double", base_url=server.base_url, api_key="test-key"), CAPS)
        assert router.route("Please do all of it: complete_actions matters here.").adapter == "adapter-b"
        assert (
            router.route("Tell me the totals (communicates_required_info).").capability == "communicates_required_info"
        )
        assert router.route("Hello there.").capability is None
        assert all(r["max_tokens"] == 1 and r["logprobs"] for r in server.requests)


def test_routed_agent_plays_each_tau2_task_with_its_adapter_and_records_the_route():
    """RoutedAgent through the OpenAI-compatible path (vLLM multi-LoRA: the adapter is the
    model name): the fixture knows each task's capability; the router's choice becomes the
    model of every request of that episode, and the decision is in the trajectory."""
    import gymnasium as gym

    import trace_gym  # noqa: F401
    from openai_double import OpenAIDouble, gold_answer
    from trace_gym.agents import OracleAgent
    from trace_gym.llm import make_backend
    from trace_gym.rollout import Episode, run_episode
    from trace_gym.routing import RoutedAgent

    env = gym.make("trace/tau2-retail-v0", split="base")
    truth = {"0": "B", "1": "C", "2": "none"}
    scripts, first_messages = {}, {}
    for task, label in truth.items():
        obs, info = env.reset(options={"task_id": task})
        oracle = OracleAgent()
        oracle.reset(obs, info, env.unwrapped)
        scripts[obs] = [oracle.act("") for _ in range(40)]
        first_messages[obs] = label

    def choose(prompt, labels):
        task = prompt.split("Task:\n", 1)[1]
        return next(label for first, label in first_messages.items() if first.strip() in task)

    models = ("double", "adapter-a", "adapter-b", "adapter-c")
    with OpenAIDouble(label_double(choose, gold_answer(scripts)), models=models) as server:
        agent = RoutedAgent(
            router=Router(make_backend("openai:double", base_url=server.base_url, api_key="test-key"), CAPS)
        )
        for task, label in truth.items():
            start = len(server.requests)
            trajectory = run_episode(env, agent, "trace/tau2-retail-v0", Episode(task, 0, 0))
            route = trajectory.agent_info["route"]
            assert route["label"] == label and set(route["scores"]) == {"A", "B", "C", "none"}
            played = {r["model"] for r in server.requests[start:] if not r.get("logprobs")}
            assert played == {route["adapter"] or "double"}, played
            assert trajectory.reward == 1.0  # the oracle's actions, played under the routed model name
    env.close()
