"""Env validation CI: which registry envs a git change touches, and validating them together.

A contributor's pull request should validate exactly the environments it can
have changed: an env whose folder changed, and every env of a target whose
folder (its frozen ``tools.json``, result shapes or manifest) changed.
:func:`changed_envs` answers that from ``git diff`` against the merge base of a
ref; :func:`validate_many` runs the full validator on each selected env in its
own process (one env cannot take the others down) and returns one summary.

This module only selects and schedules: every check stays in
:mod:`trace_gym.validation`, and env code still runs only in the sandbox.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .errors import ManifestError, TraceGymError
from .hashing import uses_world_kit
from .registry import EnvEntry, EnvKind, read_manifest
from .validation import validate


class GitError(TraceGymError):
    """A git question could not be answered (not a repository, an unknown ref)."""


@dataclass
class ChangeSelection:
    """The registry envs a change touches, and why each was selected."""

    ref: str
    base: str
    changed_files: list[str]
    envs: dict[str, EnvEntry] = field(default_factory=dict)
    """Selected synthesized envs by id."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each env was selected (its folder, or its target's)."""
    removed: list[str] = field(default_factory=list)
    """Env folders the change deleted (nothing left to validate)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "base": self.base,
            "changed_files": self.changed_files,
            "selected": {i: self.reasons[i] for i in sorted(self.envs)},
            "removed": self.removed,
        }


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise GitError("git is not installed; --changed-since needs it") from None
    if done.returncode != 0:
        raise GitError(
            f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}"
        )
    return done.stdout


def repo_root(start: Path | str = ".") -> Path:
    try:
        return Path(_git(Path(start), "rev-parse", "--show-toplevel").strip())
    except GitError:
        raise GitError(f"{Path(start).resolve()} is not inside a git repository; --changed-since needs one") from None


def changed_files(repo: Path, ref: str) -> tuple[str, list[str]]:
    """Paths (relative to the repo) changed since the merge base of ``ref`` and HEAD,
    the working tree and untracked files included. Returns (base commit, paths)."""
    try:
        _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError:
        raise GitError(f"unknown git ref '{ref}' in {repo}") from None
    try:
        base = _git(repo, "merge-base", ref, "HEAD").strip()
    except GitError:  # unrelated histories: compare with the ref itself
        base = _git(repo, "rev-parse", ref).strip()
    tracked = _git(repo, "diff", "--name-only", "--no-renames", base, "--").splitlines()
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard").splitlines()
    return base, sorted({p for p in tracked + untracked if p})


def registry_folders(registry: Path) -> dict[str, EnvEntry]:
    """Every env folder directly under ``registry``, by folder name. A broken
    manifest is an error here: CI must not skip what it cannot read."""
    entries = {}
    for folder in sorted(p for p in registry.iterdir() if (p / "manifest.toml").is_file()):
        entries[folder.name] = read_manifest(folder)
    return entries


WORLD_KIT = "sandbox/world.py"


def changed_envs(ref: str, *, repo: Path | str | None = None, registry: Path | str | None = None) -> ChangeSelection:
    """The synthesized envs of ``registry`` (default ``<repo>/env_registry``) that a
    change since ``ref`` touches: their own folder, their target's folder, or the
    world kit they import."""
    root = repo_root(repo or ".")
    registry_dir = Path(registry).resolve() if registry else root / "env_registry"
    if not registry_dir.is_dir():
        raise TraceGymError(f"no registry folder at {registry_dir}")
    try:
        prefix = registry_dir.relative_to(root.resolve()).as_posix()
    except ValueError:
        raise TraceGymError(f"the registry {registry_dir} is not inside the repository {root}") from None
    base, files = changed_files(root, ref)
    selection = ChangeSelection(ref=ref, base=base, changed_files=files)
    try:
        folders = registry_folders(registry_dir)
    except ManifestError as exc:
        raise TraceGymError(f"cannot read the registry: {exc}") from None
    touched = {
        p.split("/")[0] for p in (f.removeprefix(prefix + "/") for f in files if f.startswith(prefix + "/")) if "/" in p
    }
    for name in sorted(touched):
        entry = folders.get(name)
        if entry is None:
            if not (registry_dir / name).exists():
                selection.removed.append(name)
            continue
        if entry.kind == EnvKind.SYNTHESIZED:
            selection.envs.setdefault(entry.id, entry)
            selection.reasons.setdefault(entry.id, f"{prefix}/{name}/ changed")
        else:
            for other in folders.values():
                if other.kind == EnvKind.SYNTHESIZED and other.target == entry.id:
                    selection.envs.setdefault(other.id, other)
                    selection.reasons.setdefault(other.id, f"its target {entry.id} ({prefix}/{name}/) changed")
    if WORLD_KIT in files:  # the kit's records and answers are part of what its envs were judged against
        for entry in folders.values():
            if entry.kind == EnvKind.SYNTHESIZED and uses_world_kit(
                (entry.path / "env.py").read_text(encoding="utf-8")
            ):
                selection.envs.setdefault(entry.id, entry)
                selection.reasons.setdefault(entry.id, f"the world kit it imports ({WORLD_KIT}) changed")
    return selection


@dataclass
class EnvOutcome:
    """One env's line of the summary: the report's verdict, or the error that stopped it."""

    env_id: str
    path: str
    passed: bool
    failed_checks: list[str]
    wall_s: float
    error: str | None = None
    report: dict[str, Any] | None = None


def _validate_one(path: str, backend: str, config: Any, write: bool) -> EnvOutcome:
    # Runs in a child process: any failure, even one the validator does not type, is
    # one FAIL line of the summary rather than the end of the whole CI run.

    try:
        report = validate(path, backend=backend, config=config, write=write)
    except Exception as exc:  # noqa: BLE001 - reported, never raised past the summary
        entry = read_manifest(Path(path))
        return EnvOutcome(entry.id, path, False, [], 0.0, error=f"{type(exc).__name__}: {exc}")
    data = report.as_dict()
    return EnvOutcome(report.env_id, path, report.passed, report.failed(), report.wall_s, report=data)


def validate_many(
    paths: Iterable[Path | str],
    *,
    backend: str = "auto",
    config: Any = None,
    jobs: int = 2,
    write: bool = True,
    progress: Callable[[EnvOutcome], None] | None = None,
) -> list[EnvOutcome]:
    """Validate each env folder in its own worker process, ``jobs`` at a time.

    Outcomes come back in the order of ``paths``; ``progress`` sees each as it ends.
    """
    paths = [str(p) for p in paths]
    if not paths:
        return []
    if jobs < 1:
        raise TraceGymError(f"--jobs must be at least 1, got {jobs}")
    outcomes: dict[str, EnvOutcome] = {}
    # spawn, not fork: the parent may hold threads (progress, sandbox readers).
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(paths)), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {pool.submit(_validate_one, p, backend, config, write): p for p in paths}

        for future in as_completed(futures):
            path = futures[future]
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker process that died
                outcome = EnvOutcome(Path(path).name, path, False, [], 0.0, error=f"validation worker died: {exc}")
            outcomes[path] = outcome
            if progress:
                progress(outcome)
    return [outcomes[p] for p in paths]


def summary_rows(outcomes: list[EnvOutcome]) -> list[dict[str, str]]:
    return [
        {
            "env": o.env_id,
            "result": "PASS" if o.passed else "FAIL",
            "failed checks": o.error or ", ".join(o.failed_checks) or "-",
            "wall s": f"{o.wall_s:.1f}",
        }
        for o in outcomes
    ]


def summary_json(outcomes: list[EnvOutcome], selection: ChangeSelection | None = None) -> str:
    return json.dumps(
        {
            "passed": all(o.passed for o in outcomes),
            "selection": selection.as_dict() if selection else None,
            "envs": [
                {
                    "env_id": o.env_id,
                    "path": o.path,
                    "passed": o.passed,
                    "failed_checks": o.failed_checks,
                    "wall_s": o.wall_s,
                    "error": o.error,
                    "report": o.report,
                }
                for o in outcomes
            ],
        },
        indent=2,
    )
