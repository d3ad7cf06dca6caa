"""Validate a synthesized environment: small named checks, each with its evidence.

Modelled on Gymnasium's ``env_checker``: one check per property, a report that
lists every check, what it saw and why it passed or failed. Every check runs
the env through the sandbox (``SandboxedEnv``), never in this process.

The checks, in order: static_gate, contract_shape, interface_fidelity,
reset_every_seed, seed_diversity, determinism, solvable, not_trivial,
reward_range, termination, robustness, hints, step_time; and, when a policy is
given, calibration. A failed static gate or contract stops the rest (they are
reported as skipped).

Validation ends in bounded time whatever the env does: every sandbox call is
bounded by what is left of ``time_budget_s`` (past it the running check fails
and the rest are skipped), a worker that hangs or dies during an episode stops
the running check at once (its first decisive failure), and every episode is
cut at the validator's own ``max_episode_steps``, whatever the env declares.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..errors import TraceGymError
from ..hashing import code_hash
from ..registry import VALIDATION_REPORT, EnvKind, get_entry
from trace_gym.sandbox import select_backend
from .checks import CHECKS, check_calibration, check_contract_shape, check_interface_fidelity, check_static_gate
from .context import CheckStopped, Context, TimeBudgetExhausted, draw_seeds, revive_quietly
from .hints import hint_leaks, stated_numbers
from .report import CheckResult, ValidationConfig, ValidationReport

__all__ = [
    "CHECKS",
    "CheckResult",
    "ValidationConfig",
    "ValidationReport",
    "draw_seeds",
    "env_folder",
    "hint_leaks",
    "stated_numbers",
    "validate",
]


def validate(
    path_or_id: str | Path,
    *,
    backend: Any = "auto",
    config: ValidationConfig | None = None,
    write: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Run every check on an env folder (or registered env id) and return the report.

    With ``write=True`` the report is stored as ``validation.json`` beside env.py,
    with the code hash it was made for (``trace-gym envs list`` shows it stale
    once the code changes).
    """
    path = env_folder(path_or_id)
    config = config or ValidationConfig()
    backend_obj = select_backend(backend) if isinstance(backend, str) else backend
    ctx = Context(path, backend_obj, config)
    started = time.perf_counter()
    results: list[CheckResult] = []
    stop = False
    for check in CHECKS:
        if check is check_calibration and not config.policy:
            continue
        if stop:
            reason = stop if isinstance(stop, str) else "skipped: an earlier check failed"
            results.append(CheckResult(check.__name__.removeprefix("check_"), None, reason))
            continue
        if progress:
            progress(check.__name__.removeprefix("check_"))
        t0 = time.perf_counter()
        ctx.layers.clear()
        try:
            result = check(ctx)
        except TraceGymError as exc:
            result = CheckResult(check.__name__.removeprefix("check_"), False, f"error: {exc}")
        except CheckStopped as exc:
            result = CheckResult(
                check.__name__.removeprefix("check_"), False, f"stopped at the first decisive failure: {exc}"
            )
        except TimeBudgetExhausted as exc:
            result = CheckResult(
                check.__name__.removeprefix("check_"),
                False,
                f"the validation's time budget ({config.time_budget_s:g}s) ran out during this check ({exc}): the env is too slow to judge",
            )
            stop = "skipped: the validation's time budget ran out"
        except Exception as exc:  # noqa: BLE001 - a reply no check foresaw still ends as a FAIL with evidence
            result = CheckResult(
                check.__name__.removeprefix("check_"),
                False,
                f"error: the env's answers broke this check ({type(exc).__name__}: {str(exc)[:300]})",
                {"traceback": traceback.format_exc()[-4000:]},
            )
            revive_quietly(ctx)
        result.seconds = round(time.perf_counter() - t0, 3)
        if result.passed is False and ctx.layers:
            result.sandbox_layer = ctx.layers[0]
        results.append(result)
        if (
            result.passed is False
            and check in (check_static_gate, check_contract_shape, check_interface_fidelity)
            and ctx.env is None
        ):
            stop = stop or True
    if ctx.env is not None:
        ctx.env.close()
    report = ValidationReport(
        env_id=ctx.entry.id,
        path=_shown_path(path),
        code_hash=code_hash(path),
        backend=backend_obj.name,
        passed=all(r.passed is not False for r in results),
        checks=results,
        wall_s=round(time.perf_counter() - started, 2),
        validated_at=datetime.now(timezone.utc).isoformat(),
        config={**asdict(config), "seed": ctx.run_seed},  # the seeds drawn: replayable with this seed
        target_hash=ctx.target_hash,
    )
    if write:
        (path / VALIDATION_REPORT).write_text(json.dumps(report.as_dict(), indent=2) + "\n", encoding="utf-8")
    return report


def _shown_path(path: Path) -> str:
    """The env folder as a report records it: relative to the working directory when inside it,
    so that a committed report names no machine's absolute path."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def env_folder(path_or_id: str | Path) -> Path:
    """The folder of an env given as a folder (with manifest.toml) or a registered id."""
    candidate = Path(path_or_id)
    if (candidate / "manifest.toml").exists():
        return candidate
    if candidate.name == "env.py" and (candidate.parent / "manifest.toml").exists():
        return candidate.parent
    if str(path_or_id).startswith(("trace/", "trace_gym:")):
        entry = get_entry(str(path_or_id))
        if entry.kind != EnvKind.SYNTHESIZED:
            raise TraceGymError(f"{entry.id} is a target; only synthesized envs are validated")
        return entry.path
    raise TraceGymError(f"{path_or_id} is neither an env folder (with manifest.toml) nor a registered env id")
