"""The synthesis loop for one capability: generate, gate, validate, repair, calibrate, register.

1. Ask the analyst for env.py (``prompts/generate_v1.md``).
2. Extract the code; run the sandbox's static gate on it (nothing executes yet).
3. Validate it in the sandbox through ``trace_gym.validation.validate`` (every
   check with its evidence), in a staging folder that the registry cannot see.
4. On failure, send the failing checks' evidence back in the same conversation
   and ask for a repair, up to ``max_attempts`` answers per variant.
5. With a calibration policy, read the validator's calibration check: if the
   policy succeeds too often (or never), ask for a harder (or easier) variant
   and say why, up to ``max_calibration_rounds``.
6. Write ``<registry>/<name>/`` atomically: the staging folder gets the final
   manifest (with provenance), README and ``validation.json``, then one
   ``rename`` makes it visible. A run that never validates leaves nothing.

This module never imports or executes env code in this process: the gate reads
it as text and every execution happens in a sandbox worker.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from enum import StrEnum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from trace_gym.errors import TraceGymError
from trace_gym.hashing import code_hash
from trace_gym.identification.stats import capability_id
from trace_gym.registry import EnvEntry, EnvKind, ValidationStatus, discover, read_manifest
from trace_gym.sandbox import Layer, check_source
from trace_gym.validation import CheckResult, ValidationConfig, ValidationReport, validate

from .prompt import TEMPLATE_VERSION, Capability, TargetContext, generation_prompt, render, template_hash

STAGING = ".synthesis"
"""Hidden folder of a registry dir where candidates are validated; the registry
reads only its direct children, so nothing here is ever registered."""


class SynthesisError(TraceGymError):
    """Synthesis could not run (bad input, a folder in the way)."""


@dataclass
class SynthesisConfig:
    """How hard the loop tries. Defaults follow TRACE's research code where it has one."""

    max_attempts: int = 5
    """Answers per variant (the first one and its repairs) before giving up (TRACE: up to 5 rewrites)."""
    max_calibration_rounds: int = 2
    """Harder or easier variants asked for when calibration is out of band."""
    policy: str | None = None
    """An agent for calibration (``trace-gym validate --policy``); none: calibration is skipped, and said so."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Thresholds of the validator (its ``policy`` is set from ``policy``)."""
    backend: Any = "auto"
    """Sandbox backend for validation."""
    resume: bool = False
    """Keep a capability already registered whose manifest code hash matches its files."""


class AttemptKind(StrEnum):
    """What the analyst was asked for."""

    GENERATE = "generate"
    """A first env for the capability."""
    REPAIR = "repair"
    """The previous answer again, with the failing checks' evidence."""
    HARDER = "harder"
    """A harder variant: the policy succeeded too often (calibration)."""
    EASIER = "easier"
    """An easier variant: the policy (almost) never succeeded (calibration)."""


class Status(StrEnum):
    """What synthesis did for a capability."""

    REGISTERED = "registered"
    """A new env was validated and written to the registry."""
    SERVED = "served"
    """An existing registry env serves it (offline ``registry`` analyst)."""
    KEPT = "kept"
    """Already registered with a matching code hash (``--resume``)."""
    NOT_SYNTHESIZED = "not_synthesized"
    """No registry env serves it and no analyst was asked."""
    FAILED = "failed"
    """Nothing valid came of it; nothing was registered."""


class Refusal(StrEnum):
    """What refused an attempt other than a sandbox layer (``Layer``); equal to its string."""

    ANSWER = "answer (no code)"
    STATIC_GATE = "static gate"
    VALIDATION = "validation"


@dataclass
class Attempt:
    """One answer of the analyst and what became of it."""

    number: int
    kind: AttemptKind
    passed: bool
    failing_checks: list[str]
    evidence: dict[str, str]
    stopped_by: Refusal | Layer | None
    """What refused it: the answer, the static gate, a sandbox layer, validation; None when it passed."""
    code_sha256: str | None = None
    calibration: dict[str, Any] | None = None


