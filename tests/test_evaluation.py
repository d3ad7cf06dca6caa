"""Evaluation as a stage of its own: typed artifacts between stages, method rows built
from an earlier run, `trace-gym evaluate` and `trace-gym route`, budget matching."""

import json
import shutil

import pytest

from conftest import capability, run_cli
from trace_gym.artifacts import (
    AdapterRecord,
    AdapterKind,
    AdapterSet,
    ArtifactError,
    EnvRecord,
    EnvSet,
    Identification,
    UntrainableRecord,
)
from trace_gym.config import to_table
from trace_gym.evaluation import (
    METHODS,
    EvalContext,
    Method,
    MethodResult,
    Unavailable,
    build_methods,
    get_method,
    load_results,
    method_result,
    register_method,
    results_table,
    specificity,
    task_flips,
    trace_budget,
    write_results,
)
from trace_gym.identification.stats import Label
from trace_gym.trajectory import Message, Trajectory

TARGET = "trace/tau2-retail-v0"


def _adapter(name, kind="capability", rollouts=16, **extra):
    return AdapterRecord(
        name,
        kind,
        [f"trace/{name}-v0"],
        f"/runs/adapters/{name}/adapter",
        f"/runs/adapters/{name}/train_log.jsonl",
        iterations=4,
        rollouts=rollouts,
        **extra,
    )


def _identification():
    return Identification(
        [
            capability("precise_arguments", "Exact ids."),
            capability("complete_actions", "Every write."),
            capability("communicates_required_info", "Say amounts.", selected=False),
        ],
        {"calls": 0, "tokens": 0},
        labels=[Label("e1", "precise_arguments", "LACKING", "wrong id"), Label("e1", "complete_actions", "PRESENT")],
    )


# --- typed artifacts ----------------------------------------------------------------------------


def test_each_artifact_round_trips_through_its_file(tmp_path):
    identified = _identification()
    identified.save(tmp_path / "identify")
    again = Identification.load(tmp_path / "identify")
    assert again == identified and [c.name for c in again.selected] == ["precise_arguments", "complete_actions"]
    assert [x.episode_id for x in again.lacking()["precise_arguments"]] == ["e1"]
    envs = EnvSet(
        [
            EnvRecord("precise_arguments", "trace/tool-precision-v0", "/r/tp", "reused", "passed", 0),
            EnvRecord("complete_actions", None, None, "failed", "-", 3, "no env passed"),
        ]
    )
    assert EnvSet.load(envs.save(tmp_path / "envs")) == envs
    assert envs.trainable() == {"precise_arguments": "trace/tool-precision-v0"}
    adapters = AdapterSet(
        [_adapter("precise_arguments"), _adapter("merged", "baseline", 32)],
        [UntrainableRecord("complete_actions", ["trace/complete-actions-v0"], "out of band")],
    )
    loaded = AdapterSet.load(adapters.save(tmp_path / "adapters"))
    assert loaded == adapters and loaded.of_kind(AdapterKind.BASELINE)[0].kind is AdapterKind.BASELINE
    saved = tmp_path / "adapters" / "adapters.json"
    saved.write_text(saved.read_text().replace('"kind": "baseline"', '"kind": "baselin"'))
    with pytest.raises(
        ArtifactError, match="adapter 'merged' has kind 'baselin' \\(one of capability, baseline, control\\)"
    ):
        AdapterSet.load(saved)
    results = [
        MethodResult(
            "base",
            2,
            2,
            0.5,
            (0.1, 0.9),
            {1: 0.5},
            0.5,
            lacking={"x": {"episodes": 2, "lacking": 1, "rate": 0.5, "ci": [0.1, 0.9]}},
        )
    ]
    write_results(results, tmp_path / "eval")
    assert load_results(tmp_path / "eval") == results


@pytest.mark.parametrize(
    "rename, field",
    [
        (("rollouts", "rollout"), "rollout"),
        (("train_log", "log"), "log"),
    ],
)
def test_a_field_renamed_in_one_place_fails_every_reader_in_one_line(tmp_path, rename, field):
    AdapterSet([_adapter("precise_arguments")]).save(tmp_path)
    path = tmp_path / "adapters.json"
    path.write_text(path.read_text().replace(f'"{rename[0]}":', f'"{rename[1]}":'))
    with pytest.raises(ArtifactError, match=f"unknown field '{field}'.*missing field '{rename[0]}'"):
        AdapterSet.load(path)
    Identification([capability("a", "A.")]).save(tmp_path / "id")
    caps = tmp_path / "id" / "capabilities.json"
    caps.write_text(caps.read_text().replace('"coverage_mean":', '"coverage":'))
    with pytest.raises(ArtifactError, match="missing field 'coverage_mean'"):
        Identification.load(tmp_path / "id")


