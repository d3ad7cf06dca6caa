"""The environment registry: one folder per env, each with a ``manifest.toml``.

``import trace_gym`` calls :func:`register_all`, which reads the manifests
(tomllib, no other import) and registers Gymnasium specs with string entry
points: nothing heavy is imported until an env is made. Folders come from the
installed ``trace_gym.env_registry`` package, the packages that installed
distributions name in the ``trace_gym.registry`` entry-point group, any listed
in the ``TRACE_GYM_REGISTRY_PATH`` environment variable (``os.pathsep``-separated:
the user's setting), and those a program adds with :func:`add_registry_dir` (a
run's own synthesized envs; library code never edits the variable).

A manifest::

    id = "trace/structured-data-v0"
    kind = "synthesized"                 # or "target"
    target = "trace/tau2-retail-v0"      # synthesized: the target it trains for
    entry_point = "trace_gym.sandbox.env:SandboxedEnv"   # optional for synthesized
    description = "..."
    agent = "a retail store's customer-service agent"   # optional, targets: words for prompts
    [capability]                         # synthesized only
    name = "communicates_required_info"   # the capability id identification gives it
    description = "..."
    [kwargs]                             # passed to the entry point
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import warnings
from dataclasses import dataclass, field, fields
from enum import StrEnum
from importlib.machinery import PathFinder
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .errors import ManifestError, TraceGymError, UnknownEnvError
from .tools import CallErrorStyle

NAMESPACE = "trace"
SANDBOXED_ENTRY_POINT = "trace_gym.sandbox.env:SandboxedEnv"
VALIDATION_REPORT = "validation.json"


class EnvKind(StrEnum):
    """What an env folder holds (a manifest's ``kind``)."""

    TARGET = "target"  # the environment to get better at: its code is the benchmark's own
    SYNTHESIZED = "synthesized"  # a training env written for one capability of a target; runs sandboxed


class ValidationStatus(StrEnum):
    """Where an env stands with validation (``EnvEntry.validation_status``)."""

    TRUSTED = "trusted"  # a target: not validated, it is the reference
    UNVALIDATED = "unvalidated"  # no readable validation report
    PASSED = "passed"
    FAILED = "failed"
    STALE = "stale"  # the env's code, or its target's frozen interface, changed since its report


@dataclass(frozen=True)
class EnvEntry:
    """What the registry knows of one env folder."""

    id: str
    kind: EnvKind
    path: Path
    entry_point: str
    target: str | None = None
    description: str = ""
    capability: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def tools_path(self) -> Path:
        return self.path / "tools.json"

    def call_error_style(self):
        """The target's wording for calls it cannot run (manifest ``[call_errors]``)."""
        return CallErrorStyle(**self.manifest.get("call_errors", {}))

    @property
    def agent(self) -> str:
        """What the target's agent is, in words for prompts (the analyst's, the router's):
        the manifest's ``agent``, else the id and the first clause of its description."""
        words = self.manifest.get("agent")
        if isinstance(words, str) and words.strip():
            return words.strip()
        clause = self.description.split(":")[0].split("(")[0].strip().rstrip(".")
        return f"a tool-using agent on {self.id}" + (f" ({clause})" if clause else "")

    def validation_status(self) -> ValidationStatus:
        """Where this env stands with validation, judged afresh from its report and code."""
        if self.kind == EnvKind.TARGET:
            return ValidationStatus.TRUSTED
        report_path = self.path / VALIDATION_REPORT
        if not report_path.exists():
            return ValidationStatus.UNVALIDATED
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return ValidationStatus.UNVALIDATED
        from .hashing import code_hash, interface_hash  # local: keeps import trace_gym small

        if report.get("code_hash") != code_hash(self.path):
            return ValidationStatus.STALE
        try:
            target_hash = interface_hash(get_entry(self.target).path, self.path)
        except UnknownEnvError:
            return ValidationStatus.STALE  # its target is gone: nothing it was judged against is left
        if report.get("target_hash") != target_hash:
            return ValidationStatus.STALE
        return ValidationStatus.PASSED if report.get("passed") else ValidationStatus.FAILED


ENTRY_POINT_GROUP = "trace_gym.registry"


_ADDED: list[Path] = []
"""Folders :func:`add_registry_dir` made visible to this process."""


def registry_dirs() -> list[Path]:
    """Folders that hold env folders: the installed registry first, then those of
    installed packages' ``trace_gym.registry`` entry points, then ``TRACE_GYM_REGISTRY_PATH``'s,
    then those added with :func:`add_registry_dir`."""
    from . import env_registry  # a package with no code, cheap to import

    dirs = [Path(p) for p in env_registry.__path__]
    dirs += entry_point_dirs()
    extra = os.environ.get("TRACE_GYM_REGISTRY_PATH", "")
    dirs += [Path(p) for p in extra.split(os.pathsep) if p]
    return dirs + [d for d in _ADDED if d not in dirs]


def add_registry_dir(folder: str | Path) -> bool:
    """Make a folder of env folders (each with a ``manifest.toml``) visible to this
    process's registry and ``gym.make``, after every other source; returns False when
    it was already visible. Other processes do not see it: a program that starts
    workers passes them ``registry_dirs()`` (the Ray executor does), and a user who
    wants it everywhere puts it on ``TRACE_GYM_REGISTRY_PATH``."""
    path = Path(folder).resolve()
    if any(path == d.resolve() for d in registry_dirs()):
        return False
    _ADDED.append(path)
    register_all()
    return True


def agent_words(env_id: str | None) -> str:
    """``EnvEntry.agent`` of ``env_id``; of a synthesized env, its target's; a plain
    phrase for an id the registry does not hold."""
    try:
        entry = get_entry(env_id) if env_id else None
        if entry is not None and entry.kind == EnvKind.SYNTHESIZED and entry.target:
            entry = get_entry(entry.target)
    except UnknownEnvError:
        entry = None
    return entry.agent if entry is not None else "a tool-using agent"


def entry_point_dirs() -> list[Path]:
    """The folders installed packages register: an entry point in the ``trace_gym.registry``
    group names a package (``my_envs = "my_pkg.envs"``) whose folder holds env folders.
    The folder is found on ``sys.path`` without importing anything (no package's code runs
    at ``import trace_gym``); one that cannot be found is a warning, never a failure."""
    dirs = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            locations = _package_folders(point.value.split(":", 1)[0].strip())
            problem = "no such package on sys.path"
        except Exception as exc:  # noqa: BLE001 - someone else's broken install must not stop trace_gym
            locations, problem = [], f"{type(exc).__name__}: {exc}"
        if not locations:
            warnings.warn(
                f"entry point {point.name} = {point.value!r} ({ENTRY_POINT_GROUP}): {problem}; its envs are "
                "not registered",
                stacklevel=2,
            )
        dirs += locations
    return dirs


def _package_folders(dotted: str) -> list[Path]:
    """The folders of package ``dotted``, found part by part on ``sys.path`` (importlib's
    path finder, which reads directories and imports nothing)."""
    path = None
    for part in dotted.split("."):
        spec = PathFinder.find_spec(part, path)
        if spec is None or not spec.submodule_search_locations:
            return []
        path = list(spec.submodule_search_locations)
    return [Path(p) for p in path or []]


MANIFEST_FIELDS = {
    "": ("id", "kind", "entry_point", "target", "description", "agent", "kwargs", "call_errors", "capability",
         "splits", "provenance"),
    "capability": ("name", "description", "serves"),
}  # fmt: skip


def _check_fields(path: Path, data: dict[str, Any]) -> None:
    """Every field of a manifest is one trace-gym reads: a misspelt one (``descripton``,
    ``[kwarg]``) would otherwise be dropped without a word."""
    for table, known in MANIFEST_FIELDS.items():
        fields = data.get(table, {}) if table else data
        if not isinstance(fields, dict):
            raise ManifestError(f"{path}: [{table}] must be a table")
        for key in fields:
            if key not in known:
                where = f"[{table}] has" if table else "has"
                raise ManifestError(f"{path}: {where} no field '{key}'; it takes {', '.join(known)}")


def _check_call_errors(path: Path, table: Any) -> None:
    """A target's ``[call_errors]`` holds only the wordings ``tools.CallErrorStyle`` knows,
    each of its type: a misspelt one is the target's mistake, named here and not when a
    training env written for the target first answers a misnamed call."""
    if not isinstance(table, dict):
        raise ManifestError(f"{path}: [call_errors] must be a table of wordings (docs/targets.md)")
    known = {f.name: type(f.default) for f in fields(CallErrorStyle)}
    for key, value in table.items():
        if key not in known:
            raise ManifestError(f"{path}: [call_errors] has no '{key}'; it takes {', '.join(sorted(known))}")
        if not isinstance(value, known[key]):
            raise ManifestError(
                f"{path}: [call_errors] {key} must be a {known[key].__name__}, got {type(value).__name__}"
            )


def read_manifest(folder: Path) -> EnvEntry:
    path = folder / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{folder} has no manifest.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML ({exc})") from None
    _check_fields(path, data)
    env_id = data.get("id")
    if not isinstance(env_id, str) or not env_id.startswith(f"{NAMESPACE}/") or "-v" not in env_id:
        raise ManifestError(f"{path}: 'id' must look like '{NAMESPACE}/<name>-v<N>', got {env_id!r}")
    if data.get("kind") not in tuple(EnvKind):
        kinds = " or ".join(f"'{k}'" for k in EnvKind)
        raise ManifestError(f"{path}: 'kind' must be {kinds}, got {data.get('kind')!r}")
    kind = EnvKind(data["kind"])
    entry_point = data.get("entry_point") or (SANDBOXED_ENTRY_POINT if kind == EnvKind.SYNTHESIZED else None)
    if not isinstance(entry_point, str) or ":" not in entry_point:
        raise ManifestError(f"{path}: a target needs 'entry_point = \"module:Class\"', got {entry_point!r}")
    if not isinstance(data.get("kwargs", {}), dict):
        raise ManifestError(f"{path}: [kwargs] must be a table of the class's keyword arguments")
    kwargs = dict(data.get("kwargs", {}))
    _check_call_errors(path, data.get("call_errors", {}))
    if kind == EnvKind.SYNTHESIZED:
        if not data.get("target"):
            raise ManifestError(f"{path}: a synthesized env must name its 'target' env id")
        cap = data.get("capability", {})
        if not cap.get("name") or not cap.get("description"):
            raise ManifestError(f"{path}: [capability] needs 'name' and 'description'")
        kwargs.setdefault("path", str(folder))
    return EnvEntry(
        id=env_id,
        kind=kind,
        path=folder,
        entry_point=entry_point,
        target=data.get("target"),
        description=data.get("description", ""),
        capability=dict(data.get("capability", {})),
        kwargs=kwargs,
        manifest=data,
    )


def discover(*, strict: bool = False) -> dict[str, EnvEntry]:
    """Every env folder in the registry dirs, by id. A broken manifest warns
    (or raises with ``strict``) rather than hiding the others."""
    entries: dict[str, EnvEntry] = {}
    for root in registry_dirs():
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir() if (p / "manifest.toml").is_file()):
            try:
                entry = read_manifest(folder)
            except ManifestError as exc:
                if strict:
                    raise
                warnings.warn(f"trace-gym: skipping an env folder: {exc}")
                continue
            if entry.id in entries:
                msg = (
                    f"trace-gym: {entry.id} is defined twice ({entries[entry.id].path} and {folder}); keeping the first"
                )
                if strict:
                    raise ManifestError(msg)
                warnings.warn(msg)
                continue
            entries[entry.id] = entry
    return entries


