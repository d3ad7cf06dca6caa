"""Append-only JSONL store of trajectories that survives kill -9.

Each finished episode is one line, written with a single ``write`` and
fsync'd, so a crash can leave at most one torn line at the end of the file.
Opening with ``resume=True`` cuts that torn tail (it was never a finished
episode) and reports which episodes are already done; every complete line
is kept. A duplicated episode id can only come from concatenated files: it
is read once and reported.

A run's settings (agent, model, adapter, seed, deficits, temperature, user...)
are recorded in a header line, ``{"record": "run", "settings": {...}}``, so a
resumed run can refuse to mix its episodes into a file made with other
settings. Files from before headers stay readable (their records are checked
as far as they tell). An episode the agent gave up (``error`` set) may be
played again with ``retry_given_up``: the new record is appended after the
old one, which stays in the file, and supersedes it when read.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from .closing import Closing
from .errors import OtherRunError, TrajectoryStoreError
from .trajectory import Trajectory


RUN_RECORD = "run"


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a trajectory file, ignoring a torn last line and header records, de-duplicating ids."""
    return list(_read(Path(path), repair=False).done.values())


def read_run_settings(path: str | Path) -> list[dict[str, Any]]:
    """The run settings recorded in a trajectory file: one per header, none for files from before headers."""
    return _read(Path(path), repair=False).settings