def test_the_report_gives_each_adapters_calibration_from_its_file_or_says_why_not(tmp_path):
    """The training table reads calibration.json through its typed loader: the chosen level's
    mean reward and informative, all-zero and all-success shares; a file whose field was
    renamed is said to be unreadable, never shown as 0%."""
    from trace_gym.pipeline.report import _train_section
    from trace_gym.training.calibration import Calibration, LevelFigures, save_calibrations

    figures = LevelFigures(level=1, groups=[[0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.5, 0.5]], episodes=8)
    path = save_calibrations(
        tmp_path / "calibration.json",
        [Calibration("trace/x-v0", "m", [figures], 1, True, "in band", [0.2, 0.6], 0.5)],
    )
    made = AdapterSet([_adapter("precise_arguments", calibration=str(path))])
    [row] = [line for line in _train_section({}, tmp_path, made) if line.startswith("| precise_arguments")]
    assert "| 1 | 0.500, 25% / 25% / 25% |" in row
    path.write_text(path.read_text().replace('"groups":', '"rewards":'))
    [row] = [line for line in _train_section({}, tmp_path, made) if line.startswith("| precise_arguments")]
    assert "not shown:" in row and "is not a calibration file" in row and "%" not in row
    path.write_text(path.read_text().replace('"rewards":', '"groups":').replace('"level": 1,', '"level": 3,', 1))
    [row] = [line for line in _train_section({}, tmp_path, made) if line.startswith("| precise_arguments")]
    assert "not shown: the calibration of trace/x-v0 chose level" in row  # (a level it never played)


