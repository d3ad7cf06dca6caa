"""Evaluation: every method on the target's held-out split, in one table.

``methods``: the rows of the comparison (base, trace, grpo-target, merged,
summed, control, gepa; a user can register more) and budget matching.
``results``: the figures of each row (pass^1 with an interval, pass^k, mean
reward, capability-level LACKING rates, routing accuracy where a truth
exists, per-task flips against base) and the files they go to.
"""

from .methods import (
    METHODS,
    BuiltAgent,
    EvalContext,
    Method,
    Unavailable,
    baseline_scale,
    build_methods,
    policy_backend,
    build_router,
    get_method,
    register_method,
    trace_budget,
)
from .results import (
    NO_CAPABILITY,
    MethodResult,
    capability_groups,
    gold_route,
    lacking_rates,
    load_results,
    method_result,
    plot_results,
    results_table,
    routing_accuracy,
    specificity,
    task_flips,
    write_results,
)

__all__ = [
    "METHODS",
    "NO_CAPABILITY",
    "BuiltAgent",
    "EvalContext",
    "Method",
    "MethodResult",
    "Unavailable",
    "baseline_scale",
    "build_methods",
    "build_router",
    "capability_groups",
    "get_method",
    "gold_route",
    "lacking_rates",
    "load_results",
    "method_result",
    "policy_backend",
    "specificity",
    "task_flips",
    "plot_results",
    "register_method",
    "results_table",
    "routing_accuracy",
    "trace_budget",
    "write_results",
]
