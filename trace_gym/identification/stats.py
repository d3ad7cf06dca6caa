"""Contrastive statistics and selection (TRACE stage 1, steps 4-6).

Per capability c, over successes D+ and failures D-:
  N+ (c applies in a success), E+ (and is LACKING there), ER+ = E+/N+;
  N-, E-, ER- likewise over failures;
  gap = ER- - ER+; coverage = E- / |D-|.
Keep c in a run iff gap >= delta and coverage >= rho; across N runs keep c
iff it was kept in at least K runs. Rates come with Wilson score intervals.

Nothing is decided silently: with N+ = 0 (c never applies in a success of
the sample) ER+ is unknown, not 0, so the gap is unknown and c is not kept in
that run; a (trajectory, capability) pair with no label is an error, never
read as NOT_APPLICABLE; degenerate input (no successes, no failures) is an
error that says so.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Iterable

from trace_gym.errors import TraceGymError


class Verdict(StrEnum):
    """An analyst's label of one (trajectory, capability) pair; equal to its string."""

    PRESENT = "PRESENT"
    LACKING = "LACKING"
    NOT_APPLICABLE = "NOT_APPLICABLE"


def capability_id(name: str) -> str:
    """A capability's id, from identification to the report: lower case, runs of other characters as ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "capability"


PRESENT, LACKING, NOT_APPLICABLE = Verdict.PRESENT, Verdict.LACKING, Verdict.NOT_APPLICABLE
LABELS = tuple(Verdict)


class DegenerateInputError(TraceGymError):
    """The trajectories cannot support a contrast (no successes, or no failures)."""


class IncompleteLabelsError(TraceGymError):
    """An analyst left (trajectory, capability) pairs unlabelled, or used a label that is not one of LABELS."""


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
    er_plus: float | None
    """E+/N+; None (unknown) when N+ is 0."""
    er_minus: float | None
    """E-/N-; None (unknown) when N- is 0."""
    gap: float | None
    """ER- - ER+; None when either rate is unknown (such a run cannot keep the capability)."""
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
    min_runs: int | None = None
    """Runs in which a capability must be kept (K of N); None: the paper's share,
    round(0.8 N) (8 of 10)."""
    max_selected: int | None = None
    """At most this many capabilities are selected, the largest mean gaps first, among those
    that pass K of N (one adapter each: a budget cap); None: every one that passes."""

    def __post_init__(self) -> None:
        if self.min_runs is None:
            self.min_runs = max(1, round(0.8 * self.runs)) if isinstance(self.runs, int) else 1
        if not (isinstance(self.runs, int) and isinstance(self.min_runs, int) and 1 <= self.min_runs <= self.runs):
            raise SelectionError(
                f"selection needs 1 <= K <= N runs, got K (min_runs) = {self.min_runs}, N (runs) = {self.runs}"
            )
        cap = self.max_selected
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SelectionError(f"max_selected must be a whole number, at least 1 (or unset for no cap), got {cap!r}")


class SelectionError(TraceGymError, ValueError):
    """Selection thresholds that cannot work together (a config loader reports it as its field's error)."""


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
        raise DegenerateInputError(
            f"all {len(outcomes)} trajectories failed: no successes to contrast with (ER+ is undefined)"
        )
    if failures == 0:
        raise DegenerateInputError(f"all {len(outcomes)} trajectories succeeded: there are no failures to explain")


def labels_by_episode(
    labels: Iterable[Label], episode_ids: Iterable[str], capabilities: list[str]
) -> dict[str, dict[str, str]]:
    """Every episode's label per capability; a missing pair or an unknown label is an error that counts them."""
    by_episode: dict[str, dict[str, str]] = {}
    bad_values = []
    for label in labels:
        if label.label not in LABELS:
            bad_values.append(label)
        by_episode.setdefault(label.episode_id, {})[label.capability] = label.label
    if bad_values:
        x = bad_values[0]
        raise IncompleteLabelsError(
            f"{len(bad_values)} labels are not one of {', '.join(LABELS)} "
            f"(e.g. {x.label!r} for {x.capability} in {x.episode_id})"
        )
    episodes = list(dict.fromkeys(episode_ids))
    missing = [(e, c) for e in episodes for c in capabilities if c not in by_episode.get(e, {})]
    if missing:
        e, c = missing[0]
        raise IncompleteLabelsError(
            f"{len(missing)} of {len(episodes) * len(capabilities)} (trajectory, capability) pairs have no label "
            f"(e.g. {c} in {e}); the analyst must label every pair, NOT_APPLICABLE included"
        )
    return by_episode


def contrast(
    labels: Iterable[Label] | dict[str, dict[str, str]],
    sample: list[str],
    success: dict[str, bool],
    capabilities: list[str],
    config: SelectionConfig,
) -> list[CapabilityStats]:
    """The statistics of one run over ``sample`` (episode ids; repeats count, as in a bootstrap).

    ``labels`` is a list of labels or what :func:`labels_by_episode` made of one."""
    check_contrastable([success[e] for e in sample])
    by_episode = labels if isinstance(labels, dict) else labels_by_episode(labels, sample, capabilities)
    failures = sum(1 for e in sample if not success[e])
    counts = {c: [0, 0, 0, 0] for c in capabilities}  # n+, e+, n-, e-
    for episode in sample:
        offset = 0 if success[episode] else 2
        for c in capabilities:
            value = by_episode[episode][c]
            if value == NOT_APPLICABLE:
                continue
            counts[c][offset] += 1
            counts[c][offset + 1] += value == LACKING
    out = []
    for c, (n_plus, e_plus, n_minus, e_minus) in counts.items():
        er_plus = e_plus / n_plus if n_plus else None
        er_minus = e_minus / n_minus if n_minus else None
        gap = None if er_plus is None or er_minus is None else er_minus - er_plus
        stats = CapabilityStats(
            capability=c,
            n_plus=n_plus,
            e_plus=e_plus,
            n_minus=n_minus,
            e_minus=e_minus,
            failures=failures,
            er_plus=er_plus,
            er_minus=er_minus,
            gap=gap,
            coverage=e_minus / failures,
            er_plus_ci=wilson(e_plus, n_plus),
            er_minus_ci=wilson(e_minus, n_minus),
        )
        stats.kept = gap is not None and gap >= config.delta and stats.coverage >= config.rho
        out.append(stats)
    return out


@dataclass
class SelectedCapability:
    name: str
    description: str
    gap_mean: float | None
    """Mean gap over the runs where it is known; None if it is known in none."""
    gap_std: float | None
    coverage_mean: float
    coverage_std: float
    er_plus_mean: float | None
    er_minus_mean: float | None
    runs_passed: int
    runs: int
    """Runs actually made (bootstrap samples with no success or no failure are skipped)."""
    selected: bool
    example_failed_task_ids: list[str] = field(default_factory=list)
    runs_gap_unknown: int = 0
    """Runs where ER+ or ER- was unknown (N+ or N- = 0), so the gap was too and the run could not keep it."""
    runs_required: int = 0
    """Runs it had to pass: K, or every run made when fewer than K were made."""
    over_cap: bool = False
    """It passed K of N but was not selected: ``max_selected`` kept larger gaps."""

    @property
    def verdict(self) -> str:
        """The report's word for it: yes, no, or over the cap."""
        return "yes" if self.selected else "over the cap" if self.over_cap else "no"

    def as_dict(self) -> dict:
        return asdict(self)


def select(
    runs: list[list[CapabilityStats]],
    descriptions: dict[str, str],
    examples: dict[str, list[str]],
    config: SelectionConfig,
) -> list[SelectedCapability]:
    """K-of-N selection over the runs made; every candidate is returned, sorted by mean gap.

    When fewer than K runs were made (degenerate bootstrap samples are
    skipped), a capability must pass every run made; ``runs`` and
    ``runs_required`` say so in the output. With ``max_selected``, only the
    largest mean gaps among those that pass are selected; the rest are marked
    ``over_cap`` (ties keep name order)."""
    names = sorted({s.capability for run in runs for s in run})
    required = min(config.min_runs, len(runs))
    out = []
    for name in names:
        rows = [s for run in runs for s in run if s.capability == name]
        gaps = [r.gap for r in rows if r.gap is not None]
        coverages = [r.coverage for r in rows]
        plus = [r.er_plus for r in rows if r.er_plus is not None]
        minus = [r.er_minus for r in rows if r.er_minus is not None]
        passed = sum(r.kept for r in rows)
        out.append(
            SelectedCapability(
                name=name,
                description=descriptions.get(name, ""),
                gap_mean=statistics.fmean(gaps) if gaps else None,
                gap_std=statistics.pstdev(gaps) if gaps else None,
                coverage_mean=statistics.fmean(coverages),
                coverage_std=statistics.pstdev(coverages),
                er_plus_mean=statistics.fmean(plus) if plus else None,
                er_minus_mean=statistics.fmean(minus) if minus else None,
                runs_passed=passed,
                runs=len(runs),
                selected=passed >= required,
                example_failed_task_ids=examples.get(name, [])[:5],
                runs_gap_unknown=len(rows) - len(gaps),
                runs_required=required,
            )
        )
    ranked = sorted(out, key=lambda c: (c.gap_mean is not None, c.gap_mean or 0.0), reverse=True)
    if config.max_selected is not None:
        for c in [c for c in ranked if c.selected][config.max_selected :]:
            c.selected, c.over_cap = False, True
    return ranked


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
