"""The stages of ``trace-gym run``: each reads its upstream stages' recorded outputs and returns its own."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from ..artifacts import AdapterKind, AdapterRecord, AdapterSet, EnvRecord, EnvSet, Identification, UntrainableRecord
from ..errors import TraceGymError
from ..evaluation import (
    EvalContext,
    baseline_scale,
    build_methods,
    lacking_rates,
    method_result,
    policy_backend,
    specificity,
    task_flips,
    trace_budget,
    write_results,
)
from ..gepa_baseline import run_gepa
from ..identification import identify, label_all, make_analyst
from ..identification.stats import DegenerateInputError, LACKING
from ..llm.base import SumsAdapters
from ..registry import add_registry_dir, make, read_manifest
from ..rollout import Player, rollout, rollout_players
from ..seeding import derive_seed
from ..store import read_run_settings, read_trajectories, write_trajectories
from ..synthesis import serving_envs, synthesize
from ..training.jobs import Job, train_jobs, visible_gpus
from ..training.log import TrainLog
from .config import PipelineConfig, gepa_config, grpo_config
from .state import PipelineError, RunState, content_hash, stage_inputs_hash


def _agent_kwargs(config: PipelineConfig, **extra: Any) -> dict[str, Any]:
    return {
        "model": config.policy.spec,
        "temperature": config.policy.temperature,
        "max_new_tokens": config.policy.max_new_tokens,
        **config.policy.endpoint(),
        **extra,
    }


def stage_rollout(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    if config.rollout.trajectories:
        return _given_trajectories(config)
    # One file per distinct set of settings: changed settings start a new file, the same ones resume it.
    out = config.run_dir / "rollouts" / f"trajectories-{stage_inputs_hash(config, 'rollout', state)[:10]}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    env_kwargs = {"max_steps": config.rollout.max_steps} if config.rollout.max_steps else {}

    def set_aside(path: Path) -> None:  # e.g. played before in another dtype: kept, not resumed
        say(f"{path.name} holds episodes of other settings: kept at {_set_aside(path, out.parent / 'earlier')}")

    def play(who: str, path: Path, limit: int | None = config.rollout.tasks) -> dict[str, Any]:
        if who == "policy":
            agent, agent_kwargs = "llm", _agent_kwargs(config)
        else:
            agent, agent_kwargs = who, ({"deficits": config.rollout.deficits} if config.rollout.deficits else {})
        summary = rollout(
            config.run.target,
            agent,
            path,
            agent_kwargs=agent_kwargs,
            split=config.rollout.split,
            limit=limit,
            samples=config.rollout.samples,
            seed=config.run.seed,
            resume=True,
            env_kwargs=env_kwargs,
            executor=config.rollout.executor,
            workers=config.policy.workers if agent == "llm" else 1,
            batch=config.policy.batch if agent == "llm" else 1,
            set_aside=set_aside,
        )  # batching is for model generation
        return {
            "trajectories": str(path),
            "sha256": content_hash(path),
            "agent": who,
            "deficits": config.rollout.deficits if who != "policy" else {},
            "episodes": summary.episodes,
            "successes": summary.successes,
            "pass_rate": summary.successes / max(summary.episodes, 1),
            "mean_reward": summary.mean_reward,
            "wall_s": summary.wall_s,
            "summary": f"{summary.episodes} episodes, pass rate {summary.successes / max(summary.episodes, 1):.3f}",
        }

    ceilings = check_ceilings(config, out.parent, say)
    played = play(config.rollout.agent, out)
    short = [
        side
        for side, n in (("successes", played["successes"]), ("failures", played["episodes"] - played["successes"]))
        if n < config.rollout.min_contrast
    ]
    if config.rollout.agent == "policy" and config.rollout.fallback and short:
        who = config.rollout.fallback
        reason = (
            f"the policy's {played['episodes']} episodes hold {played['successes']} successes and "
            f"{played['episodes'] - played['successes']} failures, fewer than {config.rollout.min_contrast} of each "
            "to contrast"
        )
        # (the whole split: a scripted fallback costs no model time, and selection needs contrast)
        other = play(who, out.with_name(out.stem + f"-{who}.jsonl"), None)
        mixed = out.with_name(out.stem + "-contrast.jsonl")
        added = write_stand_ins(Path(played["trajectories"]), Path(other["trajectories"]), mixed, short)
        said = " and ".join(f"{added[side]} {side}" for side in short)
        say(f"{reason}: the {who} agent's {said} stand in for the policy's; its own episodes are all kept")
        episodes, successes = played["episodes"] + sum(added.values()), played["successes"] + added["successes"]
        if min(successes, episodes - successes) < config.rollout.min_contrast:
            say(f"still fewer than {config.rollout.min_contrast} of each with them: identification may select nothing")
        return {
            "trajectories": str(mixed),
            "sha256": content_hash(mixed),
            "agent": "policy",
            "episodes": episodes,
            "successes": successes,
            "pass_rate": successes / max(episodes, 1),
            "wall_s": played["wall_s"] + other["wall_s"],
            "policy": played,
            "stand_in": {**other, "sides": short, "added": added},
            "fallback_reason": reason,
            "ceilings": ceilings,
            "summary": f"policy: {played['summary']}; too few to contrast, {who} adds {said}",
        }
    return {**played, "ceilings": ceilings}


def write_stand_ins(own: Path, other: Path, out: Path, sides: list[str]) -> dict[str, int]:
    """One file for identification: every episode of ``own`` and, of ``other``, those on the
    ``sides`` (``successes``, ``failures``) the first is short of. Both played the same split, so
    a stand-in's episode id gains its agent's name. Written whole or not at all; returns how many
    of each side were added."""
    kept, added = read_trajectories(own), {"successes": 0, "failures": 0}
    for t in read_trajectories(other):
        side = "successes" if t.success else "failures"
        if side in sides:
            kept.append(t.model_copy(update={"episode_id": f"{t.episode_id}|{t.agent}"}))
            added[side] += 1
    write_trajectories(out, read_run_settings(own) + read_run_settings(other), kept)
    return added


def oracle_ceiling(
    target: str, out: Path, *, split: str | None, tasks: int | None, max_steps: int | None, seed: int = 0
) -> dict[str, Any] | None:
    """The target's own solutions played on these tasks within ``max_steps``: the most any agent
    can pass there. None when the target knows no solutions (``oracle_actions`` gives None)."""
    env_kwargs = {"max_steps": max_steps} if max_steps else {}
    env = make(target, **({"split": split} if split else {}), **env_kwargs)
    try:
        task_ids = list(getattr(env.unwrapped, "task_ids", None) or [])
        solutions = getattr(env.unwrapped, "oracle_actions", None)
        if not task_ids or not callable(solutions):
            return None
        env.reset(seed=0, options={"task_id": task_ids[0]})
        if solutions() is None:
            return None
    finally:
        env.close()
    summary = rollout(
        target, "oracle", out, split=split, limit=tasks, seed=seed, resume=True, env_kwargs=env_kwargs, progress=False
    )
    return {
        "episodes": summary.episodes,
        "successes": summary.successes,
        "max_steps": max_steps,
        "split": split,
        "trajectories": str(out),
    }


def check_ceilings(config: PipelineConfig, folder: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Refuse, before any model time, a step limit within which even the target's own
    solutions pass none of the tasks: no agent could, and every figure would read 0.
    Evaluation's limit is checked on the rollout split too (only evaluation plays held-out tasks)."""
    limits = {"rollout": (config.rollout.max_steps, config.rollout.tasks)}
    if "evaluate" in config.run.stages:
        limits["evaluate"] = (config.evaluate.max_steps, config.evaluate.tasks or config.rollout.tasks)
    found: dict[str, Any] = {}
    for stage, (max_steps, tasks) in limits.items():
        name = f"oracle-{config.rollout.split}-{max_steps or 'default'}-{tasks or 'all'}.jsonl"
        ceiling = oracle_ceiling(
            config.run.target,
            folder / name,
            split=config.rollout.split,
            tasks=tasks,
            max_steps=max_steps,
            seed=config.run.seed,
        )
        if ceiling is None:
            return {}  # a target without reference solutions: nothing to measure the limits against
        found[stage] = ceiling
        if ceiling["successes"] == 0:
            raise PipelineError(
                f"[{stage}] max_steps {max_steps if max_steps else '(the default)'}: the target's own solutions "
                f"pass none of the first {ceiling['episodes']} {config.rollout.split} tasks within it, so no agent "
                "can; raise it"
            )
        say(
            f"the target's own solutions pass {ceiling['successes']} of {ceiling['episodes']} {config.rollout.split} "
            f"tasks within [{stage}] max_steps {max_steps or '(default)'}"
        )
    return found


