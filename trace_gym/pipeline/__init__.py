"""The whole TRACE loop as one command: ``trace-gym run CONFIG [--resume] [--from STAGE]``.

A TOML config names the target, the policy, the analyst and each stage's
settings (defaults = the paper's); every stage writes into one run directory::

    RUN/rollouts/   the base policy on the target's train split (trajectories.jsonl)
    RUN/identify/   capabilities.json, labels.jsonl, report.md (identification)
    RUN/envs/       one training env per selected capability (envs.json)
    RUN/adapters/   one LoRA adapter per capability, and the baselines' (adapters.json)
    RUN/gepa/       the GEPA baseline's search, when the config asks for it (best_prompt.txt, search.jsonl)
    RUN/eval/       every method on the held-out split (results.json/.md, plots)
    RUN/report.md   the whole run, every figure read from the files above

``state.json`` records, per stage, a hash of its inputs (its settings and the
upstream outputs it read). With ``--resume`` a finished stage whose inputs have
not changed is not redone, and an unfinished one continues from its own
checkpoints (rollouts and training resume); ``--from STAGE`` redoes that stage
and everything after it. A bad config is one line naming the field, before any
work starts.

The package, one job per module:

- ``config``: the TOML sections as dataclasses, read and checked before any work;
- ``state``: ``state.json`` and the input hashes that decide what is redone;
- ``stages``: one function per stage, each a library call (``rollout``, ``identify``,
  ``synthesize``, ``train``, ``gepa``, ``evaluate``) that reads its upstream outputs;
- ``report``: ``report.md``, every figure read back from the run's files;
- here: sequencing the stages (``run_pipeline``), and ``trace-gym evaluate`` and
  ``trace-gym route`` over an earlier run's artifacts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..config import to_table
from ..evaluation import Unavailable, get_method
from ..llm import make_backend
from ..registry import make
from ..training.ranks import world_size
from .config import (
    DEFAULT_STAGES,
    METHODS,
    STAGES,
    Endpoint,
    EvaluateStage,
    GEPAStage,
    IdentifyStage,
    PipelineConfig,
    PolicySettings,
    RolloutStage,
    RunSettings,
    SynthesizeStage,
    TrainStage,
    check_config,
    check_no_held_out_task,
    config_from_data,
    gepa_config,
    grpo_config,
    load_config,
)
from .report import write_report
from .stages import STAGE_FUNCTIONS, eval_context, training_plan
from .state import PipelineError, RunState, StageRecord, stage_inputs_hash

__all__ = [
    "DEFAULT_STAGES",
    "METHODS",
    "STAGES",
    "Endpoint",
    "EvaluateStage",
    "GEPAStage",
    "IdentifyStage",
    "PipelineConfig",
    "PipelineError",
    "PolicySettings",
    "RolloutStage",
    "RunSettings",
    "RunState",
    "StageRecord",
    "SynthesizeStage",
    "TrainStage",
    "check_config",
    "config_from_data",
    "eval_context",
    "evaluate_run",
    "gepa_config",
    "grpo_config",
    "load_config",
    "load_run",
    "route_run",
    "run_pipeline",
    "stage_inputs_hash",
    "training_plan",
]


def run_pipeline(
    config: PipelineConfig, *, resume: bool = False, from_stage: str | None = None, say: Callable[[str], None] = print
) -> Path:
    """Run the configured stages in order; returns the path of ``report.md``."""
    run_dir = config.run_dir
    check_no_held_out_task(config)
    if world_size() > 1:
        raise PipelineError(
            f"trace-gym run under a launcher ({world_size()} ranks): every rank would run every stage; run the "
            "pipeline as one process (a launcher spreads `trace-gym train` over ranks, one job at a time)"
        )
    if from_stage is not None and from_stage not in config.run.stages:
        raise PipelineError(f"--from {from_stage}: not one of this run's stages ({', '.join(config.run.stages)})")
    if run_dir.exists() and (run_dir / "state.json").exists() and not resume and from_stage is None:
        raise PipelineError(
            f"{run_dir} already holds a run; pass --resume to continue it (finished stages with "
            "unchanged inputs are kept) or --from STAGE to redo from a stage, or choose another [run] dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_table(config), indent=2, default=str) + "\n")
    state = RunState(run_dir)
    redo = False
    for stage in config.run.stages:
        redo = redo or stage == from_stage
        inputs = stage_inputs_hash(config, stage, state)
        record = state.stages.get(stage)
        if record and record.inputs_hash == inputs and not redo:
            say(f"[{stage}] unchanged since {record.finished_at}; kept ({_summary(record.outputs)})")
            continue
        _run_stage(config, state, stage, say)

    return write_report(config, state)


def _run_stage(config: PipelineConfig, state: RunState, stage: str, say: Callable[[str], None]) -> None:
    inputs = stage_inputs_hash(config, stage, state)
    say(f"[{stage}] running")
    started = time.perf_counter()
    outputs = STAGE_FUNCTIONS[stage](config, state, lambda m, s=stage: say(f"[{s}] {m}"))
    state.stages[stage] = StageRecord(
        stage,
        inputs,
        outputs,
        round(time.perf_counter() - started, 1),
        datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    # A redone stage invalidates what came after it: their recorded inputs no longer match.
    state.save()
    say(f"[{stage}] done in {state.stages[stage].wall_s:.0f}s ({_summary(outputs)})")


def load_run(run_dir: str | Path) -> tuple[PipelineConfig, RunState]:
    """An earlier run's config and state (``config.json``, ``state.json`` in its folder)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not (run_dir / "state.json").exists() or not path.exists():
        raise PipelineError(f"{run_dir} holds no run of trace-gym run (no config.json and state.json there)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path} is damaged ({exc})") from None
    config = config_from_data(data)
    state = RunState(run_dir)
    if Path(config.run.dir) != run_dir:  # moved, or named from another folder: its recorded paths follow it
        state.relocate(config.run.dir, str(run_dir))
    config.run.dir = str(run_dir)
    return config, state


