"""What a validation is judged by and what it reports: thresholds, check results, the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import TraceGymError
from ..sandbox import Layer
from ..sandbox.backends import Limits
from ..text import printable


@dataclass
class ValidationConfig:
    """Thresholds of the validator. Defaults follow TRACE's recommendations."""

    seeds: int = 100
    """Seeds for the reset, diversity and solvability checks."""
    floor_seeds: int = 30
    """Seeds for each floor policy (random, no-op, message-only) in not_trivial."""
    determinism_seeds: int = 5
    """Seeds replayed in two fresh workers by the determinism check."""
    diversity_min: float = 0.95
    """Share of distinct opening scenarios required over ``seeds`` seeds."""
    solvable_reward: float = 0.99
    """Reward at which an oracle episode counts as solved."""
    solvable_share: float = 0.95
    """Share of seeds the oracle must solve."""
    level_seeds: int = 20
    """Seeds per difficulty level of an env with ``LEVELS`` in the levels check."""
    trivial_max: float = 0.3
    """Highest mean reward allowed to each floor policy."""
    min_reward_levels: int = 3
    """Distinct reward values required across all policies (GRPO needs variance)."""
    step_budget_s: float = 0.5
    """Largest p99 round trip of one env step, sandbox included."""
    policy: str | None = None
    """An agent for the calibration check (none: the check is not run)."""
    calibration_seeds: int = 10
    """Seeds (groups) of the calibration check."""
    k: int = 4
    """Rollouts per seed in the calibration check (TRACE's K)."""
    calibration_band: tuple[float, float] = (0.2, 0.6)
    """Where the policy's mean reward and success rate must lie."""
    max_constant_groups: float = 0.5
    """Largest share of groups whose K rewards are all equal."""
    min_informative_groups: float = 0.5
    """Smallest share of groups with reward variance (what GRPO learns from)."""
    max_all_zero_groups: float = 0.2
    """Largest share of groups where every rollout scores 0."""
    max_all_success_groups: float = 0.2
    """Largest share of groups where every rollout succeeds."""
    call_timeout_s: float = Limits.call_timeout_s
    """Wall-clock limit of one sandbox call (reset, step, reward, ...): past it the
    worker is killed and the check that made the call fails (``Limits.call_timeout_s``)."""
    time_budget_s: float = 100.0
    """Wall-clock budget of the whole validation (sandbox calls and worker starts
    included); past it the running check fails and the rest are skipped."""
    max_episode_steps: int = 100
    """The validator's own step cap: every episode is cut here, and an env that
    declares a larger ``max_steps`` fails ``termination``."""
    fidelity_seeds: int = 10
    """Seeds whose oracle episodes have every tool result checked against the
    target's frozen result shapes in ``interface_fidelity``."""
    seed: int | None = None
    """Where every check's seeds come from. None (the default): drawn fresh for each
    run, 31-bit like the seeds training plays (``draw_seeds``), so env code cannot
    tell a validation seed from a training one or be honest on a fixed list only;
    an int replays a run (the report records the one it used)."""

    def __post_init__(self) -> None:
        if not self.call_timeout_s > 0:
            raise TraceGymError(f"call_timeout_s must be positive, got {self.call_timeout_s}")


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None: skipped
    evidence: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    sandbox_layer: Layer | None = None  # a failed check: the sandbox layer that stopped the env code, if one did


@dataclass
class ValidationReport:
    env_id: str
    path: str
    code_hash: str
    backend: str
    passed: bool
    checks: list[CheckResult]
    wall_s: float
    validated_at: str
    config: dict[str, Any]
    target_hash: str = ""
    """Hash of what the env was judged against (``hashing.interface_hash``): the
    target's frozen interface (tools.json, results.json, manifest) and, for an env on
    the world kit, the kit; the report goes stale when it changes."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is False]

    def table(self) -> str:
        lines = [f"{self.env_id}  ({self.path}, backend {self.backend}, {self.wall_s:.1f}s)"]
        width = max(len(c.name) for c in self.checks)
        for c in self.checks:
            mark = "PASS" if c.passed else ("skip" if c.passed is None else "FAIL")
            lines.append(f"  {mark}  {c.name.ljust(width)}  {printable(c.evidence)}")
        lines.append("passed" if self.passed else f"FAILED: {', '.join(self.failed())}")
        return "\n".join(lines)
