"""What one stage hands the next: typed, versioned files with ``save`` and ``load``.

Every stage of the loop writes one artifact and every later reader loads it
through the class here, never with ``json.loads`` and ``.get()`` of its own, so
a field renamed in one place fails loading everywhere at once (and a test)::

    Identification   identify/   capabilities.json + labels.jsonl   (identify -> synthesize, route, report)
    EnvSet           envs/       envs.json                           (synthesize -> train, report)
    AdapterSet       adapters/   adapters.json                       (train -> gepa, evaluate, route, report)

Evaluation's ``results.json`` loads with ``trace_gym.evaluation.load_results``.
A capability has one name from identification to the report: the one
identification gave it (``precise_arguments``); an env's manifest may describe
it in words, and an env id names the env, not the capability.

A file of another schema version, or one missing a field, is refused in one
line naming the file and the field; files written before versioning (plain
lists) still load.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from .errors import TraceGymError
from .identification.stats import LACKING, Label, SelectedCapability

SCHEMA_VERSION = 1

T = TypeVar("T")


class ArtifactError(TraceGymError):
    """A stage's output file that is missing, damaged, or of another schema."""


def read_json(path: Path, producer: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"no file at {path} (run {producer} first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is damaged ({exc})") from None


def write_json(path: Path, payload: Any) -> Path:
    """Written whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def from_row(cls: type[T], row: Any, where: str) -> T:
    """A dataclass from one JSON object; a missing or unknown field is one line naming it."""
    if not isinstance(row, dict):
        raise ArtifactError(f"{where}: expected an object, got {type(row).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    required = {
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    unknown, missing = sorted(set(row) - names), sorted(required - set(row))
    if unknown or missing:
        problem = "; ".join([*(f"unknown field '{n}'" for n in unknown), *(f"missing field '{n}'" for n in missing)])
        raise ArtifactError(f"{where}: {problem} (a file of another trace-gym version?)")
    return cls(**row)


def check_version(payload: Any, path: Path) -> None:
    if not isinstance(payload, dict):
        raise ArtifactError(f"{path}: expected an object, got a {type(payload).__name__}")
    version = payload.get("version")
    if version is not None and version != SCHEMA_VERSION:  # None: written before versioning, same fields
        raise ArtifactError(
            f"{path}: schema version {version!r}, this trace-gym reads {SCHEMA_VERSION}; "
            "redo the stage that wrote it (trace-gym run --from STAGE)"
        )


# --- identification -------------------------------------------------------------------------


@dataclass
class Identification:
    """``capabilities.json`` (every candidate with its figures, ``selected`` set on the
    kept ones) and ``labels.jsonl`` (one analyst label per episode and capability)."""

    FILE: ClassVar[str] = "capabilities.json"
    LABELS: ClassVar[str] = "labels.jsonl"

    candidates: list[SelectedCapability]
    analyst: dict[str, Any] = field(default_factory=dict)
    """Who labelled (its calls and tokens)."""
    agreement_with_gold: dict[str, float | None] = field(default_factory=dict)
    degenerate: str | None = None
    """Why nothing could be selected (no success or no failure to contrast), if so."""
    labels: list[Label] = field(default_factory=list)

    @property
    def selected(self) -> list[SelectedCapability]:
        return [c for c in self.candidates if c.selected]

    def description(self, name: str) -> str:
        return next((c.description for c in self.candidates if c.name == name), "")

    def lacking(self) -> dict[str, list[Label]]:
        """The LACKING labels of each capability, in file order."""
        out: dict[str, list[Label]] = {}
        for label in self.labels:
            if label.label == LACKING:
                out.setdefault(label.capability, []).append(label)
        return out

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        payload = {
            "version": SCHEMA_VERSION,
            "selected": [asdict(c) for c in self.selected],
            "candidates": [asdict(c) for c in self.candidates],
            "analyst": self.analyst,
            "agreement_with_gold": self.agreement_with_gold,
            "degenerate": self.degenerate,
        }
        path = write_json(folder / self.FILE, payload)
        tmp = folder / (self.LABELS + ".tmp")
        tmp.write_text("".join(json.dumps(asdict(label)) + "\n" for label in self.labels), encoding="utf-8")
        os.replace(tmp, folder / self.LABELS)
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "Identification":
        """From identify's output folder (or its ``capabilities.json``)."""
        path = _file(folder, cls.FILE)
        folder = path.parent
        payload = read_json(path, "trace-gym identify")
        if not isinstance(payload, dict):
            raise ArtifactError(f"{path}: expected identify's object, got a {type(payload).__name__}")
        check_version(payload, path)
        candidates = [
            from_row(SelectedCapability, row, f"{path} candidate {i}")
            for i, row in enumerate(payload.get("candidates") or [])
        ]
        selected = [row.get("name") if isinstance(row, dict) else row for row in payload.get("selected") or []]
        if sorted(selected) != sorted(c.name for c in candidates if c.selected):
            raise ArtifactError(f"{path}: 'selected' disagrees with the candidates' own 'selected' flags")
        return cls(
            candidates,
            payload.get("analyst") or {},
            payload.get("agreement_with_gold") or {},
            payload.get("degenerate"),
            read_labels(folder / cls.LABELS),
        )


