"""Identification says what it did: unknown rates stay unknown, missing labels are errors,
skipped bootstrap runs are counted, tasks (not episodes) are resampled, analyst retries
carry the error back, the gold analyst labels airline, planted deficits record what acted,
fixes_error only inserts a refused call."""

import json
import random

import pytest

from openai_double import OpenAIDouble
from trace_gym.actions import format_tool_call, parse_action
from trace_gym.agents.planted import apply_deficits, insert_refused_call
from trace_gym.identification import (
    GoldActionAnalyst,
    IncompleteLabelsError,
    Label,
    SelectionConfig,
    contrast,
    identify,
)
from trace_gym.identification.gold import _same
from trace_gym.identification.llm_analyst import LLMAnalyst, PairLabel, extract_json
from trace_gym.trajectory import Message, Trajectory, episode_id


def traj(task: str, sample: int, success: bool) -> Trajectory:
    return Trajectory(
        episode_id=episode_id("trace/x-v0", task, sample),
        env_id="trace/x-v0",
        task_id=task,
        sample=sample,
        agent="t",
        messages=[Message(role="user", content=task)],
        reward=1.0 if success else 0.0,
        terminated=True,
        truncated=False,
        steps=1,
        started_at="2026-01-01T00:00:00+00:00",
        wall_s=0.0,
    )


class TableAnalyst:
    """An analyst whose labels are given as data: the statistics under test are ours."""

    name = "table"

    def __init__(self, table: dict[str, dict[str, str]]):
        self.table = table

    def capabilities(self) -> dict[str, str]:
        return {c: f"capability {c}" for c in next(iter(self.table.values()))}

    def label(self, trajectory: Trajectory) -> list[Label]:
        return [Label(trajectory.episode_id, c, v) for c, v in self.table[trajectory.episode_id].items()]


# --- (3) the LLM analyst ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": "say \\"}\\" now"}', {"a": 'say "}" now'}),
        (
            'Here you go:\n```json\n{"a": "x{y", "b": [1, {"c": "\\\\"}]}\n```\nDone.',
            {"a": "x{y", "b": [1, {"c": "\\"}]},
        ),
        ('Labels use {braces} in prose first, then {"label": "PRESENT"}', {"label": "PRESENT"}),
    ],
)
def test_extract_json_reads_what_json_reads(text, expected):
    assert json.loads(extract_json(text)) == expected


