"""Capability identification (TRACE stage 1): which capabilities does the agent lack?

``identify(trajectories, analyst, out_dir)`` labels every (trajectory,
capability) pair as PRESENT, LACKING or NOT_APPLICABLE, contrasts failures
with successes over N seeded bootstrap runs, keeps the capabilities whose gap
and coverage pass the thresholds in K of N runs, and writes
``capabilities.json``, ``labels.jsonl``, ``runs.json`` and ``report.md`` (with
plots). Analysts: ``GoldActionAnalyst`` (τ² gold actions, no LLM) and
``LLMAnalyst`` (discovery and labelling through any OpenAI-compatible model).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from trace_gym.errors import TraceGymError
from trace_gym.llm.registry import is_chat_endpoint
from trace_gym.trajectory import Trajectory
from trace_gym.seeding import derive_seed

from .gold import GOLD_CAPABILITIES, GoldActionAnalyst
from .llm_analyst import LLMAnalyst, unknown_analyst
from .stats import (
    LACKING,
    CapabilityStats,
    DegenerateInputError,
    IncompleteLabelsError,
    Label,
    SelectedCapability,
    SelectionConfig,
    check_contrastable,
    cohen_kappa,
    contrast,
    labels_by_episode,
    select,
)

__all__ = [
    "identify",
    "IdentificationResult",
    "SelectionConfig",
    "GoldActionAnalyst",
    "GOLD_CAPABILITIES",
    "DegenerateInputError",
    "IncompleteLabelsError",
    "Label",
    "contrast",
    "select",
    "cohen_kappa",
    "make_analyst",
    "RuleAnalyst",
    "DiscoveringAnalyst",
    "Analyst",
]


@runtime_checkable
class RuleAnalyst(Protocol):
    """An analyst with a fixed dictionary of capabilities that labels one episode at a
    time by rules (gold, milestone, reference: no model calls)."""

    def capabilities(self) -> dict[str, str]: ...

    def label(self, trajectory: Trajectory) -> list[Label]: ...


@runtime_checkable
class DiscoveringAnalyst(Protocol):
    """An analyst that finds its candidate capabilities in the failures and labels every
    episode against them in one pass (the LLM analyst)."""

    calls: int
    tokens: int

    def discover(self, failures: list[Trajectory], *, runs: int, seed: int = 0) -> dict[str, str]: ...

    def label_all(self, trajectories: list[Trajectory], candidates: dict[str, str]) -> list[Label]: ...


Analyst = RuleAnalyst | DiscoveringAnalyst


@dataclass
class IdentificationResult:
    capabilities: list[SelectedCapability]
    runs: list[list[CapabilityStats]]
    labels: list[Label]
    agreement: dict[str, float | None]
    analyst: dict[str, Any]
    out_dir: Path | None = None

    @property
    def selected(self) -> list[str]:
        return [c.name for c in self.capabilities if c.selected]


def make_analyst(spec: str, **llm_options: Any) -> RuleAnalyst | DiscoveringAnalyst:
    """``gold`` (τ²'s gold actions), ``milestone`` (ToolSandbox's milestones), ``reference``
    (any target's reference solutions, ``oracle_actions()``) or ``openai:<model>``.
    ``llm_options`` (``cache_dir``, ``per_trajectory``, ...) are the LLM analyst's; an
    offline analyst calls no model and has none, so callers pass them either way."""
    if spec == "gold":
        return GoldActionAnalyst()
    if spec == "reference":
        from .reference import ReferenceAnalyst

        return ReferenceAnalyst()
    if spec == "milestone":
        from .milestone import MilestoneAnalyst

        return MilestoneAnalyst()
    if is_chat_endpoint(spec):
        return LLMAnalyst(spec, **llm_options)
    raise TraceGymError(unknown_analyst(spec, ("gold", "milestone", "reference")))


def identify(
    trajectories: list[Trajectory],
    analyst: Analyst,
    out_dir: str | Path | None = None,
    *,
    config: SelectionConfig | None = None,
    seed: int = 0,
    compare_gold: bool = False,
    progress: Callable[[str], None] | None = None,
) -> IdentificationResult:
    config = config or SelectionConfig()
    # The same episodes in another order (a batch, threads, a resume) must select the same:
    # discovery's draws, the labels, the bootstrap and the examples all read this order.
    trajectories = sorted(trajectories, key=lambda t: t.episode_id)
    if config.runs < 1 or not 1 <= config.min_runs <= config.runs:
        raise TraceGymError(f"need 1 <= K <= N runs, got K={config.min_runs}, N={config.runs}")
    success = {t.episode_id: t.success for t in trajectories}
    check_contrastable(list(success.values()))
    say = progress or (lambda message: None)

    say("discovering candidate capabilities")
    if isinstance(analyst, DiscoveringAnalyst):
        candidates = analyst.discover([t for t in trajectories if not t.success], runs=config.runs, seed=seed)
    else:
        candidates = analyst.capabilities()
    say(f"labelling {len(trajectories)} trajectories x {len(candidates)} capabilities")
    labels = label_all(analyst, trajectories, candidates)
    by_episode = labels_by_episode(labels, success, list(candidates))

    agreement: dict[str, float | None] = {}
    if compare_gold and isinstance(analyst, DiscoveringAnalyst):
        # The analyst labels the gold capabilities too, for kappa only: they are
        # not candidates, so comparing never changes what is selected.
        say(f"labelling the {len(GOLD_CAPABILITIES)} gold capabilities for agreement")
        own = label_all(analyst, trajectories, GOLD_CAPABILITIES)
        gold_labels = label_all(GoldActionAnalyst(), trajectories, GOLD_CAPABILITIES)
        agreement = agreement_by_capability(own, gold_labels)

    clusters = task_clusters(trajectories)
    runs = []
    for r in range(config.runs):
        sample = (
            list(success)
            if config.runs == 1
            else bootstrap_sample(clusters, random.Random(derive_seed(seed, "bootstrap", r)))
        )
        try:
            runs.append(contrast(by_episode, sample, success, list(candidates), config))
        except DegenerateInputError:
            continue  # a bootstrap sample with no failures (tiny inputs): that run cannot vote; counted below
    if not runs:
        raise DegenerateInputError(
            f"none of the {config.runs} bootstrap runs drew both successes and failures; add trajectories"
        )
    if len(runs) < config.runs:
        say(
            f"{config.runs - len(runs)} of {config.runs} bootstrap runs drew no successes or no failures and were skipped; "
            f"selection is over the {len(runs)} runs made"
        )
    task_of = {t.episode_id: t.task_id for t in trajectories}
    examples: dict[str, list[str]] = {}
    for label in labels:
        if label.label == LACKING and not success[label.episode_id]:
            bucket = examples.setdefault(label.capability, [])
            if task_of[label.episode_id] not in bucket:
                bucket.append(task_of[label.episode_id])
    chosen = select(runs, candidates, examples, config)
    info = {
        "analyst": getattr(analyst, "name", type(analyst).__name__),
        "calls": analyst.calls if isinstance(analyst, DiscoveringAnalyst) else 0,
        "tokens": analyst.tokens if isinstance(analyst, DiscoveringAnalyst) else 0,
        "trajectories": len(trajectories),
        "successes": sum(success.values()),
        "failures": len(success) - sum(success.values()),
        "tasks": len(clusters),
        "runs_requested": config.runs,
        "runs_made": len(runs),
        "runs_required": min(config.min_runs, len(runs)),
        "config": asdict(config),
        "seed": seed,
    }
    result = IdentificationResult(chosen, runs, labels, agreement, info)
    if out_dir is not None:
        write_outputs(result, Path(out_dir))
    return result


def task_clusters(trajectories: list[Trajectory]) -> list[list[str]]:
    """Episode ids grouped by task (by seed for envs without tasks): the unit a bootstrap resamples.

    Sorted by task and by episode id, so that the bootstrap draws (and the selection)
    depend on the episodes alone, not on the order a batch, threads or a resume wrote them."""
    groups: dict[str, list[str]] = {}
    for t in trajectories:
        key = f"task={t.task_id}" if t.task_id is not None else f"seed={t.seed}" if t.seed is not None else t.episode_id
        groups.setdefault(f"{t.env_id}|{key}", []).append(t.episode_id)
    return [sorted(groups[key]) for key in sorted(groups)]


def bootstrap_sample(clusters: list[list[str]], rng: random.Random) -> list[str]:
    """A cluster bootstrap: draw tasks with replacement and keep every episode of each drawn task.

    Samples of one task (``--samples K``) are not independent; resampling
    episodes would treat them as if they were and understate the spread."""
    return [episode for cluster in rng.choices(clusters, k=len(clusters)) for episode in cluster]


def label_all(analyst: Analyst, trajectories: list[Trajectory], candidates: dict[str, str]) -> list[Label]:
    if isinstance(analyst, DiscoveringAnalyst):
        return analyst.label_all(trajectories, candidates)
    return [label for t in trajectories for label in analyst.label(t) if label.capability in candidates]


def agreement_by_capability(a: list[Label], b: list[Label]) -> dict[str, float | None]:
    """Cohen's kappa per capability over the (episode, capability) pairs both analysts labelled."""
    first = {(x.episode_id, x.capability): x.label for x in a}
    second = {(x.episode_id, x.capability): x.label for x in b}
    out = {}
    for capability in sorted({c for _, c in second}):
        keys = [k for k in second if k[1] == capability and k in first]
        out[capability] = cohen_kappa([first[k] for k in keys], [second[k] for k in keys])
    return out


def write_outputs(result: IdentificationResult, out: Path) -> None:
    from .report import write_report

    from trace_gym.artifacts import Identification

    out.mkdir(parents=True, exist_ok=True)
    Identification(list(result.capabilities), result.analyst, result.agreement, labels=list(result.labels)).save(out)
    (out / "runs.json").write_text(json.dumps([[asdict(s) for s in run] for run in result.runs], indent=1) + "\n")
    write_report(result, out)