def register_all() -> list[str]:
    """Register every env folder with Gymnasium; returns the ids."""
    import gymnasium

    ids = []
    with warnings.catch_warnings():  # a broken manifest is reported where it is asked for (get_entry, envs list)
        warnings.simplefilter("ignore")
        entries = discover()
    for entry in entries.values():
        module = entry.entry_point.split(":", 1)[0]
        if entry.kind == EnvKind.TARGET and (entry.path / (module.replace(".", "/") + ".py")).is_file():
            if str(entry.path) not in sys.path:  # a user's target: its module beside its manifest
                sys.path.append(str(entry.path))
        if entry.id not in gymnasium.registry:
            gymnasium.register(
                id=entry.id, entry_point=entry.entry_point, kwargs=entry.kwargs, disable_env_checker=False
            )
        ids.append(entry.id)
    return ids


def get_entry(env_id: str) -> EnvEntry:
    """The registry entry of ``env_id`` (also accepts the ``trace_gym:`` prefix)."""
    env_id = env_id.removeprefix("trace_gym:")
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        entries = discover()
    if env_id not in entries:
        broken = _broken_manifest(env_id)
        if broken is not None:
            raise broken  # what is wrong with the manifest asked for, in one line, not "unknown"
    for warning in skipped:
        warnings.warn(warning.message, stacklevel=2)
    if env_id not in entries:
        known = ", ".join(sorted(entries)) or "none"
        raise UnknownEnvError(f"unknown env id '{env_id}'; registered: {known}")
    return entries[env_id]


