"""Contrastive statistics and selection (TRACE stage 1, steps 4-6).

Per capability c, over successes D+ and failures D-:
  N+ (c applies in a success), E+ (and is LACKING there), ER+ = E+/N+;
  N-, E-, ER- likewise over failures;
  gap = ER- - ER+; coverage = E- / |D-|.
Keep c in a run iff gap >= delta and coverage >= rho; across N runs keep c
iff it was kept in at least K runs. Rates come with Wilson score intervals.
Degenerate input (no successes, no failures) is an error that says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Iterable

from trace_gym.errors import TraceGymError

PRESENT, LACKING, NOT_APPLICABLE = "PRESENT", "LACKING", "NOT_APPLICABLE"
LABELS = (PRESENT, LACKING, NOT_APPLICABLE)


class DegenerateInputError(TraceGymError):
    """The trajectories cannot support a contrast (no successes, or no failures)."""


@dataclass(frozen=True)
class Label:
    episode_id: str
    capability: str
    label: str
    evidence: str = ""


@dataclass
class CapabilityStats:
    capability: str
    n_plus: int
    e_plus: int
    n_minus: int
    e_minus: int
    failures: int
    er_plus: float
    er_minus: float
    gap: float
    coverage: float
    er_plus_ci: tuple[float, float]
    er_minus_ci: tuple[float, float]
    kept: bool = False


@dataclass
class SelectionConfig:
    """Thresholds of capability selection. Defaults are the TRACE paper's."""

    delta: float = 0.20
    """Smallest contrastive gap ER- - ER+ for a capability to be kept in a run."""
    rho: float = 0.10
    """Smallest coverage E- / |D-| for a capability to be kept in a run."""
    runs: int = 10
    """Identification runs (N)."""
    min_runs: int = 8
    """Runs in which a capability must be kept (K of N)."""


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion; (0, 1) when n is 0."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def check_contrastable(outcomes: list[bool]) -> None:
    """Refuse input that cannot support a contrast, saying why."""
    failures = outcomes.count(False)
    if len(outcomes) < 2:
        raise DegenerateInputError(f"{len(outcomes)} trajectory: a contrast needs successes and failures")
    if failures == len(outcomes):
        raise DegenerateInputError(f"all {len(outcomes)} trajectories failed: no successes to contrast with (ER+ is undefined)")
    if failures == 0:
        raise DegenerateInputError(f"all {len(outcomes)} trajectories succeeded: there are no failures to explain")


def contrast(labels: Iterable[Label], sample: list[str], success: dict[str, bool], capabilities: list[str],
             config: SelectionConfig) -> list[CapabilityStats]:
    """The statistics of one run over ``sample`` (episode ids; repeats count, as in a bootstrap)."""
    check_contrastable([success[e] for e in sample])
    failures = sum(1 for e in sample if not success[e])
    by_episode: dict[str, dict[str, str]] = {}
    for label in labels:
        by_episode.setdefault(label.episode_id, {})[label.capability] = label.label
    counts = {c: [0, 0, 0, 0] for c in capabilities}  # n+, e+, n-, e-
    for episode in sample:
        offset = 0 if success[episode] else 2
        for c, value in by_episode.get(episode, {}).items():
            if c not in counts or value == NOT_APPLICABLE:
                continue
            counts[c][offset] += 1
            counts[c][offset + 1] += value == LACKING
    out = []
    for c, (n_plus, e_plus, n_minus, e_minus) in counts.items():
        er_plus = e_plus / n_plus if n_plus else 0.0
        er_minus = e_minus / n_minus if n_minus else 0.0
        stats = CapabilityStats(
            capability=c, n_plus=n_plus, e_plus=e_plus, n_minus=n_minus, e_minus=e_minus, failures=failures,
            er_plus=er_plus, er_minus=er_minus, gap=er_minus - er_plus, coverage=e_minus / failures,
            er_plus_ci=wilson(e_plus, n_plus), er_minus_ci=wilson(e_minus, n_minus),
        )
        stats.kept = stats.gap >= config.delta and stats.coverage >= config.rho
        out.append(stats)
    return out


@dataclass
class SelectedCapability:
    name: str
    description: str
    gap_mean: float
    gap_std: float
    coverage_mean: float
    coverage_std: float
    er_plus_mean: float
    er_minus_mean: float
    runs_passed: int
    runs: int
    selected: bool
    example_failed_task_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def select(runs: list[list[CapabilityStats]], descriptions: dict[str, str], examples: dict[str, list[str]],
           config: SelectionConfig) -> list[SelectedCapability]:
    """K-of-N selection over runs; every candidate is returned, sorted by mean gap."""
    names = sorted({s.capability for run in runs for s in run})
    out = []
    for name in names:
        rows = [s for run in runs for s in run if s.capability == name]
        gaps, coverages = [r.gap for r in rows], [r.coverage for r in rows]
        passed = sum(r.kept for r in rows)
        out.append(SelectedCapability(
            name=name, description=descriptions.get(name, ""),
            gap_mean=statistics.fmean(gaps), gap_std=statistics.pstdev(gaps),
            coverage_mean=statistics.fmean(coverages), coverage_std=statistics.pstdev(coverages),
            er_plus_mean=statistics.fmean(r.er_plus for r in rows), er_minus_mean=statistics.fmean(r.er_minus for r in rows),
            runs_passed=passed, runs=len(runs), selected=passed >= min(config.min_runs, len(runs)),
            example_failed_task_ids=examples.get(name, [])[:5],
        ))
    return sorted(out, key=lambda c: c.gap_mean, reverse=True)


def cohen_kappa(a: list[str], b: list[str]) -> float | None:
    """Agreement of two labelings of the same items beyond chance; None if undefined."""
    if len(a) != len(b) or not a:
        return None
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b)) / n
    expected = sum((a.count(k) / n) * (b.count(k) / n) for k in LABELS)
    if expected == 1.0:
        return 1.0 if observed == 1.0 else None
    return (observed - expected) / (1 - expected)