def test_another_schema_version_and_damaged_files_are_refused(tmp_path):
    (tmp_path / "adapters.json").write_text(json.dumps({"version": 99, "adapters": []}))
    with pytest.raises(ArtifactError, match="schema version 99"):
        AdapterSet.load(tmp_path)
    (tmp_path / "envs.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="damaged"):
        EnvSet.load(tmp_path / "envs.json")
    with pytest.raises(ArtifactError, match="no file at .*capabilities.json .run trace-gym identify first"):
        Identification.load(tmp_path / "missing")
    (tmp_path / "adapters.json").write_text(
        json.dumps([{**json.loads(json.dumps(_adapter("x").__dict__)), "kind": "lora"}])
    )
    with pytest.raises(ArtifactError, match="kind 'lora'"):
        AdapterSet.load(tmp_path)


def test_files_written_before_versioning_still_load(tmp_path):
    row = {k: v for k, v in _adapter("precise_arguments").__dict__.items()}
    (tmp_path / "adapters.json").write_text(json.dumps([row]))
    assert AdapterSet.load(tmp_path).adapters[0].name == "precise_arguments"


# --- methods and budget ---------------------------------------------------------------------------


def test_budget_matching_gives_every_baseline_the_capability_adapters_rollouts():
    from trace_gym.pipeline import PipelineConfig, RunSettings, grpo_config, training_plan

    config = PipelineConfig(RunSettings(TARGET))
    plan = training_plan(
        config, {"precise_arguments": "trace/tool-precision-v0", "complete_actions": "trace/complete-actions-v0"}
    )

    def rollouts(job):
        run = grpo_config(config, job["envs"], "/tmp/x", iterations_scale=job["scale"])
        return run.iterations * run.groups * run.rollouts_per_group

    capability_total = sum(rollouts(j) for j in plan if j["kind"] == "capability")
    baselines = [j for j in plan if j["kind"] == "baseline"]
    assert [j["name"] for j in baselines] == ["grpo-target", "merged"]
    assert all(rollouts(j) == capability_total for j in baselines)
    made = AdapterSet([_adapter("a", rollouts=160), _adapter("b", rollouts=160), _adapter("merged", "baseline", 320)])
    assert trace_budget(made) == 320


class ScoringBackend:
    """A policy that can score labels (what a router needs) and add no adapters' weights."""

    name = "scoring"

    def score(self, conversation, labels, **_):
        return {label: 0.0 for label in labels}


def test_each_method_says_why_this_run_cannot_build_it():
    ctx = EvalContext(TARGET, backend=ScoringBackend(), adapters=AdapterSet([_adapter("precise_arguments")]))
    said = []
    built = build_methods(["base", "trace", "grpo-target", "merged", "summed", "control", "gepa"], ctx, said.append)
    assert [name for name, _, _ in built] == ["base", "trace"]
    assert any("summed: summing needs two or more capability adapters" in s for s in said)
    assert any("control: no control adapter was trained" in s for s in said)
    assert any("gepa: the gepa stage did not run" in s for s in said)
    assert any("grpo-target: no 'grpo-target' adapter was trained" in s for s in said)
    name, trace, cost = built[1]
    assert trace.agent == "routed" and trace.routed == ["precise_arguments"] and cost["train_rollouts"] == 16


def test_a_user_registers_a_method_of_their_own():
    class Greedy(Method):
        name = "greedy-test"

        def build(self, ctx):
            if ctx.gepa is None:
                raise Unavailable("nothing")
            return None

    try:
        register_method(Greedy)
        assert isinstance(get_method("greedy-test"), Greedy)
        with pytest.raises(Exception, match="already registered"):
            register_method(type("Other", (Method,), {"name": "greedy-test"}))
    finally:
        METHODS.pop("greedy-test", None)
    with pytest.raises(Exception, match="unknown method 'nope'"):
        get_method("nope")


def _episode(eid, task, success, route=None):
    return Trajectory(
        episode_id=eid,
        env_id=TARGET,
        task_id=task,
        agent="x",
        messages=[Message(role="user", content="t")],
        reward=float(success),
        terminated=True,
        truncated=False,
        steps=1,
        started_at="2026-01-01T00:00:00",
        wall_s=1.0,
        agent_info={"route": route} if route else {},
    )


def test_routing_accuracy_only_where_a_truth_exists_and_flips_and_specificity():
    played = [
        _episode("a", "1", True, {"capability": "precise_arguments"}),
        _episode("b", "2", False, {"capability": None}),
    ]
    no_truth = method_result("trace", played, groups={}, routed_capabilities=["precise_arguments"])
    assert no_truth.routing["accuracy"] is None and no_truth.routing["routed"] == {"none": 1, "precise_arguments": 1}
    assert "| n/a |" in results_table([no_truth])
    truth = method_result(
        "trace", played, groups={"precise_arguments": {"1"}}, routed_capabilities=["precise_arguments"]
    )
    assert truth.routing["accuracy"] == 1.0
    base = [_episode("c", "1", False), _episode("d", "2", True)]
    assert task_flips(base, played) == {"gained": ["1"], "lost": ["2"]}
    before = MethodResult("base", 2, 2, 0.5, (0, 1), {}, 0.5, lacking={"p": {"rate": 0.6}, "q": {"rate": 0.2}})
    after = MethodResult("trace", 2, 2, 0.5, (0, 1), {}, 0.5, lacking={"p": {"rate": 0.2}, "q": {"rate": 0.3}})
    figures = specificity(before, after, ["p"])
    assert figures["targeted"] == pytest.approx(-0.4) and figures["untargeted"] == pytest.approx(0.1)
    # a route to a capability base's episodes were never labelled for has no truth either
    unmeasured = method_result(
        "control", played, groups={"complete_actions": {"1"}}, routed_capabilities=["precise_arguments"]
    )
    assert unmeasured.routing["accuracy"] is None


def test_lacking_rates_count_only_the_episodes_where_a_capability_applies():
    from trace_gym.evaluation import lacking_rates

    labels = [
        Label("a", "p", "LACKING"),
        Label("b", "p", "PRESENT"),
        Label("c", "p", "NOT_APPLICABLE"),
        Label("d", "p", "NOT_APPLICABLE"),
        Label("a", "q", "NOT_APPLICABLE"),
    ]
    rates = lacking_rates(labels, ["p", "q"])
    assert rates["p"]["rate"] == 0.5 and rates["p"]["episodes"] == 2 and rates["p"]["not_applicable"] == 2
    assert rates["q"]["rate"] is None and rates["q"]["ci"] is None


# --- trace-gym evaluate and route over an earlier run ------------------------------------------------


def _lora(folder, base_folder, b=0.0):
    """A real peft LoRA for the model in ``base_folder``; B = 0 (peft's start) leaves the
    policy unchanged."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_folder))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.fill_(b)
    model.save_pretrained(folder)


def _model_folder(run):
    """The folder of an ``_earlier_run``'s policy: a tiny random model beside the run's folder."""
    return run.parent / "model"


def _policy(run) -> str:
    """An ``_earlier_run``'s policy, as its config names it."""
    return f"hf:{_model_folder(run)}"


def _earlier_run(tmp_path):
    """The artifacts a finished `trace-gym run` leaves, made by their own classes. The
    policy is a tiny random model (``_policy``): what is checked is how each method row
    is built and played, not what the model says (with the 135M model, prefilling
    τ²-retail's system turn under each row's adapter was most of what this cost)."""
    from families import tiny_model_folder

    from trace_gym.pipeline import EvaluateStage, PipelineConfig, RunSettings, RunState, StageRecord, TrainStage

    run = tmp_path / "run"
    model = tiny_model_folder(_model_folder(run), init=0.5)  # distinct logits: greedy tokens that floats do not flip
    _identification().save(run / "identify")
    _lora(tmp_path / "lora", model)
    _lora(tmp_path / "lora-trained", model, b=1e-3)
    records = []
    for name, kind, extra in (
        ("precise_arguments", "capability", {}),
        ("complete_actions", "capability", {}),
        ("grpo-target", "baseline", {}),
        ("merged", "baseline", {}),
        ("control-communicates_required_info", "control", {"capability": "communicates_required_info"}),
    ):
        folder = run / "adapters" / name
        shutil.copytree(tmp_path / ("lora" if name != "merged" else "lora-trained"), folder / "adapter")
        (folder / "train_log.jsonl").write_text(json.dumps({"iteration": 1, "mean_reward": 0.1, "rollouts": 8}) + "\n")
        records.append(
            AdapterRecord(
                name,
                kind,
                [TARGET],
                str(folder / "adapter"),
                str(folder / "train_log.jsonl"),
                1,
                rollouts=16 if kind == "baseline" else 8,
                **extra,
            )
        )
    AdapterSet(records).save(run / "adapters")
    config = PipelineConfig(
        RunSettings(TARGET, dir=str(run), stages=["identify", "train", "evaluate"]),
        train=TrainStage(control=["communicates_required_info"]),
        evaluate=EvaluateStage(tasks=1, samples=1, max_steps=4),
    )
    config.policy.model = _policy(run)
    config.policy.max_new_tokens = 24
    config.policy.chat_template = "chatml_compact_tools"  # a policy's template travels to every row
    (run / "config.json").write_text(json.dumps(to_table(config), indent=2))
    state = RunState(run)
    state.stages["identify"] = StageRecord(
        "identify", "x", {"dir": str(run / "identify"), "selected": [], "analyst_calls": 3}, 1.0, "t"
    )
    state.stages["train"] = StageRecord(
        "train", "x", {"adapters_json": str(run / "adapters" / "adapters.json")}, 1.0, "t"
    )
    state.save()
    return run


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """An earlier run evaluated by `trace-gym evaluate` on every method row; tests that
    evaluate it again work on a copy."""
    run = _earlier_run(tmp_path_factory.mktemp("evaluated"))
    result = run_cli("evaluate", str(run), "--methods", "base,trace,grpo-target,merged,summed,control", timeout=1200)
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.slow
def test_evaluate_plays_every_method_row_from_an_earlier_runs_artifacts(evaluated_run, tmp_path):
    run = evaluated_run
    rows = {r.method: r for r in load_results(run / "eval")}
    assert list(rows) == ["base", "trace", "grpo-target", "merged", "summed", "control"]
    from trace_gym.llm import make_backend
    from trace_gym.store import read_run_settings, read_trajectories

    played = {
        read_run_settings(run / "eval" / f"{m}.jsonl")[0]["agent_options"]["model"] for m in rows if m != "grpo-target"
    }
    assert played == {f"{_policy(run)}?template=chatml_compact_tools"}  # every row under the policy's template

    summed = run / "eval" / "summed-adapter"  # saved, and loads where any adapter does
    make_backend(_policy(run)).load_adapter("summed", str(summed))
    assert json.loads((summed / "adapter_config.json").read_text())["r"] == 4  # two rank-2 adapters, concatenated
    assert all(r.episodes == 1 and r.tasks == 1 for r in rows.values())
    assert rows["trace"].routing["accuracy"] is not None  # the gold analyst's labels of base are a truth
    assert rows["control"].routing is not None and rows["summed"].routing is None
    assert rows["trace"].cost["train_rollouts"] == 16 and rows["trace"].cost["analyst_calls"] == 3
    assert rows["grpo-target"].cost == {"train_rollouts": 16, "analyst_calls": 0, "wall_s": 0}
    # grpo-target's adapter is B = 0, the base policy itself: base's episodes are scored for it, said so
    assert not (run / "eval" / "grpo-target.jsonl").exists() and (run / "eval" / "merged.jsonl").exists()
    assert "adds nothing" in rows["grpo-target"].note and not rows["merged"].note
    assert "- grpo-target: its adapter adds nothing" in (run / "eval" / "results.md").read_text()
    assert rows["merged"].cost["analyst_calls"] == 3
    assert set(rows["base"].lacking) == {"precise_arguments", "complete_actions", "communicates_required_info"}
    assert rows["base"].flips == {} and set(rows["trace"].flips) == {"gained", "lost"}
    assert set(rows["trace"].specificity) == {"targeted", "untargeted"} and not rows["grpo-target"].specificity
    [episode] = read_trajectories(run / "eval" / "trace.jsonl")
    assert episode.agent_info["route"]["capability"] in {"precise_arguments", "complete_actions", None}
    report = (run / "report.md").read_text()
    assert "## 5. Evaluation" in report and "| summed |" in report and "LACKING (95% CI)" in report

    routed = run_cli("route", str(run), "--message", "I want to return the blue headphones from order W123.", "--json")
    assert routed.returncode == 0, routed.stderr
    decision = json.loads(routed.stdout.splitlines()[0])
    assert decision["capability"] in {"precise_arguments", "complete_actions", None} and set(decision["scores"]) == {
        "A",
        "B",
        "none",
    }
    per_task = run_cli("route", str(run), "--tasks", "2")  # the openings of the evaluation split's first tasks
    assert per_task.returncode == 0 and len(per_task.stdout.splitlines()) == 2, per_task.stderr
    assert all(  # the scores by capability name, not by the router's letters
        "(adapter " in line and "precise_arguments " in line and "complete_actions " in line and "scores A " not in line
        for line in per_task.stdout.splitlines()
    )

    # Moved elsewhere, the run is still evaluated from its own files (the folder its files
    # name is gone meanwhile; the fixture's run is put back for the next test); a narrower
    # evaluation counts only the episodes it asked for, not every episode the files hold.
    # Asked before base, the null grpo-target still borrows base's episodes; asked alone it
    # has none to borrow: it is played, and no note claims otherwise.
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    aside = tmp_path / "aside"
    run.rename(aside)
    try:
        again = run_cli("evaluate", str(moved), "--methods", "grpo-target,base", "--tasks", "1", timeout=600)
    finally:
        aside.rename(run)
    assert again.returncode == 0, again.stderr
    rows = {r.method: r for r in load_results(moved / "eval")}
    assert list(rows) == ["grpo-target", "base"] and rows["base"].episodes == 1
    assert not (moved / "eval" / "grpo-target.jsonl").exists() and "adds nothing" in rows["grpo-target"].note
    alone = run_cli("evaluate", str(moved), "--methods", "grpo-target", "--tasks", "1", timeout=600)
    assert alone.returncode == 0, alone.stderr
    [row] = load_results(moved / "eval")
    assert (moved / "eval" / "grpo-target.jsonl").exists() and row.note == ""


def test_evaluate_and_route_refuse_what_is_not_a_run_in_one_line(tmp_path):
    for verb in ("evaluate", "route"):
        result = run_cli(verb, str(tmp_path))
        assert result.returncode == 2 and "holds no run of trace-gym run" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    run = tmp_path / "r"
    run.mkdir()
    (run / "state.json").write_text('{"stages": {}}')
    (run / "config.json").write_text(json.dumps({"run": {"target": TARGET, "dir": str(run)}}))
    result = run_cli("evaluate", str(run), "--methods", "base,nope")
    assert result.returncode == 2 and "nope" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = run_cli("route", str(run), "--message", "hi")
    assert result.returncode == 2 and "nothing to route to" in result.stderr, result.stderr


def test_serving_the_policy_elsewhere_redoes_evaluation_and_nothing_before_it(tmp_path):
    from trace_gym.pipeline import STAGES, PipelineConfig, RunSettings, RunState, StageRecord, stage_inputs_hash

    config = PipelineConfig(RunSettings(TARGET, dir=str(tmp_path)))
    state = RunState(tmp_path)
    state.stages = {s: StageRecord(s, "x", {"out": s}, 1.0, "t") for s in STAGES}
    before = {s: stage_inputs_hash(config, s, state) for s in STAGES}
    config.evaluate.model = "vllm:smollm2-135m-instruct"
    after = {s: stage_inputs_hash(config, s, state) for s in STAGES}
    assert [s for s in STAGES if before[s] != after[s]] == ["evaluate"]
    assert config.eval_model == "vllm:smollm2-135m-instruct"
    config.policy.chat_template = "qwen3_training"  # the server's client renders as the policy was trained
    assert config.eval_model == "vllm:smollm2-135m-instruct?template=qwen3_training"
    assert all(stage_inputs_hash(config, s, state) != after[s] for s in STAGES)
    config.policy.model = "hf:/models/other"  # another policy is another run: every stage again
    assert all(stage_inputs_hash(config, s, state) != after[s] for s in STAGES)


def test_settings_added_later_leave_an_earlier_runs_stage_hashes_alone(tmp_path):
    """A run recorded before `[policy] chat_template`, `[evaluate] model` and
    `[identify.selection] max_selected` existed resumes with its stages kept: a late setting
    at its default is not hashed."""
    from trace_gym.pipeline import STAGES, PipelineConfig, RunSettings, RunState, stage_inputs_hash
    from trace_gym.pipeline.state import hashed_settings

    config = PipelineConfig(RunSettings(TARGET, dir=str(tmp_path)))
    assert "chat_template" not in hashed_settings("policy", to_table(config.policy))
    assert "model" not in hashed_settings("evaluate", to_table(config.evaluate))
    selection = hashed_settings("identify", to_table(config.identify))["selection"]
    assert "max_selected" not in selection and selection["runs"] == 10
    assert "max_selected" in to_table(config.identify)["selection"]  # the run's own table keeps it
    state = RunState(tmp_path)
    before = {s: stage_inputs_hash(config, s, state) for s in STAGES}
    config.identify.selection.max_selected = 2
    assert stage_inputs_hash(config, "identify", state) != before["identify"]
    config.policy.chat_template = "stock"
    assert all(stage_inputs_hash(config, s, state) != before[s] for s in STAGES)


@pytest.mark.slow
def test_evaluate_plays_the_same_episodes_through_a_vllm_server_of_the_policy(evaluated_run, tmp_path):
    """`trace-gym evaluate RUN --model vllm:M`: the run's adapters are loaded into the server
    and the same greedy episodes come back; the earlier, in-process evaluation is kept aside."""
    from test_serve import serving

    from trace_gym.store import read_run_settings, read_trajectories

    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)  # evaluated in process, every row
    [in_process] = read_trajectories(run / "eval" / "base.jsonl")
    policy = _policy(evaluated_run)
    with serving("--model", policy, "--allow-adapter-loading") as url:
        served = run_cli(
            "evaluate",
            str(run),
            "--methods",
            "base,trace",
            "--model",
            f"vllm:{policy}",
            env={"OPENAI_BASE_URL": url},
            timeout=900,
        )
    assert served.returncode == 0, served.stderr
    assert "kept as" in served.stderr and (run / "eval" / "earlier" / "base.1.jsonl").exists()
    [remote] = read_trajectories(run / "eval" / "base.jsonl")
    played = read_run_settings(run / "eval" / "base.jsonl")[0]["agent_options"]["model"]
    assert played == f"vllm:{policy}?template=chatml_compact_tools"  # rendered as the policy's rows are
    assert [m.content for m in remote.messages] == [m.content for m in in_process.messages]
    assert remote.reward == in_process.reward
    rows = {r.method: r for r in load_results(run / "eval")}
    assert list(rows) == ["base", "trace"] and rows["trace"].episodes == 1