def _broken_manifest(env_id: str) -> ManifestError | None:
    """Why the manifest that declares ``env_id`` (or, when its TOML does not parse, the
    folder named after it) could not be read; None when no registry folder is it."""
    name = env_id.removeprefix(f"{NAMESPACE}/").rsplit("-v", 1)[0]
    for root in registry_dirs():
        for path in sorted(root.glob("*/manifest.toml")) if root.is_dir() else []:
            try:
                read_manifest(path.parent)
            except ManifestError as exc:
                try:
                    declared = tomllib.loads(path.read_text(encoding="utf-8")).get("id")
                except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                    declared = None
                if declared == env_id or (declared is None and path.parent.name == name):
                    return exc
    return None


def make(env_id: str, **kwargs: Any):
    """``gymnasium.make`` with one-line errors for an unknown id and for a manifest whose
    ``entry_point`` does not load or whose class refuses its keywords."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry = get_entry(env_id)
    register_all()
    where = f"{entry.id} ({entry.path / 'manifest.toml'})"
    try:
        load_env_creator(entry.entry_point)
    except Exception as exc:  # the module's own import may raise anything: named in one line with its type
        raise ManifestError(
            f"{where}: entry_point '{entry.entry_point}' does not load: {type(exc).__name__}: {exc}"
        ) from None
    try:
        return gymnasium.make(entry.id, **kwargs)
    except TypeError as exc:
        if "keyword argument" not in str(exc) and "required positional argument" not in str(exc):
            raise  # a fault inside the env's own code, not its arguments
        raise ManifestError(f"{where}: {exc} (a target takes split= and max_steps=: docs/targets.md)") from None
    except (KeyError, ValueError) as exc:
        if "split" not in kwargs or repr(kwargs["split"]) not in repr(exc.args):
            raise  # not the split asked for: a fault inside the env's own code
        raise TraceGymError(
            f"{where} has no split {kwargs['split']!r} ({type(exc).__name__}: {exc}; a target has train and test)"
        ) from None
    except AttributeError as exc:
        if "must specify an" not in str(exc):
            raise  # a fault inside the env's own code
        raise ManifestError(
            f"{where}: {exc} (a target's observation_space and action_space: trace_gym.env.AnyText, docs/targets.md)"
        ) from None


TRAIN_SPLIT = "train"
HELD_OUT_SPLIT = "test"  # evaluation's alone: no other stage plays it


def split_tasks(env_id: str, split: str | None) -> set[str]:
    """The task ids of a target's ``split`` (empty for an env without tasks, such as a
    synthesized env, or a target without that split)."""
    if get_entry(env_id).kind != EnvKind.TARGET:
        return set()
    try:
        env = make(env_id, split=split)
    except (TraceGymError, TypeError):  # no such split, or a target that takes no split
        return set()
    try:
        return {str(t) for t in (getattr(env.unwrapped, "task_ids", None) or [])}
    finally:
        env.close()


def held_out_tasks(env_id: str) -> set[str]:
    """The task ids of ``env_id``'s held-out split, which only evaluation plays."""
    return split_tasks(env_id, HELD_OUT_SPLIT)


def make_train(env_id: str, **kwargs: Any) -> tuple[Any, str | None]:
    """A target on its train split, as every stage but evaluation must play it
    (training, calibration, the analyst's look at live tool results), and the split
    it got: a target without a train split (ToolSandbox) plays its default one,
    said aloud on stderr; a synthesized env (no splits) is made as it is (None)."""
    if get_entry(env_id).kind != EnvKind.TARGET:
        return make(env_id, **kwargs), None
    try:
        return make(env_id, split=TRAIN_SPLIT, **kwargs), TRAIN_SPLIT
    except ManifestError:
        raise  # a manifest to fix (or a class without split=, which the target contract asks for)
    except TraceGymError:
        print(
            f"trace-gym: {env_id} has no '{TRAIN_SPLIT}' split; its default split is played",
            file=sys.stderr,
            flush=True,
        )
        return make(env_id, **kwargs), None