@dataclass
class Outcome:
    """What synthesis did for one capability."""

    capability: str
    status: Status
    message: str
    env_id: str | None = None
    path: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    last_report: str = ""

    @property
    def ok(self) -> bool:
        """The capability has an env to train in."""
        return self.status in (Status.REGISTERED, Status.SERVED, Status.KEPT)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- code extraction -------------------------------------------------------------
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(answer: str) -> str:
    """env.py from an analyst's answer: the last fenced block that defines ``class Environment``."""
    blocks = [body for lang, body in _FENCE.findall(answer or "") if lang.lower() in ("", "python", "py", "python3")]
    with_env = [b for b in blocks if "class Environment" in b]
    if with_env:
        return with_env[-1].strip() + "\n"
    if "class Environment" in (answer or "") and "```" not in answer:
        return answer.strip() + "\n"
    raise SynthesisError("the answer has no ```python block defining class Environment")


# --- the loop ----------------------------------------------------------------------
class Synthesizer:
    """Synthesizes envs for one target into one registry dir with one analyst."""

    def __init__(
        self,
        analyst: Any,
        target: EnvEntry,
        context: TargetContext,
        registry_dir: str | Path,
        config: SynthesisConfig | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        if target.kind != EnvKind.TARGET or not target.tools_path.exists():
            raise SynthesisError(f"{target.id} is not a target with frozen tool schemas (tools.json)")
        self.analyst = analyst
        self.target = target
        self.context = context
        self.registry_dir = Path(registry_dir)
        self.config = config or SynthesisConfig()
        if self.config.max_attempts < 1 or self.config.max_calibration_rounds < 0:
            raise SynthesisError("--max-attempts must be >= 1 and --max-calibration-rounds >= 0")
        self.say = progress or (lambda message: None)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(self.registry_dir)

    def run(self, capability: Capability) -> Outcome:
        name = env_name(capability.name)
        folder = self.registry_dir / name
        if folder.exists():
            return self._existing(capability, folder)
        env_id = self._free_id(name)
        staging = self.registry_dir / STAGING / f"{name}.{os.getpid()}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        try:
            return self._run(capability, env_id, staging, folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def _run(self, capability: Capability, env_id: str, staging: Path, folder: Path) -> Outcome:
        # one seed for the run's validations: the final re-validation replays the seeds the candidate passed on
        # (fresh seeds there would judge a borderline env anew, not its determinism)
        self._validation_seed = (
            self.config.validation.seed if self.config.validation.seed is not None else secrets.randbits(31)
        )
        validation_config = ValidationConfig(
            **{**asdict(self.config.validation), "policy": self.config.policy, "seed": self._validation_seed}
        )
        messages = [{"role": "user", "content": generation_prompt(capability, self.context)}]
        attempts: list[Attempt] = []
        best: tuple[str, ValidationReport, dict[str, Any] | None] | None = None
        last_report = ""
        kind = AttemptKind.GENERATE
        for round_ in range(self.config.max_calibration_rounds + 1):
            valid = None
            for _ in range(self.config.max_attempts):
                number = len(attempts) + 1
                self.say(f"{capability.name}: attempt {number} ({kind})")
                answer = self.analyst.converse(messages)
                messages.append({"role": "assistant", "content": answer})
                attempt, code, report = self._try(number, kind, answer, env_id, capability, staging, validation_config)
                attempts.append(attempt)
                last_report = (f"attempt {number} refused by {attempt.stopped_by}:\n" if not attempt.passed else "") + (
                    report.table() if report else _evidence_text(attempt.evidence)
                )
                if attempt.passed:
                    valid = (code, report, attempt.calibration)
                    break
                self.say(
                    f"{capability.name}: attempt {number} refused by {attempt.stopped_by}: {', '.join(attempt.failing_checks)}"
                )
                messages.append(
                    {
                        "role": "user",
                        "content": render("repair", attempt=number, evidence=_evidence_text(attempt.evidence)),
                    }
                )
                kind = AttemptKind.REPAIR
            if valid is None:
                break  # this variant never validated: keep the previous valid one, if any
            best = _closer(best, valid, validation_config)
            calibration = valid[2]
            if calibration is None or calibration["in_band"]:
                break
            if round_ == self.config.max_calibration_rounds:
                break
            direction, reason, advice = calibration_request(calibration, validation_config)
            kind = AttemptKind(direction)
            self.say(f"{capability.name}: calibration out of band ({reason}); asking for a {direction} variant")
            messages.append(
                {
                    "role": "user",
                    "content": render(
                        "calibrate",
                        policy=self.config.policy,
                        figures=calibration["evidence"],
                        reason=reason,
                        direction=direction,
                        advice=advice,
                    ),
                }
            )
        if best is None:
            last = attempts[-1]
            return Outcome(
                capability.name,
                Status.FAILED,
                f"no valid env after {len(attempts)} attempts (the last refused by "
                f"{last.stopped_by}: {', '.join(last.failing_checks)}); nothing was registered",
                attempts=attempts,
                last_report=last_report,
            )
        code, report, calibration = best
        try:
            self._write(capability, env_id, staging, folder, code, attempts, calibration)
        except SynthesisError as exc:
            return Outcome(
                capability.name,
                Status.FAILED,
                f"{exc}; nothing was registered",
                attempts=attempts,
                last_report=last_report,
            )
        in_band = (
            ""
            if calibration is None
            else (
                " (calibration in band)"
                if calibration["in_band"]
                else " (WARNING: calibration still out of band after "
                f"{self.config.max_calibration_rounds} rounds; the closest variant was kept)"
            )
        )
        note = "" if self.config.policy else " (calibration skipped: no --policy)"
        return Outcome(
            capability.name,
            Status.REGISTERED,
            f"registered {env_id} after {len(attempts)} attempts{in_band}{note}",
            env_id=env_id,
            path=str(folder),
            attempts=attempts,
            last_report=report.table(),
        )

    def _try(
        self,
        number: int,
        kind: AttemptKind,
        answer: str,
        env_id: str,
        capability: Capability,
        staging: Path,
        validation_config: ValidationConfig,
    ) -> tuple[Attempt, str | None, ValidationReport | None]:
        try:
            code = extract_code(answer)
        except SynthesisError as exc:
            return Attempt(number, kind, False, ["answer"], {"answer": str(exc)}, Refusal.ANSWER), None, None
        sha = hashlib.sha256(code.encode()).hexdigest()
        findings = check_source(code)
        if findings:
            evidence = {"static_gate": "; ".join(str(f) for f in findings[:8])}
            return Attempt(number, kind, False, ["static_gate"], evidence, Refusal.STATIC_GATE, sha), code, None
        (staging / "env.py").write_text(code, encoding="utf-8")
        (staging / "manifest.toml").write_text(
            manifest_text(env_id, self.target.id, capability, None), encoding="utf-8"
        )
        report = validate(staging, backend=self.config.backend, config=validation_config, write=False)
        failed = [c for c in report.checks if c.passed is False and c.name != "calibration"]
        calibration = _calibration(report)
        if failed:
            evidence = {c.name: c.evidence for c in failed}
            return (
                Attempt(
                    number, kind, False, [c.name for c in failed], evidence, stopping_layer(failed), sha, calibration
                ),
                code,
                report,
            )
        return Attempt(number, kind, True, [], {}, None, sha, calibration), code, report

    def _write(
        self,
        capability: Capability,
        env_id: str,
        staging: Path,
        folder: Path,
        code: str,
        attempts: list[Attempt],
        calibration: dict[str, Any] | None,
    ) -> None:
        """Final files in the staging folder, a final validation of exactly them, then one rename."""
        (staging / "env.py").write_text(code, encoding="utf-8")
        provenance = {
            "author": "trace-gym synthesize",
            "analyst": getattr(self.analyst, "name", "unknown"),
            "template_version": TEMPLATE_VERSION,
            "template_sha256": template_hash(),
            "env_sha256": hashlib.sha256(code.encode()).hexdigest(),
            "synthesized_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "policy": self.config.policy or "",
            "attempts": [
                {
                    "number": a.number,
                    "kind": a.kind,
                    "passed": a.passed,
                    "failing_checks": a.failing_checks,
                    "stopped_by": a.stopped_by or "",
                    "code_sha256": a.code_sha256 or "",
                }
                for a in attempts
            ],
            "code_hash": "",  # filled in below: the hash leaves code_hash lines out
            "calibration": _calibration_figures(calibration),
        }
        (staging / "manifest.toml").write_text(
            manifest_text(env_id, self.target.id, capability, provenance), encoding="utf-8"
        )
        final_config = ValidationConfig(
            **{**asdict(self.config.validation), "policy": None, "seed": self._validation_seed}
        )
        report = validate(staging, backend=self.config.backend, config=final_config, write=True)
        if not report.passed:
            raise SynthesisError(
                f"{env_id} passed validation but not its final re-validation (is it deterministic?): "
                + ", ".join(report.failed())
            )
        digest = code_hash(staging)
        text = (staging / "manifest.toml").read_text(encoding="utf-8")
        (staging / "manifest.toml").write_text(
            text.replace('code_hash = ""', f'code_hash = "{digest}"', 1), encoding="utf-8"
        )
        (staging / "README.md").write_text(
            readme_text(env_id, self.target.id, capability, code, provenance, report), encoding="utf-8"
        )
        for path in staging.iterdir():  # on disk before the rename makes the folder visible
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(staging, folder)
        _fsync_dir(self.registry_dir)

    def _existing(self, capability: Capability, folder: Path) -> Outcome:
        entry = read_manifest(folder)
        recorded = entry.manifest.get("provenance", {}).get("code_hash")
        if not self.config.resume:
            return Outcome(
                capability.name,
                Status.FAILED,
                f"{folder} already exists; pass --resume to keep it, or move it away to redo it",
                env_id=entry.id,
                path=str(folder),
            )
        if recorded and recorded == code_hash(folder) and entry.validation_status() == ValidationStatus.PASSED:
            return Outcome(
                capability.name,
                Status.KEPT,
                f"{entry.id} is already registered with a matching code hash; not redone",
                env_id=entry.id,
                path=str(folder),
            )
        return Outcome(
            capability.name,
            Status.FAILED,
            f"{folder} exists but its code hash does not match its manifest "
            "(edited since synthesis, or never validated); move it away to redo it",
            env_id=entry.id,
            path=str(folder),
        )

    def _free_id(self, name: str) -> str:
        taken = set(discover())
        version = 0
        while f"trace/{name}-v{version}" in taken:
            version += 1
        return f"trace/{name}-v{version}"


# --- calibration -------------------------------------------------------------------
def _calibration(report: ValidationReport) -> dict[str, Any] | None:
    check = next((c for c in report.checks if c.name == "calibration"), None)
    if check is None or check.passed is None:
        return None
    groups = check.details.get("groups") or []
    flat = [r for g in groups for r in g]
    config = report.config
    success_at = config.get("solvable_reward", 0.99)
    return {
        "in_band": bool(check.passed),
        "evidence": check.evidence,
        "groups": groups,
        "mean_reward": sum(flat) / len(flat) if flat else 0.0,
        "success_rate": sum(r >= success_at for r in flat) / len(flat) if flat else 0.0,
        "all_success_groups": sum(all(r >= success_at for r in g) for g in groups) / len(groups) if groups else 0.0,
        "all_zero_groups": sum(all(r == 0 for r in g) for g in groups) / len(groups) if groups else 0.0,
        "constant_groups": sum(len(set(g)) == 1 for g in groups) / len(groups) if groups else 0.0,
        "pass_at_k": check.details.get("pass_at_k", {}),
    }


def calibration_request(calibration: dict[str, Any], config: ValidationConfig) -> tuple[str, str, str]:
    """(harder|easier, why, what to change) for a calibration out of band."""
    low, high = config.calibration_band
    mean, success = calibration["mean_reward"], calibration["success_rate"]
    if mean > high or success > high or calibration["all_success_groups"] > config.max_all_success_groups:
        reason = (
            f"the policy succeeds too often: mean reward {mean:.2f}, success rate {success:.2f}, "
            f"all-success groups {calibration['all_success_groups']:.2f} (band [{low}, {high}], "
            f"all-success groups <= {config.max_all_success_groups})"
        )
        return (
            "harder",
            reason,
            (
                "more steps or facts to combine, look-alike distractors, and less of the answer "
                "stated in the user message, so that success needs the capability"
            ),
        )
    if mean < low or success < low or calibration["all_zero_groups"] > config.max_all_zero_groups:
        reason = (
            f"the policy rarely succeeds: mean reward {mean:.2f}, success rate {success:.2f}, "
            f"all-zero groups {calibration['all_zero_groups']:.2f} (band [{low}, {high}], "
            f"all-zero groups <= {config.max_all_zero_groups})"
        )
        return (
            "easier",
            reason,
            (
                "fewer steps, clearer user requests and more partial credit for the first steps, "
                "so that some rollouts succeed"
            ),
        )
    reason = (
        f"rewards do not vary within groups: constant groups {calibration['constant_groups']:.2f} "
        f"(at most {config.max_constant_groups})"
    )
    return "more graded", reason, "reward components that separate partial from complete work within one seed"


def _closer(best, candidate, config: ValidationConfig):
    """The variant whose calibration is nearer the band (a later one wins ties)."""
    if best is None or candidate[2] is None or best[2] is None:
        return candidate
    low, high = config.calibration_band

    def distance(cal):
        return sum(max(0.0, low - v, v - high) for v in (cal["mean_reward"], cal["success_rate"]))

    return candidate if distance(candidate[2]) <= distance(best[2]) else best


def _calibration_figures(calibration: dict[str, Any] | None) -> dict[str, Any]:
    if calibration is None:
        return {"run": False}
    keys = ("in_band", "mean_reward", "success_rate", "all_success_groups", "all_zero_groups", "constant_groups")
    figures: dict[str, Any] = {
        "run": True,
        **{k: (round(calibration[k], 4) if isinstance(calibration[k], float) else calibration[k]) for k in keys},
    }
    figures["pass_at_k"] = {str(k): round(v, 4) for k, v in calibration["pass_at_k"].items()}
    figures["groups"] = len(calibration["groups"])
    return figures


# --- evidence and layers -------------------------------------------------------------
def stopping_layer(failed: list[CheckResult]) -> Refusal | Layer:
    """Which layer refused a candidate that passed the gate: the sandbox layer a failed
    check met (its typed error's ``layer``), else the validator's checks."""
    return next((c.sandbox_layer for c in failed if c.sandbox_layer), Refusal.VALIDATION)


def _evidence_text(evidence: dict[str, str]) -> str:
    return "\n".join(f"- {name}: {text}" for name, text in evidence.items())


# --- files -------------------------------------------------------------------------
def env_name(capability: str) -> str:
    """The env folder a capability's env is written to: its id (``capability_id``) in dashes."""
    name = capability_id(capability).replace("_", "-")[:48].strip("-")
    if len(name) < 3 or not name[0].isalpha():
        name = f"env-{name}".strip("-")
    return name


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def manifest_text(env_id: str, target: str, capability: Capability, provenance: dict[str, Any] | None) -> str:
    lines = [
        f"id = {_toml(env_id)}",
        'kind = "synthesized"',
        f"target = {_toml(target)}",
        f"description = {_toml('Trains ' + capability.name + ' for ' + target + ' (synthesized).')}",
        "",
        "[capability]",
        f"name = {_toml(capability.name)}",
        f"description = {_toml(capability.description)}",
        f"serves = {_toml([capability.name])}",
    ]
    if provenance is not None:
        lines += ["", "[provenance]"]
        nested = {k: v for k, v in provenance.items() if isinstance(v, (dict, list)) and k != "attempts"}
        for key, value in provenance.items():
            if key not in nested and key != "attempts":
                lines.append(f"{key} = {_toml(value)}")
        for key, value in nested.items():
            lines += ["", f"[provenance.{key}]"] + [f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()]
        for attempt in provenance.get("attempts", []):
            lines += ["", "[[provenance.attempts]]"] + [f"{k} = {_toml(v)}" for k, v in attempt.items()]
    return "\n".join(lines) + "\n"


def readme_text(
    env_id: str, target: str, capability: Capability, code: str, provenance: dict[str, Any], report: ValidationReport
) -> str:
    rationale = ast.get_docstring(ast.parse(code)) or ""
    attempts = provenance["attempts"]
    history = "\n".join(
        f"- attempt {a['number']} ({a['kind']}): "
        + ("passed" if a["passed"] else f"refused by {a['stopped_by']} ({', '.join(a['failing_checks'])})")
        for a in attempts
    )
    cal = provenance["calibration"]
    calibration = (
        "not run (no --policy)"
        if not cal.get("run")
        else f"policy `{provenance['policy']}`: mean reward {cal['mean_reward']}, success rate {cal['success_rate']}, "
        f"{'in' if cal['in_band'] else 'OUT OF'} band"
    )
    return f"""# {env_id}

**Capability:** {capability.name}: {capability.description}

**Target:** `{target}`. Synthesized by `{provenance["analyst"]}` with prompt templates
{provenance["template_version"]} (sha256 {provenance["template_sha256"][:12]}).

## What it trains
{rationale}

## How it was made
{history}

Calibration: {calibration}.

Validation ({report.backend}): {"passed" if report.passed else "FAILED"}, {len(report.checks)} checks; see `validation.json`.
"""


def clean_staging(registry_dir: Path) -> None:
    """Remove staging folders of runs that are no longer alive (a kill -9 leaves them)."""
    root = Path(registry_dir) / STAGING
    if not root.is_dir():
        return
    for folder in root.iterdir():
        pid = folder.name.rsplit(".", 1)[-1]
        if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
