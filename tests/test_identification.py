"""Capability identification: statistics by hand, planted deficits, the LLM path over HTTP."""

import json
import random

import pytest

from conftest import run_cli
from openai_double import OpenAIDouble
from trace_gym.identification import (
    DegenerateInputError,
    GoldActionAnalyst,
    Label,
    SelectionConfig,
    cohen_kappa,
    contrast,
    identify,
    make_analyst,
)
from trace_gym.artifacts import Identification
from trace_gym.identification.stats import SelectionError, wilson
from trace_gym.rollout import rollout
from trace_gym.store import read_trajectories


def test_statistics_match_hand_computed_values():
    # 4 successes (s1..s4), 5 failures (f1..f5); capability "verify":
    #   successes: s1 LACKING, s2 PRESENT, s3 PRESENT, s4 NOT_APPLICABLE  -> N+ = 3, E+ = 1, ER+ = 1/3
    #   failures:  f1 LACKING, f2 LACKING, f3 LACKING, f4 PRESENT, f5 NOT_APPLICABLE -> N- = 4, E- = 3, ER- = 3/4
    #   gap = 3/4 - 1/3 = 5/12 = 0.41667; coverage = E- / |D-| = 3/5 = 0.6
    # capability "greet": LACKING in s1, s2, f1, f2; PRESENT elsewhere, applicable everywhere
    #   ER+ = 2/4 = 0.5, ER- = 2/5 = 0.4, gap = -0.1, coverage = 2/5 = 0.4
    success = {
        "s1": True,
        "s2": True,
        "s3": True,
        "s4": True,
        "f1": False,
        "f2": False,
        "f3": False,
        "f4": False,
        "f5": False,
    }
    verify = {
        "s1": "LACKING",
        "s2": "PRESENT",
        "s3": "PRESENT",
        "s4": "NOT_APPLICABLE",
        "f1": "LACKING",
        "f2": "LACKING",
        "f3": "LACKING",
        "f4": "PRESENT",
        "f5": "NOT_APPLICABLE",
    }
    greet = {e: ("LACKING" if e in ("s1", "s2", "f1", "f2") else "PRESENT") for e in success}
    labels = [Label(e, "verify", v) for e, v in verify.items()] + [Label(e, "greet", v) for e, v in greet.items()]
    stats = {s.capability: s for s in contrast(labels, list(success), success, ["verify", "greet"], SelectionConfig())}
    v = stats["verify"]
    assert (v.n_plus, v.e_plus, v.n_minus, v.e_minus) == (3, 1, 4, 3)
    assert v.er_plus == pytest.approx(1 / 3) and v.er_minus == pytest.approx(0.75)
    assert v.gap == pytest.approx(5 / 12) and v.coverage == pytest.approx(0.6) and v.kept
    g = stats["greet"]
    assert (g.er_plus, g.er_minus) == (pytest.approx(0.5), pytest.approx(0.4))
    assert g.gap == pytest.approx(-0.1) and g.coverage == pytest.approx(0.4) and not g.kept
    # Wilson 95% for 3/4: centre (0.75 + 1.92/4) / (1 + 3.8416/4) = 0.6278..., half-width 0.3687...
    low, high = v.er_minus_ci
    assert low == pytest.approx(0.3006, abs=1e-3) and high == pytest.approx(0.9544, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)


def test_cohen_kappa_by_hand():
    a = ["LACKING", "LACKING", "PRESENT", "PRESENT", "NOT_APPLICABLE", "LACKING"]
    b = ["LACKING", "PRESENT", "PRESENT", "PRESENT", "NOT_APPLICABLE", "LACKING"]
    # observed 5/6; expected = (3/6)(2/6) + (2/6)(3/6) + (1/6)(1/6) = 13/36; kappa = (5/6 - 13/36) / (1 - 13/36) = 17/23
    assert cohen_kappa(a, b) == pytest.approx(17 / 23)
    assert cohen_kappa([], []) is None