@pytest.mark.parametrize(
    "text, fragment", [("no object here", "no JSON object"), ('{"a": "cut sho', "no complete JSON object")]
)
def test_extract_json_says_what_is_wrong(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        extract_json(text)


def test_a_malformed_answer_is_re_asked_with_its_error_in_the_conversation():
    seen = []

    def answer(body):
        seen.append(body["messages"])
        if len(body["messages"]) == 1:
            return {"content": '{"label": "MAYBE"}'}  # the same prompt at temperature 0 would get this again
        return {"content": '{"label": "LACKING", "evidence": {"quote": "q"}}'}

    with OpenAIDouble(answer) as server:
        analyst = LLMAnalyst("openai:double", base_url=server.base_url, api_key="test-key")
        got = analyst.ask("Label this.", PairLabel)
    assert got.label == "LACKING" and analyst.calls == 2
    retry = seen[1]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"]
    assert retry[1]["content"] == '{"label": "MAYBE"}'
    assert "label" in retry[2]["content"] and "PRESENT" in retry[2]["content"]  # pydantic's message names the choices


# --- (4) the gold analyst --------------------------------------------------------------------


def test_gold_argument_comparison_handles_lists_of_dicts():
    a = {"passengers": [{"first_name": "A", "dob": "1990-01-01"}, {"first_name": "B", "dob": "1991-01-01"}], "n": 2}
    b = {"passengers": [{"first_name": "B", "dob": "1991-01-01"}, {"first_name": "A", "dob": "1990-01-01"}], "n": 2}
    assert _same(a, b)
    assert not _same(a, {**b, "passengers": b["passengers"][:1]})
    assert _same({"item_ids": ["2", "1"]}, {"item_ids": ["1", "2"]})


def test_a_call_the_tool_refuses_lacks_valid_arguments_and_user_side_calls_do_not_count():
    from trace_gym.identification.gold import valid_tool_arguments
    from trace_gym.trajectory import ToolCallRecord

    def episode(*answers: tuple[str, bool, str]) -> Trajectory:
        t = traj("1", 0, False)
        for i, (content, error, requestor) in enumerate(answers):
            call = ToolCallRecord(id=f"c{i}", name="get_order_details", arguments={"order_id": "#W1"})
            t.messages += [
                Message(role="assistant", tool_calls=[call], requestor=requestor),
                Message(role="tool", tool_call_id=f"c{i}", content=content, error=error, requestor=requestor),
            ]
        return t

    assert valid_tool_arguments(episode())[0] == "NOT_APPLICABLE"
    assert valid_tool_arguments(episode(("{}", False, "assistant"), ("Error: no", True, "user"))) == (
        "PRESENT",
        "all 1 calls ran",
    )
    label, evidence = valid_tool_arguments(
        episode(("{}", False, "assistant"), ("Error: unexpected", True, "assistant"))
    )
    assert label == "LACKING" and evidence == "message 4: 'Error: unexpected'"


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["trace/tau2-airline-v0", "trace/tau2-retail-v0"])
def test_gold_analyst_labels_every_planted_trajectory(tmp_path, env_id):
    from trace_gym.rollout import rollout
    from trace_gym.store import read_trajectories

    out = tmp_path / "planted.jsonl"
    rollout(
        env_id,
        "planted",
        out,
        split="base",
        seed=4,
        progress=False,
        agent_kwargs={"deficits": {"corrupt_ids": 0.4, "end_early": 0.2, "omit_info": 0.4, "skip_reads": 0.3}},
    )
    trajectories = read_trajectories(out)
    analyst = GoldActionAnalyst()
    labels = [label for t in trajectories for label in analyst.label(t)]
    assert len(labels) == len(trajectories) * len(analyst.capabilities())
    if env_id.endswith("airline-v0"):
        corrupted = [t for t in trajectories if "corrupt_ids" in t.agent_info["deficits"]]
        lacking = {x.episode_id for x in labels if x.capability == "precise_arguments" and x.label == "LACKING"}
        assert corrupted and sum(t.episode_id in lacking for t in corrupted) >= 0.8 * len(corrupted)


# --- (5) statistics that say what they did --------------------------------------------------


