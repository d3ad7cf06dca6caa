"""Calibration: the policy to be trained, played in groups, against the band GRPO can learn in."""

from __future__ import annotations

from ..context import Context
from ..report import CheckResult


def check_calibration(ctx: Context) -> CheckResult:
    cfg = ctx.config
    groups = []
    for seed in ctx.seeds("calibration", cfg.calibration_seeds):
        rewards = [ctx.play(ctx.env, cfg.policy, seed, record=False).reward or 0.0 for _ in range(cfg.k)]
        groups.append(rewards)
    flat = [r for g in groups for r in g]
    n = len(groups)
    mean = sum(flat) / len(flat)
    success = sum(r >= cfg.solvable_reward for r in flat) / len(flat)
    constant = sum(len(set(g)) == 1 for g in groups) / n
    informative = 1 - constant
    all_zero = sum(all(r == 0 for r in g) for g in groups) / n
    all_success = sum(all(r >= cfg.solvable_reward for r in g) for g in groups) / n
    pass_at = {k: sum(any(r >= cfg.solvable_reward for r in g[:k]) for g in groups) / n for k in range(1, cfg.k + 1)}
    low, high = cfg.calibration_band
    rules = {
        f"mean reward {mean:.2f} in [{low}, {high}]": low <= mean <= high,
        f"success rate {success:.2f} in [{low}, {high}]": low <= success <= high,
        f"constant groups {constant:.2f} <= {cfg.max_constant_groups}": constant <= cfg.max_constant_groups,
        f"informative groups {informative:.2f} >= {cfg.min_informative_groups}": informative
        >= cfg.min_informative_groups,
        f"all-zero groups {all_zero:.2f} <= {cfg.max_all_zero_groups}": all_zero <= cfg.max_all_zero_groups,
        f"all-success groups {all_success:.2f} <= {cfg.max_all_success_groups}": all_success
        <= cfg.max_all_success_groups,
    }
    failed = [rule for rule, ok in rules.items() if not ok]
    pass_table = ", ".join(f"pass@{k} {v:.2f}" for k, v in pass_at.items())
    evidence = (
        f"{cfg.policy}, {n} groups x K={cfg.k}: "
        + ("; ".join(failed) if failed else "all rules hold")
        + f"; {pass_table}"
    )
    return CheckResult("calibration", not failed, evidence, {"groups": groups, "pass_at_k": pass_at, "rules": rules})