def read_labels(path: Path) -> list[Label]:
    """``labels.jsonl`` (none: no labels)."""
    labels = []
    if path.exists():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ArtifactError(f"{path} line {n} is damaged ({exc})") from None
                labels.append(from_row(Label, row, f"{path} line {n}"))
    return labels


# --- training envs ----------------------------------------------------------------------------


@dataclass
class EnvRecord:
    """One selected capability and the training env synthesis gave it (``env_id`` None: none)."""

    capability: str
    env_id: str | None
    path: str | None
    source: str
    """How the env came: synthesized, reused from the registry, failed, ..."""
    status: str
    """Its validation status (passed, failed, -)."""
    attempts: int = 0
    message: str = ""


@dataclass
class EnvSet:
    """``envs.json``: the training env of each selected capability."""

    FILE: ClassVar[str] = "envs.json"

    envs: list[EnvRecord] = field(default_factory=list)

    def trainable(self) -> dict[str, str]:
        """Capability name -> env id, for the capabilities that have an env."""
        return {r.capability: r.env_id for r in self.envs if r.env_id}

    def save(self, folder: str | Path) -> Path:
        return write_json(Path(folder) / self.FILE, {"version": SCHEMA_VERSION, "envs": [asdict(r) for r in self.envs]})

    @classmethod
    def load(cls, path: str | Path) -> "EnvSet":
        path = _file(path, cls.FILE)
        payload = read_json(path, "the synthesize stage")
        rows = payload if isinstance(payload, list) else None  # written before versioning
        if rows is None:
            check_version(payload, path)
            rows = payload.get("envs")
        if not isinstance(rows, list):
            raise ArtifactError(f"{path}: expected a list of envs")
        return cls([from_row(EnvRecord, row, f"{path} env {i}") for i, row in enumerate(rows)])


# --- adapters ----------------------------------------------------------------------------------


class AdapterKind(StrEnum):
    """What an adapter was trained for: a selected capability, a baseline (GRPO on the
    target, merged) or the causal control (unselected capabilities)."""

    CAPABILITY = "capability"
    BASELINE = "baseline"
    CONTROL = "control"


@dataclass
class AdapterRecord:
    """One trained LoRA adapter: a capability's (its name is the capability's), a
    baseline's (``grpo-target``, ``merged``) or the causal control's."""

    name: str
    kind: AdapterKind
    envs: list[str]
    adapter: str
    """The adapter's folder (PEFT format)."""
    train_log: str
    iterations: int
    rollouts: int
    """Planned update episodes (G x K per iteration): the budget methods are compared at."""
    episodes_played: int = 0
    """Every episode played, calibration and dynamic sampling's redraws included."""
    calibration: str | None = None
    wall_s: float | None = None
    reward_curve: str | None = None
    capability: str | None = None
    """For the control: the (unselected) capability it trains."""


@dataclass
class UntrainableRecord:
    name: str
    envs: list[str]
    reason: str
    calibration: str | None = None


@dataclass
class AdapterSet:
    """``adapters.json``: every adapter the train stage made, and those it could not."""

    FILE: ClassVar[str] = "adapters.json"
    KINDS: ClassVar[tuple[str, ...]] = tuple(AdapterKind)

    adapters: list[AdapterRecord] = field(default_factory=list)
    untrainable: list[UntrainableRecord] = field(default_factory=list)

    def of_kind(self, kind: AdapterKind) -> list[AdapterRecord]:
        return [a for a in self.adapters if a.kind == kind]

    def named(self, name: str) -> AdapterRecord | None:
        return next((a for a in self.adapters if a.name == name), None)

    def save(self, folder: str | Path) -> Path:
        return write_json(
            Path(folder) / self.FILE,
            {
                "version": SCHEMA_VERSION,
                "adapters": [asdict(a) for a in self.adapters],
                "untrainable": [asdict(u) for u in self.untrainable],
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> "AdapterSet":
        path = _file(path, cls.FILE)
        payload = read_json(path, "the train stage")
        if isinstance(payload, list):  # written before versioning: the adapters alone
            payload = {"version": SCHEMA_VERSION, "adapters": payload, "untrainable": []}
        check_version(payload, path)
        adapters = [
            from_row(AdapterRecord, row, f"{path} adapter {i}") for i, row in enumerate(payload.get("adapters") or [])
        ]
        for a in adapters:
            if a.kind not in cls.KINDS:
                raise ArtifactError(f"{path}: adapter '{a.name}' has kind '{a.kind}' (one of {', '.join(cls.KINDS)})")
            a.kind = AdapterKind(a.kind)
        untrainable = [
            from_row(UntrainableRecord, row, f"{path} untrainable {i}")
            for i, row in enumerate(payload.get("untrainable") or [])
        ]
        return cls(adapters, untrainable)


def _file(path: str | Path, name: str) -> Path:
    """A file path, or the folder that holds ``name``."""
    path = Path(path)
    return path / name if path.is_dir() or path.suffix != ".json" else path