@pytest.mark.parametrize(
    "outcomes, fragment",
    [([True], "1 trajectory"), ([False, False, False], "no successes"), ([True, True], "no failures")],
)
def test_degenerate_input_is_a_clear_error(outcomes, fragment):
    success = {f"e{i}": ok for i, ok in enumerate(outcomes)}
    with pytest.raises(DegenerateInputError, match=fragment):
        contrast([], list(success), success, ["x"], SelectionConfig())


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory):
    """Planted-deficit trajectories over all 114 retail tasks: three harmful
    deficits and one harmless control (skip_reads); then the same with end_early,
    and with corrupt_ids, switched off, over the first 57 tasks (every selected
    capability still passes 10 of 10 runs there, and each τ² episode costs tau2's scoring)."""
    folder = tmp_path_factory.mktemp("planted")
    planted = {"corrupt_ids": 0.3, "end_early": 0.3, "omit_info": 0.5, "skip_reads": 0.3}
    runs = {}
    for name, deficits, limit in (
        ("all", planted, None),
        ("no_end_early", {**planted, "end_early": 0.0}, 57),
        ("no_corrupt_ids", {**planted, "corrupt_ids": 0.0}, 57),
    ):
        rollout(
            "trace/tau2-retail-v0",
            "planted",
            folder / f"{name}.jsonl",
            split="base",
            limit=limit,
            seed=1,
            progress=False,
            agent_kwargs={"deficits": deficits},
        )
        runs[name] = read_trajectories(folder / f"{name}.jsonl")
    return runs


@pytest.mark.slow
def test_gold_analyst_selects_exactly_the_planted_deficits(planted_runs, tmp_path):
    result = identify(planted_runs["all"], GoldActionAnalyst(), tmp_path / "all")
    # corrupt_ids lacks two capabilities at once: its id, off by a digit, names no record, so the tool refuses it
    assert sorted(result.selected) == [
        "communicates_required_info",
        "complete_actions",
        "precise_arguments",
        "valid_tool_arguments",
    ]
    control = next(c for c in result.capabilities if c.name == "read_before_write")
    # Harmless: lacking about as often in successes as in failures, so it never passes K = 8 of 10 runs.
    assert not control.selected and abs(control.gap_mean) < 0.15 and control.runs_passed < 8
    for name in (
        "capabilities.json",
        "labels.jsonl",
        "runs.json",
        "report.md",
        "error_rates.png",
        "coverage.png",
        "stability.png",
    ):
        assert (tmp_path / "all" / name).exists()
    written = json.loads((tmp_path / "all" / "capabilities.json").read_text())
    assert [c["name"] for c in written["selected"]] == result.selected
    assert all(c["example_failed_task_ids"] for c in written["selected"])


@pytest.mark.slow
def test_switching_a_planted_deficit_off_makes_it_disappear(planted_runs):
    result = identify(planted_runs["no_end_early"], GoldActionAnalyst())
    assert sorted(result.selected) == ["communicates_required_info", "precise_arguments", "valid_tool_arguments"]


@pytest.mark.slow
def test_refused_calls_are_selected_only_where_a_deficit_makes_them(planted_runs):
    """Without corrupted ids no call is refused: neither precise_arguments nor valid_tool_arguments is selected."""
    result = identify(planted_runs["no_corrupt_ids"], GoldActionAnalyst())
    assert sorted(result.selected) == ["communicates_required_info", "complete_actions"]


@pytest.mark.slow
def test_the_selection_does_not_depend_on_the_order_of_the_episodes(planted_runs):
    """A batch, threads or a resume write the same episodes in another order: same runs, same selection."""
    shuffled = list(planted_runs["no_end_early"])
    random.Random(7).shuffle(shuffled)
    assert [t.episode_id for t in shuffled] != [t.episode_id for t in planted_runs["no_end_early"]]
    ordered, reordered = (
        identify(planted_runs["no_end_early"], GoldActionAnalyst()),
        identify(shuffled, GoldActionAnalyst()),
    )
    assert reordered.runs == ordered.runs
    assert reordered.selected == ordered.selected
    examples = [c.example_failed_task_ids for c in ordered.capabilities]
    assert [c.example_failed_task_ids for c in reordered.capabilities] == examples


@pytest.mark.slow
def test_max_selected_keeps_the_largest_gaps_and_reports_the_rest(planted_runs, tmp_path):
    full = identify(planted_runs["all"], GoldActionAnalyst())
    capped = identify(
        planted_runs["all"], GoldActionAnalyst(), tmp_path / "capped", config=SelectionConfig(max_selected=2)
    )
    passing = [c for c in full.capabilities if c.selected]  # sorted by mean gap, largest first
    assert capped.selected == [c.name for c in passing[:2]]
    assert [c.name for c in capped.capabilities if c.over_cap] == [c.name for c in passing[2:]]
    assert capped.runs == full.runs  # the cap changes what is kept, never the contrast
    report = (tmp_path / "capped" / "report.md").read_text()
    assert "at most 2 are selected, the largest mean gaps first" in report
    assert report.count("| over the cap |") == len(passing) - 2
    assert Identification.load(tmp_path / "capped").selected[1].name == passing[1].name


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_selected_below_one_is_refused(bad):
    with pytest.raises(SelectionError, match="max_selected must be a whole number, at least 1"):
        SelectionConfig(max_selected=bad)


