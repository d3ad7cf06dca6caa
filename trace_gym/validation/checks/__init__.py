"""The checks, one function each: a ``Context`` in, a ``CheckResult`` out; ``CHECKS`` is their
order and ``NEEDS`` what each reads that an earlier one leaves in the context."""

from __future__ import annotations

from typing import Callable

from ..context import Context
from ..report import CheckResult
from .calibration import check_calibration
from .episodes import (
    check_determinism,
    check_levels,
    check_not_trivial,
    check_reset_every_seed,
    check_reward_range,
    check_seed_diversity,
    check_solvable,
    check_termination,
)
from .fidelity import check_interface_fidelity
from .probes import check_hints, check_robustness, check_step_time
from .source import check_contract_shape, check_static_gate

Check = Callable[[Context], CheckResult]
CHECKS: list[Check] = [
    check_static_gate,
    check_contract_shape,
    check_interface_fidelity,
    check_reset_every_seed,
    check_seed_diversity,
    check_determinism,
    check_solvable,
    check_levels,
    check_not_trivial,
    check_reward_range,
    check_termination,
    check_robustness,
    check_hints,
    check_step_time,
    check_calibration,
]
"""The order a validation runs them in: cheapest first, so that a broken env fails
early; a failed static_gate, contract_shape or interface_fidelity with no env started
skips the rest. Where the order is load-bearing, ``NEEDS`` says why."""

NEEDS: dict[Check, tuple[Check, ...]] = {
    check_reset_every_seed: (check_interface_fidelity,),  # the env it starts (ctx.env)
    check_seed_diversity: (check_reset_every_seed,),  # the openings it saw (ctx.openings)
    check_solvable: (check_interface_fidelity,),
    check_levels: (check_interface_fidelity,),
    check_not_trivial: (check_interface_fidelity,),
    check_reward_range: (check_solvable, check_not_trivial),  # their oracle and floor episodes (ctx.episodes)
    check_termination: (check_solvable,),  # its oracle episodes
    check_robustness: (check_interface_fidelity,),
    check_hints: (check_interface_fidelity,),
    check_step_time: (check_solvable, check_not_trivial, check_reward_range),  # their steps (ctx.step_times)
    check_calibration: (check_interface_fidelity,),
}
"""What a check reads that an earlier one leaves in the context."""


def order_problems(checks: list[Check]) -> list[str]:
    """Where ``checks`` runs a check before one it needs (``NEEDS``); empty when none."""
    place = {check: i for i, check in enumerate(checks)}
    return [
        f"{check.__name__} runs before {needed.__name__}, which it needs"
        for check, needs in NEEDS.items()
        for needed in needs
        if check in place and place.get(needed, len(checks)) > place[check]
    ]