def test_er_plus_with_no_applicable_success_is_unknown_and_never_selects(tmp_path):
    # "rare" never applies in a success (N+ = 0) and is LACKING in every failure: ER- = 1 but ER+
    # is unknown, so the gap is too. Reading ER+ as 0 would select it on a gap of 1.0.
    trajectories = [traj(str(i), 0, i < 6) for i in range(10)]
    table = {
        t.episode_id: {
            "rare": "NOT_APPLICABLE" if t.success else "LACKING",
            "real": "LACKING" if not t.success or t.task_id == "0" else "PRESENT",
        }
        for t in trajectories
    }
    result = identify(trajectories, TableAnalyst(table), tmp_path / "out", config=SelectionConfig(runs=1, min_runs=1))
    by = {c.name: c for c in result.capabilities}
    assert by["rare"].er_plus_mean is None and by["rare"].gap_mean is None and by["rare"].runs_gap_unknown == 1
    assert result.selected == ["real"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| rare | unknown | 1.00 | unknown |" in report and "ER+ or ER- unknown in 1 of 1 runs" in report
    written = json.loads((tmp_path / "out" / "capabilities.json").read_text())
    assert next(c for c in written["candidates"] if c["name"] == "rare")["gap_mean"] is None


def test_a_missing_label_is_an_error_not_not_applicable():
    trajectories = [traj(str(i), 0, i < 3) for i in range(6)]
    table = {t.episode_id: {"a": "LACKING", "b": "PRESENT"} for t in trajectories}
    del table[trajectories[4].episode_id]["b"]
    with pytest.raises(IncompleteLabelsError, match=r"1 of 12 \(trajectory, capability\) pairs have no label"):
        identify(trajectories, TableAnalyst(table), config=SelectionConfig(runs=1, min_runs=1))
    labels = [Label(e, c, v) for e, row in table.items() for c, v in row.items()]
    success = {t.episode_id: t.success for t in trajectories}
    with pytest.raises(IncompleteLabelsError, match="no label"):
        contrast(labels, list(success), success, ["a", "b"], SelectionConfig())
    table[trajectories[4].episode_id]["b"] = "lacking"
    with pytest.raises(IncompleteLabelsError, match="not one of PRESENT, LACKING, NOT_APPLICABLE"):
        identify(trajectories, TableAnalyst(table), config=SelectionConfig(runs=1, min_runs=1))


def test_skipped_bootstrap_runs_are_counted_and_stated(tmp_path):
    # One failure in 12 tasks: about a third of the bootstrap samples draw no failure and cannot vote.
    trajectories = [traj(str(i), 0, i != 0) for i in range(12)]
    table = {t.episode_id: {"x": "PRESENT" if t.success else "LACKING"} for t in trajectories}
    result = identify(
        trajectories, TableAnalyst(table), tmp_path / "out", config=SelectionConfig(runs=10, min_runs=8), seed=3
    )
    made = len(result.runs)
    assert 0 < made < 10
    assert result.analyst["runs_made"] == made and result.analyst["runs_requested"] == 10
    assert result.capabilities[0].runs == made and result.capabilities[0].runs_required == min(8, made)
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"{made} of 10 bootstrap runs made" in report and f"{10 - made} drew no successes or no failures" in report
    assert f"in at least {min(8, made)} of the {made} runs made" in report


def test_samples_of_a_task_are_resampled_together():
    # 8 tasks x 3 samples: a cluster bootstrap draws whole tasks, so every run holds a multiple of 3 episodes per group.
    trajectories = [traj(str(i), k, (i + k) % 3 != 0) for i in range(8) for k in range(3)]
    table = {t.episode_id: {"x": "PRESENT" if t.success else "LACKING"} for t in trajectories}
    result = identify(trajectories, TableAnalyst(table), config=SelectionConfig(runs=10, min_runs=8), seed=1)
    assert len(result.runs) == 10
    assert all((s.n_plus + s.n_minus) % 3 == 0 for run in result.runs for s in run)
    assert result.analyst["tasks"] == 8


# --- (5) planted deficits record what took effect -------------------------------------------


def test_a_corrupted_write_that_end_early_drops_is_not_a_fired_deficit():
    read = format_tool_call("get_order_details", {"order_id": "#W2000001"})
    write = format_tool_call("cancel_pending_order", {"order_id": "#W2000001", "reason": "no longer needed"})
    script = [read, write, "Your order #W2000001 is cancelled."]
    for seed in range(20):
        out, fired = apply_deficits(script, ["corrupt_ids", "end_early"], [], random.Random(seed))
        assert fired == ["end_early"] and out == [read, "Your order #W2000001 is cancelled."]
    second = format_tool_call("modify_pending_order_address", {"order_id": "#W2000002", "address1": "1 Main St"})
    for seed in range(20):
        out, fired = apply_deficits(
            [read, write, second, "Done."], ["corrupt_ids", "end_early"], [], random.Random(seed)
        )
        assert (
            fired == ["corrupt_ids", "end_early"] and second not in out and write not in out
        )  # the made write is corrupted


@pytest.mark.slow
def test_planted_airline_mix_through_the_cli_selects_the_harmful_deficits_only(tmp_path):
    from conftest import run_cli

    out = tmp_path / "airline.jsonl"
    rolled = run_cli(
        "rollout",
        "--env",
        "trace/tau2-airline-v0",
        "--agent",
        "planted",
        "--split",
        "base",
        "--seed",
        "13",
        "--deficits",
        "end_early=0.5,skip_reads=0.6,corrupt_ids=0.2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert rolled.returncode == 0, rolled.stderr
    found = run_cli("identify", "--trajectories", str(out), "--analyst", "gold", "--out", str(tmp_path / "id"))
    assert found.returncode == 0, found.stderr
    written = json.loads((tmp_path / "id" / "capabilities.json").read_text())
    # corrupt_ids' id names no record, so the tool refuses the call: it lacks valid arguments too
    assert sorted(c["name"] for c in written["selected"]) == [
        "complete_actions",
        "precise_arguments",
        "valid_tool_arguments",
    ]
    control = next(c for c in written["candidates"] if c["name"] == "read_before_write")
    assert not control["selected"] and control["runs_passed"] < 8
    capped = run_cli("identify", "--trajectories", str(out), "--max-selected", "1", "--out", str(tmp_path / "one"))
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.count("over the cap") == 2 and "at most 1, the largest gaps first" in capped.stdout
    kept = json.loads((tmp_path / "one" / "capabilities.json").read_text())["selected"]
    assert [c["name"] for c in kept] == [next(c["name"] for c in written["candidates"] if c["selected"])]


def test_fixes_error_makes_one_call_wrong_just_before_it_is_made_right():
    find = format_tool_call("find_user_id_by_name_zip", {"first_name": "Ann", "last_name": "Lee", "zip": "19122"})
    details = format_tool_call("get_user_details", {"user_id": "ann_lee_1234"})
    script = [find, details, "Is there anything else I can help you with?"]
    seen = set()
    for seed in range(40):
        out, fixed = insert_refused_call(script, random.Random(seed))
        assert fixed and len(out) == 4
        wrong = out.index(next(a for a in out if a not in script))
        right = parse_action(out[wrong + 1]).tool_calls[0]
        made = parse_action(out[wrong]).tool_calls[0]
        assert made.name == right.name and made.arguments != right.arguments
        assert [a for k, a in enumerate(out) if k != wrong] == script
        seen.add("borrowed" if set(made.arguments) != set(right.arguments) else "corrupted")
    assert seen == {"borrowed", "corrupted"}  # both mistakes a small policy makes
    assert insert_refused_call(["Hello."], random.Random(0)) == (["Hello."], False)
    # an argument the tool's schema takes is no mistake: with user_id accepted, only ids are corrupted
    takes = {"find_user_id_by_name_zip": {"first_name", "last_name", "zip", "user_id"}, "get_user_details": {"user_id"}}
    for seed in range(40):
        out, _ = insert_refused_call(script, random.Random(seed), takes)
        wrong = parse_action(next(a for a in out if a not in script)).tool_calls[0]
        assert "user_id" not in wrong.arguments or wrong.name == "get_user_details"


def test_fixes_error_changes_no_other_deficits_draws():
    """On τ² train tasks: the same deficits fire with and without fixes_error, and
    taking the inserted call out gives the same script back."""
    from trace_gym.agents.planted import PlantedDeficitAgent
    from trace_gym.registry import make

    env = make("trace/tau2-retail-v0", split="train")
    try:
        for task in env.unwrapped.task_ids[:8]:
            observation, info = env.reset(seed=0, options={"task_id": task})
            alone = PlantedDeficitAgent(deficits={"corrupt_ids": 0.5, "end_early": 0.3})
            alone.reset(observation, info, env)
            both = PlantedDeficitAgent(deficits={"corrupt_ids": 0.5, "end_early": 0.3, "fixes_error": 1.0})
            both.reset(observation, info, env)
            assert both.fired == [*alone.fired, "fixes_error"]
            extra = [k for k in range(len(both._script)) if both._script[:k] + both._script[k + 1 :] == alone._script]
            assert extra, f"task {task}: fixes_error did more than insert one call"
    finally:
        env.close()