def write_trajectories(path: str | Path, settings: list[dict[str, Any]], trajectories: list[Trajectory]) -> None:
    """A whole trajectory file at once (a derived one, not a run in progress): a header per run
    settings, then the episodes; written to a temporary file and renamed, so whole or not at all."""
    path = Path(path)
    lines = [json.dumps({"record": RUN_RECORD, "settings": s}, sort_keys=True) for s in settings]
    lines += [t.model_dump_json() for t in trajectories]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def normalize_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as they read back from the file (JSON types; objects by their text)."""
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


class TrajectoryStore(Closing):
    """Args:
    path: the JSONL file.
    resume: continue a run in an existing file (its episodes are ``completed``).
    overwrite: replace an existing file.
    settings: the run's settings: written as the file's header; on resume,
        compared with the file's and refused if they differ.
    retry_given_up: on resume, episodes the agent gave up are not
        ``completed``: they are played again and their new records supersede
        the old ones (which stay in the file).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        settings: dict[str, Any] | None = None,
        retry_given_up: bool = False,
    ):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._done: dict[str, Trajectory] = {}
        self.given_up: dict[str, Trajectory] = {}
        self._header: str | None = None
        """Given-up episodes released for a retry (``retry_given_up``), by episode id."""
        settings = normalize_settings(settings) if settings is not None else None
        header_needed = settings is not None
        if self.path.is_dir():
            raise TrajectoryStoreError(
                f"{self.path} is a directory; give a file path such as {self.path}/trajectories.jsonl"
            )
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not (resume or overwrite):
            raise TrajectoryStoreError(
                f"{self.path} already holds trajectories; pass --resume to continue that run or --overwrite to replace it"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if overwrite and not resume:
                self.path.write_bytes(b"")
            elif exists:
                contents = _read(self.path, repair=True)
                if settings is not None:
                    header_needed = check_same_run(self.path, contents, settings)
                self._done = contents.done
                if retry_given_up:
                    self.given_up = {k: t for k, t in self._done.items() if t.error}
                    for key in self.given_up:
                        del self._done[key]
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            # Written with the first episode: a run that fails before any episode leaves no file to resume.
            self._header = (
                json.dumps({"record": RUN_RECORD, "settings": settings}, sort_keys=True) if header_needed else None
            )
        except PermissionError as exc:
            raise TrajectoryStoreError(f"cannot write trajectories to {self.path}: permission denied") from exc
        except OSError as exc:
            raise TrajectoryStoreError(f"cannot write trajectories to {self.path}: {exc.strerror}") from exc

    @property
    def completed(self) -> dict[str, Trajectory]:
        """Episodes already in the file, by episode id."""
        return dict(self._done)

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._done

    def append(self, trajectory: Trajectory) -> None:
        with self._lock:
            if trajectory.episode_id in self._done:
                raise TrajectoryStoreError(f"episode {trajectory.episode_id} is already stored in {self.path}")
            if self._header is not None:
                self._write_line(self._header)
                self._header = None
            self._write_line(trajectory.model_dump_json())
            self._done[trajectory.episode_id] = trajectory
            self.given_up.pop(trajectory.episode_id, None)

    def _write_line(self, text: str) -> None:
        # One write per line, fsync'd: a kill can tear only the last line.
        os.write(self._fd, (text + "\n").encode("utf-8"))
        os.fsync(self._fd)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(list(self._done.values()))

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class _Contents:
    done: dict[str, Trajectory] = field(default_factory=dict)
    settings: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    retried: int = 0


def check_same_run(path: Path, contents: _Contents, settings: dict[str, Any]) -> bool:
    """Refuse to resume a file made with other settings; True if the file still needs this run's header."""
    recorded = [s for i, s in enumerate(contents.settings) if s not in contents.settings[:i]]
    if len(recorded) > 1:
        raise OtherRunError(
            f"{path} mixes runs made with different settings "
            f"({_differences(recorded[0], recorded[1])}); write to a new file"
        )
    if recorded:
        if recorded[0] != settings:
            raise OtherRunError(
                f"{path} was made by another run ({_differences(recorded[0], settings)}); "
                "resume with the same settings, or write to a new --out"
            )
        return False
    # A file from before run headers: check what its records tell, then record this run's settings.
    for field_name in ("env_id", "agent"):
        seen = {getattr(t, field_name) for t in contents.done.values()}
        wanted = settings.get(field_name)
        if wanted is not None and seen and seen != {wanted}:
            raise OtherRunError(
                f"{path} was made by another run ({field_name} {', '.join(sorted(map(str, seen)))} "
                f"in the file, {wanted} now); write to a new --out"
            )
    if contents.done:
        warnings.warn(
            f"{path} has no run settings (written before they were recorded): only its env and agent could be "
            "checked against this run's"
        )
    return True


def _differences(before: dict[str, Any], now: dict[str, Any], prefix: str = "") -> str:
    out = []
    for key in sorted(set(before) | set(now)):
        a, b = before.get(key), now.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out.append(_differences(a, b, f"{prefix}{key}."))
        else:
            out.append(f"{prefix}{key} {json.dumps(a)} in the file, {json.dumps(b)} now")
    return "; ".join(out)


def _read(path: Path, *, repair: bool) -> _Contents:
    if not path.exists():
        raise TrajectoryStoreError(f"no trajectory file at {path}")
    if path.is_dir():
        raise TrajectoryStoreError(f"{path} is a directory, not a trajectory file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrajectoryStoreError(f"cannot read {path}: {exc.strerror}") from None
    contents = _Contents()
    done = contents.done
    good_end = 0
    offset = 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        offset += len(line)
        is_last = offset == len(data)
        text = line.strip()
        if not text:
            good_end = offset
            continue
        try:
            record = json.loads(text)
            if (
                isinstance(record, dict)
                and record.get("record") == RUN_RECORD
                and isinstance(record.get("settings"), dict)
            ):
                contents.settings.append(record["settings"])
                good_end = offset
                continue
            traj = Trajectory.model_validate(record)
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
            if is_last and not line.endswith(b"\n"):
                break  # a torn write from a killed run: not a finished episode
            raise TrajectoryStoreError(
                f"{path}:{number} is not a trajectory record ({str(exc).splitlines()[0]}); "
                "fix or remove that line, or write to a new file"
            ) from None
        if traj.episode_id not in done:
            done[traj.episode_id] = traj
        elif done[traj.episode_id].error:
            done[traj.episode_id] = traj  # a retry of an episode the agent gave up supersedes it
            contents.retried += 1
        else:
            contents.duplicates += 1
        good_end = offset
    if good_end < len(data):
        if repair:
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
            warnings.warn(
                f"{path}: dropped an unfinished last line ({len(data) - good_end} bytes) left by an interrupted run"
            )
    if contents.duplicates:
        warnings.warn(f"{path}: {contents.duplicates} duplicated episode ids, each read once")
    return contents