def evaluate_run(
    run_dir: str | Path,
    *,
    methods: list[str] | None = None,
    split: str | None = None,
    tasks: int | None = None,
    samples: int | None = None,
    model: str | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """``trace-gym evaluate RUN``: the evaluate stage alone, over the artifacts of an
    earlier run, with its ``[evaluate]`` settings or these; returns ``report.md``."""
    config, state = load_run(run_dir)
    changes = {
        k: v
        for k, v in {"methods": methods, "split": split, "tasks": tasks, "samples": samples, "model": model}.items()
        if v is not None
    }
    config.evaluate = dataclasses.replace(config.evaluate, **changes)
    if "evaluate" not in config.run.stages:
        config.run.stages = [*config.run.stages, "evaluate"]
    check_config(config)
    if changes:
        (config.run_dir / "config.json").write_text(json.dumps(to_table(config), indent=2, default=str) + "\n")
    _run_stage(config, state, "evaluate", say)

    return write_report(config, state)


def route_run(
    run_dir: str | Path, *, messages: list[str] | None = None, split: str | None = None, tasks: int | None = None
) -> list[tuple[str, Any]]:
    """``trace-gym route RUN``: the routing decision of TRACE's router, built from an
    earlier run's artifacts, for each message, or for the first observation of each task
    of ``split`` (the first ``tasks``); returns (task or message, decision) pairs."""
    config, state = load_run(run_dir)
    ctx = eval_context(
        config, state, make_backend(config.eval_model, **config.eval_endpoint)
    )  # the base model routes: no adapter needed
    try:
        router = get_method("trace").build(ctx).kwargs["router"]
    except Unavailable as exc:
        raise PipelineError(f"{run_dir}: nothing to route to ({exc})") from None
    if messages:
        return [(m, router.route(m)) for m in messages]

    env = make(config.run.target, split=split or config.evaluate.split)
    try:
        ids = list(env.unwrapped.task_ids)[:tasks]
        out = []
        for task_id in ids:
            observation, _ = env.reset(options={"task_id": task_id})
            out.append((task_id, router.route(observation)))
        return out
    finally:
        env.close()


def _summary(outputs: dict[str, Any]) -> str:
    return outputs.get("summary", "")