def test_the_cap_keeps_the_largest_gaps_of_those_that_pass_ties_by_name():
    from trace_gym.identification.stats import CapabilityStats, select

    def run(gaps):  # one bootstrap run: a capability with a gap of None never passes
        return [
            CapabilityStats(n, 1, 0, 2, 2, 2, 0.0 if g is not None else None, g, g, 1.0, (0, 1), (0, 1), g is not None)
            for n, g in gaps.items()
        ]

    gaps = {"b": 0.5, "a": 0.5, "c": 0.9, "d": 0.3, "e": None}
    chosen = select([run(gaps)], {}, {}, SelectionConfig(runs=1, max_selected=2))
    assert [(c.name, c.verdict) for c in chosen] == [
        ("c", "yes"), ("a", "yes"), ("b", "over the cap"), ("d", "over the cap"), ("e", "no"),
    ]  # fmt: skip
    roomy = select([run(gaps)], {}, {}, SelectionConfig(runs=1, max_selected=9))
    assert [c.name for c in roomy if c.selected] == ["c", "a", "b", "d"] and not any(c.over_cap for c in roomy)


def recorded_analyst(gold_labels: dict[tuple[str, str], str]):
    """Answers recorded from an analysis: discovery (first answer malformed),
    a merge, and labels that replay the gold analyst's."""
    state = {"discovery_calls": 0}
    discovery = {
        "capabilities": [
            {"name": "precise_arguments", "description": "Use exact ids in state-changing calls."},
            {"name": "Exact arguments", "description": "Copy ids exactly from tool output."},
            {"name": "complete_actions", "description": "Make every state-changing call the user asked for."},
        ]
    }
    merge = {
        "groups": [
            {"name": "precise_arguments", "description": "Use exact ids in state-changing calls.", "members": [0, 1]},
            {
                "name": "complete_actions",
                "description": "Make every state-changing call the user asked for.",
                "members": [2],
            },
        ]
    }

    def answer(body):
        prompt = body["messages"][0]["content"]
        if prompt.startswith("You analyse why"):
            state["discovery_calls"] += 1
            if state["discovery_calls"] == 1:
                return {"content": "Sure! The agent seems to struggle with ids and with finishing tasks."}
            if state["discovery_calls"] == 2:
                # The retry is a conversation: the bad answer and what was wrong with it.
                state["retry"] = [m["content"] for m in body["messages"]]
            return {"content": "```json\n" + json.dumps(discovery) + "\n```"}
        if prompt.startswith("These capability descriptions"):
            return {"content": json.dumps(merge)}
        episode = prompt.split("episode ", 1)[1].split(",", 1)[0]
        if prompt.startswith("Label every capability"):
            names = [line.split('"')[1] for line in prompt.splitlines() if line.startswith('- "')]
            return {
                "content": json.dumps(
                    {
                        "labels": [
                            {
                                "capability": n,
                                "label": gold_labels[(episode, n)],
                                "evidence": {"message_index": 1, "quote": "x"},
                            }
                            for n in names
                        ]
                    }
                )
            }
        name = prompt.split('Capability "', 1)[1].split('"', 1)[0]
        return {
            "content": json.dumps(
                {"label": gold_labels[(episode, name)], "evidence": {"message_index": 2, "quote": "y"}}
            )
        }

    return answer, state


@pytest.mark.parametrize("per_trajectory", [False, True])
def test_llm_analyst_end_to_end_retries_and_caches(tmp_path, per_trajectory):
    trajectories = read_trajectories(make_small_planted(tmp_path))
    gold = {(x.episode_id, x.capability): x.label for t in trajectories for x in GoldActionAnalyst().label(t)}
    answer, state = recorded_analyst(gold)
    config = SelectionConfig(runs=3, min_runs=2)
    with OpenAIDouble(answer) as server:
        first = make_analyst(
            "openai:double",
            base_url=server.base_url,
            api_key="test-key",
            cache_dir=tmp_path / "cache",
            per_trajectory=per_trajectory,
        )
        result = identify(trajectories, first, tmp_path / "out", config=config)
        assert state["discovery_calls"] == 4  # 3 runs, the first answer malformed and asked again
        assert (
            len(state["retry"]) == 3 and state["retry"][1].startswith("Sure!") and "no JSON object" in state["retry"][2]
        )
        pairs = len(trajectories) * (1 if per_trajectory else 2)
        assert first.calls == 4 + 1 + pairs and first.tokens > 0
        assert (
            set(result.selected) <= {"precise_arguments", "complete_actions"} and "precise_arguments" in result.selected
        )
        prompts = [body["messages"][0]["content"] for body in server.requests]
        assert all(
            "a retail store's customer-service agent" in p for p in prompts if not p.startswith("These capability")
        )
        before = len(server.requests)
        second = make_analyst(
            "openai:double",
            base_url=server.base_url,
            api_key="test-key",
            cache_dir=tmp_path / "cache",
            per_trajectory=per_trajectory,
        )
        again = identify(trajectories, second, config=config)
        assert len(server.requests) == before and second.calls == 0 and second.cache_hits > 0
        assert again.selected == result.selected