def _given_trajectories(config: PipelineConfig) -> dict[str, Any]:
    path = Path(config.rollout.trajectories)
    trajectories = read_trajectories(path)
    other = sorted({t.env_id for t in trajectories} - {config.run.target})
    if other:
        raise PipelineError(
            f"[rollout] trajectories: {path} holds episodes of {', '.join(other)}, not only of {config.run.target}"
        )
    successes = sum(t.success for t in trajectories)
    return {
        "trajectories": str(path),
        "sha256": content_hash(path),
        "episodes": len(trajectories),
        "successes": successes,
        "pass_rate": successes / max(len(trajectories), 1),
        "mean_reward": sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        "wall_s": 0.0,
        "given": True,
        "summary": f"{len(trajectories)} given episodes (not rolled out), pass rate "
        f"{successes / max(len(trajectories), 1):.3f}",
    }


def stage_identify(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    upstream = _require(state, "rollout", "identify")
    trajectories = read_trajectories(upstream["trajectories"])
    out = config.run_dir / "identify"
    analyst = make_analyst(config.identify.analyst, cache_dir=out / ".analyst_cache", **config.identify.endpoint())
    try:
        result = identify(
            trajectories, analyst, out, config=config.identify.selection, seed=config.run.seed, progress=say
        )
    except DegenerateInputError as exc:
        # No contrast is possible (all successes or all failures): say so, select nothing.
        Identification([], {"calls": 0, "tokens": 0}, degenerate=str(exc)).save(out)
        say(f"no capability can be selected: {exc}")
        return {
            "dir": str(out),
            "selected": [],
            "degenerate": str(exc),
            "analyst_calls": 0,
            "summary": "nothing selected (no contrast possible)",
        }
    return {
        "dir": str(out),
        "sha256": content_hash(out / "capabilities.json", out / "labels.jsonl"),
        "selected": list(result.selected),
        "analyst_calls": result.analyst.get("calls", 0),
        "analyst_tokens": result.analyst.get("tokens", 0),
        "summary": f"selected {', '.join(result.selected) or 'nothing'}",
    }


def _require(state: RunState, stage: str, by: str) -> dict[str, Any]:
    if stage not in state.stages:
        raise PipelineError(
            f"the {by} stage needs the {stage} stage's output; add '{stage}' to [run] stages or run it first"
        )
    return state.stages[stage].outputs


def stage_synthesize(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    identified = _require(state, "identify", "synthesize")
    out = config.run_dir / "envs"
    registry = out / "registry"
    registry.mkdir(parents=True, exist_ok=True)
    add_registry_dir(registry)  # the run's own envs are visible to gym.make (workers are told: registry_dirs())
    envs = EnvSet()
    if not identified["selected"]:
        say("no capability was selected; nothing to synthesize")
        summary, calls, tokens = "nothing to synthesize", 0, 0
    else:
        loop = dataclasses.replace(config.synthesize.loop, resume=True)  # a registered env with a matching hash is kept
        unknown = sorted(set(config.synthesize.only) - set(identified["selected"]))
        if unknown:
            raise PipelineError(
                f"[synthesize] only: {', '.join(unknown)} not selected by identification "
                f"(selected: {', '.join(identified['selected'])})"
            )
        result = synthesize(
            Path(identified["dir"]) / "capabilities.json",
            config.run.target,
            analyst=config.synthesize.analyst,
            registry_dir=registry,
            config=loop,
            only=config.synthesize.only or None,
            trajectories=state.stages["rollout"].outputs["trajectories"] if "rollout" in state.stages else None,
            cache_dir=out / ".analyst_cache",
            progress=say,
            **config.synthesize.endpoint(),
        )

        for o in result.outcomes:
            status = read_manifest(Path(o.path)).validation_status() if o.path else "-"
            env_id = o.env_id if o.ok else None  # a failed outcome may name a folder it refused to use
            envs.envs.append(EnvRecord(o.capability, env_id, o.path, o.status, status, len(o.attempts), o.message))
        for note in result.notes:
            say(note)
        summary = f"{len(envs.trainable())} of {len(envs.envs)} capabilities have an env"
        calls, tokens = result.calls, result.tokens
    envs_json = envs.save(out)
    return {
        "envs_json": str(envs_json),
        "registry": str(registry),
        "sha256": content_hash(envs_json, registry),
        "envs": envs.trainable(),
        "analyst_calls": calls,
        "analyst_tokens": tokens,
        "summary": summary,
    }


def training_plan(config: PipelineConfig, envs: dict[str, str]) -> list[dict[str, Any]]:
    """The training runs of the train stage: one adapter per capability env, then the
    baselines at the same total rollout budget, then the causal control."""
    plan = [
        {"name": cap, "kind": AdapterKind.CAPABILITY, "envs": [env_id], "scale": 1}
        for cap, env_id in sorted(envs.items())
    ]
    total = baseline_scale(len(plan))  # the baselines get as many rollouts as all capability adapters together
    if config.train.grpo_target and plan:
        plan.append({"name": "grpo-target", "kind": AdapterKind.BASELINE, "envs": [config.run.target], "scale": total})
    distinct = sorted(set(envs.values()))  # (one env may serve two capabilities)
    if config.train.merged and len(distinct) > 1:  # one adapter over all capability envs: a baseline with two or more
        plan.append({"name": "merged", "kind": AdapterKind.BASELINE, "envs": distinct, "scale": total})
    for cap in config.train.control:
        if cap in envs:
            continue  # selected after all: it is a TRACE adapter, not a control
        plan.append(
            {
                "name": f"control-{cap}",
                "kind": AdapterKind.CONTROL,
                "capability": cap,
                "envs": [serving_envs(cap, config.run.target)[0].id],
                "scale": 1,
            }
        )
    return plan


def check_controls(config: PipelineConfig, identified: Identification) -> None:
    """Refuse a control capability that passed the contrast but was left out by
    ``max_selected``: it goes with failure, so its adapter is no untargeted control."""
    over = sorted(set(config.train.control) & {c.name for c in identified.candidates if c.over_cap})
    if over:
        raise PipelineError(
            f"[train] control: {', '.join(over)} passed the contrast and only the cap "
            f"([identify.selection] max_selected = {config.identify.selection.max_selected}) left it out, "
            "so it is no control; name a capability the contrast did not select, or raise the cap"
        )


def stage_train(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    synthesized = _require(state, "synthesize", "train")
    if config.train.control:
        check_controls(config, Identification.load(_require(state, "identify", "train")["dir"]))
    add_registry_dir(synthesized["registry"])
    out = config.run_dir / "adapters"
    out.mkdir(parents=True, exist_ok=True)
    made = AdapterSet()
    plan = training_plan(config, EnvSet.load(synthesized["envs_json"]).trainable())
    if not plan:
        say("no capability env to train on")
    runs = {
        job["name"]: grpo_config(config, job["envs"], str(out / job["name"]), iterations_scale=job["scale"])
        for job in plan
    }
    todo = []
    for i, job in enumerate(plan, 1):
        folder, run = out / job["name"], runs[job["name"]]
        done = TrainLog(folder / "train_log.jsonl").read()
        if (folder / "adapter" / "adapter_config.json").exists() and done and done[-1]["iteration"] >= run.iterations:
            say(f"({i}/{len(plan)}) {job['name']}: already trained ({run.iterations} iterations); kept")
            continue
        resume = (folder / "run.json").exists()
        say(
            f"({i}/{len(plan)}) {job['name']} on {', '.join(job['envs'])}: {run.iterations} iterations of "
            f"{run.groups}x{run.rollouts_per_group} rollouts" + (" (resuming)" if resume else "")
        )
        todo.append(Job(job["name"], run, resume))
    devices = visible_gpus() if todo and todo[0].run.device == "cuda" else []
    outcomes = train_jobs(todo, devices, say, registry=[str(synthesized["registry"])])
    for job in plan:
        folder, run = out / job["name"], runs[job["name"]]
        outcome = outcomes.get(job["name"])
        if outcome is not None and outcome.not_trained:
            say(f"{job['name']}: not trained: {outcome.not_trained}")
            made.untrainable.append(
                UntrainableRecord(job["name"], job["envs"], outcome.not_trained, str(folder / "calibration.json"))
            )
            continue
        log = TrainLog(folder / "train_log.jsonl").read()
        made.adapters.append(
            AdapterRecord(
                job["name"],
                job["kind"],
                job["envs"],
                str(folder / "adapter"),
                str(folder / "train_log.jsonl"),
                run.iterations,
                rollouts=log[-1]["rollouts"] if log else 0,
                episodes_played=(log[-1].get("episodes_played", 0) + log[-1].get("calibration_episodes", 0))
                if log
                else 0,
                calibration=str(folder / "calibration.json") if (folder / "calibration.json").exists() else None,
                wall_s=log[-1].get("elapsed_s") if log else None,
                reward_curve=str(folder / "reward_curve.png") if (folder / "reward_curve.png").exists() else None,
                capability=job.get("capability"),
            )
        )
    adapters_json = made.save(out)
    untrainable = [u.name for u in made.untrainable]
    return {
        "adapters_json": str(adapters_json),
        "sha256": content_hash(adapters_json, *[Path(a.adapter) for a in made.adapters]),
        "summary": f"{len(made.adapters)} adapters; the TRACE adapters used {trace_budget(made)} rollouts"
        + (f"; untrainable for this policy: {', '.join(untrainable)}" if untrainable else ""),
    }


def stage_gepa(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    budget = config.gepa.budget
    if budget is None:
        trained = _require(state, "train", "gepa (its budget is the TRACE adapters' rollouts; or set [gepa] budget)")
        budget = trace_budget(AdapterSet.load(trained["adapters_json"]))
        if budget < 1:
            raise PipelineError(
                "[gepa] budget: the train stage trained no capability adapter to match; set [gepa] budget"
            )
        say(f"budget {budget} episodes: as many as the TRACE adapters were trained on")
    run = gepa_config(config, budget)
    out = Path(run.out)
    if (out / "settings.json").exists() and json.loads((out / "settings.json").read_text()) != json.loads(
        json.dumps(run.settings())
    ):
        say(f"the settings changed since {out} was searched; starting the search over")
        shutil.rmtree(out)
    outcome = run_gepa(run, resume=True, say=say)
    return {
        "dir": str(out),
        "best_prompt": outcome.best_prompt,
        "rollouts": outcome.rollouts,
        "budget": budget,
        "reflection": outcome.reflection,
        "reflection_calls": outcome.reflection_calls,
        "seed_val_score": outcome.seed_val_score,
        "best_val_score": outcome.best_val_score,
        "candidates": outcome.candidates,
        "wall_s": outcome.wall_s,
        "warning": outcome.warning,
        "summary": f"{outcome.candidates} candidates, {outcome.rollouts}/{budget} episodes, validation "
        f"{outcome.seed_val_score:.3f} -> {outcome.best_val_score:.3f}",
    }


def eval_context(config: PipelineConfig, state: RunState, backend: Any) -> Any:
    """What evaluation's methods build from: this run's artifacts, loaded typed."""
    outputs = {name: record.outputs for name, record in state.stages.items()}
    adapters = state.adapters()
    return EvalContext(
        target=config.run.target,
        backend=backend,
        adapters=adapters,
        identification=Identification.load(outputs["identify"]["dir"]) if "identify" in outputs else None,
        train_trajectories=read_trajectories(outputs["rollout"]["trajectories"]) if "rollout" in outputs else [],
        gepa=outputs.get("gepa"),
        calibrate_router=config.evaluate.calibrate_router,
        analyst_calls=sum(outputs[s].get("analyst_calls", 0) for s in ("identify", "synthesize") if s in outputs),
        pre_training_wall_s=sum(
            state.stages[s].wall_s for s in ("rollout", "identify", "synthesize") if s in state.stages
        ),
    )


def stage_evaluate(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    out = config.run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    ctx = eval_context(config, state, None)
    ctx.backend = policy_backend(config.eval_model, ctx.adapters, **config.eval_endpoint)
    adapters = ctx.adapters
    env_kwargs = {"max_steps": config.evaluate.max_steps} if config.evaluate.max_steps else {}
    methods = build_methods(list(dict.fromkeys(config.evaluate.methods)), ctx, say)  # (a name given twice: once)
    own = {name for name, built, _ in methods if built.same_as is None}
    playing = [(name, built) for name, built, _ in methods if built.same_as not in own]  # the rest borrow episodes
    for name, _ in playing:
        if name == "summed" and isinstance(ctx.backend, SumsAdapters):  # the sum of these adapters, every time
            say(f"summed adapter saved to {ctx.backend.save_adapter('summed', out / 'summed-adapter')} (servable)")
    players = [
        Player(built.agent, out / f"{name}.jsonl", {**_agent_kwargs(config, model=ctx.backend), **built.kwargs})
        for name, built in playing
    ]
    if players:
        together = config.policy.batch > 1 and len(players) > 1
        say(f"{', '.join(n for n, _ in playing)} on the {config.evaluate.split} split" + (", in one batch" * together))

    def set_aside(path: Path) -> None:  # an earlier evaluation with other settings: kept, not resumed
        say(
            f"{path.stem}: {path.name} holds an evaluation made with other settings; kept as "
            f"{_set_aside(path, out / 'earlier')}, played again"
        )

    summaries = (
        rollout_players(
            config.run.target,
            players,
            split=config.evaluate.split,
            limit=config.evaluate.tasks,
            samples=config.evaluate.samples,
            seed=derive_seed(config.run.seed, "evaluate"),
            resume=True,
            env_kwargs=env_kwargs,
            batch=config.policy.batch,
            workers=config.policy.workers,
            progress=False,
            set_aside=set_aside,
        )
        if players
        else []
    )
    episodes = {}
    for (name, _), summary in zip(playing, summaries):
        planned = set(summary.episode_ids)  # the file may hold episodes of an earlier, larger evaluation
        episodes[name] = [t for t in read_trajectories(summary.out) if t.episode_id in planned]
    played = {}
    for name, built, cost in methods:
        if name not in episodes:
            say(f"{name}: {built.note}; not played again")
        played[name] = (episodes.get(name, episodes.get(built.same_as)), built, cost)
    reused = set(played) - set(episodes)  # rows scored from another method's episodes (their note says whose)
    base = played["base"][0] if "base" in played else []
    labels = _held_out_labels(config, ctx, played, out, say)
    groups: dict[str, set[str]] = {}  # the truth routing is scored against: where base lacked each capability
    if "base" in labels and config.identify.analyst in TRUTH_ANALYSTS:
        task_of = {t.episode_id: t.task_id for t in base}
        groups = {
            c: {task_of[x.episode_id] for x in labels["base"] if x.capability == c and x.label == LACKING}
            for c in sorted({x.capability for x in labels["base"]})
        }
    results = []
    for name, (trajectories, built, cost) in played.items():
        result = method_result(name, trajectories, groups=groups, routed_capabilities=built.routed, cost=cost)
        result.note = built.note if name in reused else ""
        if name in labels:
            result.lacking = lacking_rates(labels[name], _measured_capabilities(ctx))
        if base and name != "base":
            result.flips = task_flips(base, trajectories)
        results.append(result)
    base_result = next((r for r in results if r.method == "base"), None)
    for result in results:
        built = played[result.method][1]
        if base_result is not None and result is not base_result and built.targets and result.lacking:
            result.specificity = specificity(base_result, result, built.targets)
    paths = write_results(results, out, reward_curves={a.name: Path(a.train_log) for a in adapters.adapters})
    best = max(results, key=lambda r: r.pass_1) if results else None
    return {
        "results_json": str(out / "results.json"),
        "results_md": str(out / "results.md"),
        "plots": [str(p) for p in paths if p.suffix == ".png"],
        "sha256": content_hash(out / "results.json"),
        "summary": f"{len(results)} methods" + (f"; best pass^1 {best.pass_1:.3f} ({best.method})" if best else ""),
    }


def _set_aside(path: Path, folder: Path) -> Path:
    """Move ``path`` into ``folder`` under the first free numbered name; returns where it went."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 1
    while (folder / f"{path.stem}.{n}{path.suffix}").exists():
        n += 1
    return path.rename(folder / f"{path.stem}.{n}{path.suffix}")


TRUTH_ANALYSTS = ("gold", "milestone", "reference")
"""Analysts whose labels are rules over the target's reference solutions: routing is
scored against them (an LLM analyst's labels measure, but are no truth to score against)."""


def _measured_capabilities(ctx: Any) -> list[str]:
    """Every candidate capability identification weighed (selected or not)."""
    return [c.name for c in ctx.identification.candidates] if ctx.identification is not None else []


def _held_out_labels(
    config: PipelineConfig, ctx: Any, played: dict[str, Any], out: Path, say: Callable[[str], None]
) -> dict[str, list[Any]]:
    """The run's analyst's labels of every method's held-out episodes (capability-level
    figures); none where identification did not run or its analyst cannot label them."""
    capabilities = _measured_capabilities(ctx)
    if not capabilities or not played:
        return {}
    candidates = {c.name: c.description for c in ctx.identification.candidates}
    try:
        analyst = make_analyst(config.identify.analyst, cache_dir=out / ".analyst_cache", **config.identify.endpoint())
        return {name: label_all(analyst, trajectories, candidates) for name, (trajectories, _, _) in played.items()}
    except TraceGymError as exc:
        say(
            f"capability-level figures left out: the {config.identify.analyst} analyst could not label the "
            f"held-out episodes ({exc})"
        )
        return {}


StageFn = Callable[[PipelineConfig, RunState, Callable[[str], None]], dict[str, Any]]


STAGE_FUNCTIONS: dict[str, StageFn] = {
    "rollout": stage_rollout,
    "identify": stage_identify,
    "synthesize": stage_synthesize,
    "train": stage_train,
    "gepa": stage_gepa,
    "evaluate": stage_evaluate,
}
