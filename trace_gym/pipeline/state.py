"""The run directory's ``state.json``, and the hashes that decide whether a stage is redone."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts import AdapterSet
from ..config import to_table
from ..errors import TraceGymError
from .config import STAGES, PipelineConfig


class PipelineError(TraceGymError):
    """A run that cannot go on as asked (an existing run without --resume, a missing upstream stage)."""


@dataclass
class StageRecord:
    stage: str
    inputs_hash: str
    outputs: dict[str, Any]
    wall_s: float
    finished_at: str


class RunState:
    """``RUN/state.json``: what each finished stage read and wrote."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "state.json"
        self.stages: dict[str, StageRecord] = {}
        self.moved: tuple[str, str] | None = None
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self.stages = {k: StageRecord(**v) for k, v in raw.get("stages", {}).items()}
            except (json.JSONDecodeError, TypeError) as exc:
                raise PipelineError(f"{self.path} is damaged ({exc}); move it away to start the run over") from None

    def relocate(self, old: str, new: str) -> None:
        """Read paths under the run's recorded folder ``old`` as under ``new`` (where it is
        now), in the stages' outputs and, through ``path()``, in the files they name."""
        self.moved = (old.rstrip("/"), new.rstrip("/"))
        for record in self.stages.values():
            record.outputs = self.path_in(record.outputs)

    def path_in(self, value: Any) -> Any:
        """``value`` (a path, or a structure of them) with the run's old folder replaced by its new one."""
        if self.moved is None:
            return value
        old, new = self.moved
        if isinstance(value, str):
            return new + value[len(old) :] if value == old or value.startswith(old + "/") else value
        if isinstance(value, dict):
            return {k: self.path_in(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.path_in(v) for v in value]
        return value

    def adapters(self) -> AdapterSet:
        """The train stage's adapters (``adapters.json``), their paths under where the run is now."""
        train = self.stages.get("train")
        if train is None or not train.outputs.get("adapters_json"):
            return AdapterSet()
        adapters = AdapterSet.load(train.outputs["adapters_json"])
        for record in adapters.adapters:  # paths inside the file follow a moved run too
            for name in ("adapter", "train_log", "calibration", "reward_curve"):
                setattr(record, name, self.path_in(getattr(record, name)))
        return adapters

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"stages": {k: dataclasses.asdict(v) for k, v in self.stages.items()}}, indent=2) + "\n"
        )
        tmp.replace(self.path)


HASHED_WHEN_SET = {
    "policy": {"chat_template": "auto"},
    "evaluate": {"model": None},
    "identify": {"selection.max_selected": None},
}
"""Settings added after runs were recorded, with their defaults (a dotted key names one inside
a sub-table): hashed only when set, so that an earlier run resumes with its finished stages kept."""
NOT_HASHED = ("base_url", "api_key_env")
"""Where a model is reached, not what it is: a run moved to another server keeps its stages."""


def hashed_settings(section: str, table: dict[str, Any]) -> dict[str, Any]:
    hashed = copy.deepcopy({k: v for k, v in table.items() if k not in NOT_HASHED})
    for dotted, default in HASHED_WHEN_SET.get(section, {}).items():
        *parents, key = dotted.split(".")
        holder: Any = hashed
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and key in holder and holder[key] == default:
            del holder[key]
    return hashed


STAGE_VERSIONS = {"rollout": 2}
"""A stage whose outputs changed meaning is at a new version, so that a resumed run made
before redoes it (and what follows). rollout 2: a fallback's episodes join the policy's
own instead of replacing them."""


def stage_inputs_hash(config: PipelineConfig, stage: str, state: RunState) -> str:
    """A stage's inputs: the run's target and seed, the policy, its own settings, its
    version (from 2 on), and every upstream stage's recorded outputs (so a changed upstream
    redoes it)."""
    upstream = STAGES[: STAGES.index(stage)]
    version = STAGE_VERSIONS.get(stage, 1)
    payload = {
        **({"version": version} if version > 1 else {}),  # version 1 hashes as before versions existed
        "target": config.run.target,
        "seed": config.run.seed,
        "policy": hashed_settings("policy", to_table(config.policy)),
        "settings": hashed_settings(stage, to_table(getattr(config, stage))),
        "upstream": {s: state.stages[s].outputs for s in upstream if s in state.stages},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def content_hash(*paths: Path) -> str:
    """sha256 over files (a folder: every file below it, by relative path), so that a
    stage downstream notices when an upstream output changed, not only its path."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if f.exists():
                digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
                digest.update(f.read_bytes() + b"\0")
    return digest.hexdigest()
