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
from typing import Any, Callable

from trace_gym.errors import TraceGymError
from trace_gym.trajectory import Trajectory

from .gold import GOLD_CAPABILITIES, GoldActionAnalyst
from .stats import (
    LACKING,
    CapabilityStats,
    DegenerateInputError,
    Label,
    SelectedCapability,
    SelectionConfig,
    check_contrastable,
    cohen_kappa,
    contrast,
    select,
)

__all__ = [
    "identify", "IdentificationResult", "SelectionConfig", "GoldActionAnalyst", "GOLD_CAPABILITIES",
    "DegenerateInputError", "Label", "contrast", "select", "cohen_kappa", "make_analyst",
]


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


def make_analyst(spec: str, **kwargs: Any):
    """``gold`` or ``openai:<model>``."""
    if spec == "gold":
        return GoldActionAnalyst()
    if spec.startswith("openai:"):
        from .llm_analyst import LLMAnalyst

        return LLMAnalyst(spec, **kwargs)
    raise TraceGymError(f"unknown analyst '{spec}'; use gold or openai:<model>")


def identify(trajectories: list[Trajectory], analyst: Any, out_dir: str | Path | None = None, *,
             config: SelectionConfig | None = None, seed: int = 0, compare_gold: bool = False,
             progress: Callable[[str], None] | None = None) -> IdentificationResult:
    config = config or SelectionConfig()
    if config.runs < 1 or not 1 <= config.min_runs <= config.runs:
        raise TraceGymError(f"need 1 <= K <= N runs, got K={config.min_runs}, N={config.runs}")
    success = {t.episode_id: t.success for t in trajectories}
    check_contrastable(list(success.values()))
    say = progress or (lambda message: None)

    say("discovering candidate capabilities")
    if hasattr(analyst, "discover"):
        candidates = analyst.discover([t for t in trajectories if not t.success], runs=config.runs, seed=seed)
        if compare_gold:
            candidates = {**candidates, **GOLD_CAPABILITIES}
    else:
        candidates = analyst.capabilities()
    say(f"labelling {len(trajectories)} trajectories x {len(candidates)} capabilities")
    labels = label_all(analyst, trajectories, candidates)

    agreement: dict[str, float | None] = {}
    if compare_gold and hasattr(analyst, "discover"):
        gold_labels = label_all(GoldActionAnalyst(), trajectories, GOLD_CAPABILITIES)
        agreement = agreement_by_capability(labels, gold_labels)

    ids = list(success)
    runs = []
    for r in range(config.runs):
        sample = ids if config.runs == 1 else random.Random(f"{seed}|{r}").choices(ids, k=len(ids))
        try:
            runs.append(contrast(labels, sample, success, list(candidates), config))
        except DegenerateInputError:
            continue  # a bootstrap sample with no failures (tiny inputs): that run cannot vote
    if not runs:
        raise DegenerateInputError("no bootstrap run had both successes and failures; add trajectories")
    task_of = {t.episode_id: t.task_id for t in trajectories}
    examples: dict[str, list[str]] = {}
    for label in labels:
        if label.label == LACKING and not success[label.episode_id]:
            bucket = examples.setdefault(label.capability, [])
            if task_of[label.episode_id] not in bucket:
                bucket.append(task_of[label.episode_id])
    chosen = select(runs, candidates, examples, config)
    info = {"analyst": getattr(analyst, "name", type(analyst).__name__), "calls": getattr(analyst, "calls", 0),
            "tokens": getattr(analyst, "tokens", 0), "trajectories": len(trajectories),
            "successes": sum(success.values()), "failures": len(success) - sum(success.values()),
            "config": asdict(config), "seed": seed}
    result = IdentificationResult(chosen, runs, labels, agreement, info)
    if out_dir is not None:
        write_outputs(result, Path(out_dir))
    return result


def label_all(analyst: Any, trajectories: list[Trajectory], candidates: dict[str, str]) -> list[Label]:
    if hasattr(analyst, "label_all"):
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

    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "selected": [c.as_dict() for c in result.capabilities if c.selected],
        "candidates": [c.as_dict() for c in result.capabilities],
        "agreement_with_gold": result.agreement,
        "analyst": result.analyst,
    }
    (out / "capabilities.json").write_text(json.dumps(payload, indent=2) + "\n")
    with open(out / "labels.jsonl", "w") as fh:
        for label in result.labels:
            fh.write(json.dumps(asdict(label)) + "\n")
    (out / "runs.json").write_text(json.dumps([[asdict(s) for s in run] for run in result.runs], indent=1) + "\n")
    write_report(result, out)