def make_small_planted(tmp_path):
    out = tmp_path / "small.jsonl"
    rollout(
        "trace/tau2-retail-v0",
        "planted",
        out,
        split="test",
        limit=24,
        seed=2,
        progress=False,
        agent_kwargs={"deficits": {"corrupt_ids": 0.4, "end_early": 0.2}},
    )
    return out


def test_agreement_with_gold_is_reported(tmp_path):
    trajectories = read_trajectories(make_small_planted(tmp_path))
    gold = {(x.episode_id, x.capability): x.label for t in trajectories for x in GoldActionAnalyst().label(t)}
    answer, _ = recorded_analyst(gold)
    with OpenAIDouble(answer) as server:
        analyst = make_analyst("openai:double", base_url=server.base_url, api_key="test-key", per_trajectory=True)
        result = identify(
            trajectories, analyst, tmp_path / "out", config=SelectionConfig(runs=2, min_runs=1), compare_gold=True
        )
    assert result.agreement["precise_arguments"] == pytest.approx(1.0)  # the recording replays gold labels
    assert "Cohen's κ" in (tmp_path / "out" / "report.md").read_text()


def test_identify_cli_errors_are_one_line(tmp_path):
    oracle = tmp_path / "oracle.jsonl"
    rollout("trace/tau2-retail-v0", "oracle", oracle, split="test", limit=3, progress=False)
    result = run_cli("identify", "--trajectories", str(oracle), "--out", str(tmp_path / "o"))
    assert (
        result.returncode == 2
        and result.stderr.strip().splitlines()[-1]
        == "trace-gym: error: all 3 trajectories succeeded: there are no failures to explain"
    )
    result = run_cli("identify", "--trajectories", str(oracle), "--analyst", "magic", "--out", str(tmp_path / "o"))
    assert "unknown analyst 'magic'" in result.stderr and result.returncode == 2


def test_compare_gold_does_not_change_the_selection(tmp_path):
    out = tmp_path / "planted.jsonl"
    rollout(
        "trace/tau2-retail-v0",
        "planted",
        out,
        split="test",
        limit=24,
        seed=2,
        progress=False,
        agent_kwargs={"deficits": {"corrupt_ids": 0.4, "end_early": 0.2, "omit_info": 0.5}},
    )
    trajectories = read_trajectories(out)
    gold = {(x.episode_id, x.capability): x.label for t in trajectories for x in GoldActionAnalyst().label(t)}
    answer, _ = recorded_analyst(gold)
    config = SelectionConfig(runs=3, min_runs=2)
    with OpenAIDouble(answer) as server:
        results = [
            identify(
                trajectories,
                make_analyst("openai:double", base_url=server.base_url, api_key="test-key", per_trajectory=True),
                config=config,
                compare_gold=compare,
            )
            for compare in (False, True)
        ]
    plain, compared = results
    # The analyst's own labels of the gold capabilities (omit_info makes communicates_required_info
    # a strong contrast) serve kappa only: they are not candidates.
    assert compared.agreement["communicates_required_info"] == pytest.approx(1.0)
    assert compared.selected == plain.selected and "communicates_required_info" not in compared.selected
    assert [c.name for c in compared.capabilities] == [c.name for c in plain.capabilities]


def test_offline_analysts_take_the_llm_analysts_options_and_call_no_model(tmp_path):
    from trace_gym.errors import TraceGymError
    from trace_gym.identification.reference import ReferenceAnalyst

    cache = tmp_path / "cache"
    for spec, kind in (("gold", GoldActionAnalyst), ("reference", ReferenceAnalyst)):
        assert isinstance(make_analyst(spec, cache_dir=cache, per_trajectory=True), kind)
    assert not cache.exists()  # nothing to cache: no model was asked
    for spec in ("openai", "openai:"):  # a bare openai: names no model: refused with the offline choices too
        with pytest.raises(TraceGymError, match=f"unknown analyst '{spec}'; use gold, milestone, reference or openai"):
            make_analyst(spec, cache_dir=cache)
