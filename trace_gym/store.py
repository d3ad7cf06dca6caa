"""Append-only JSONL store of trajectories that survives kill -9.

Each finished episode is one line, written with a single ``write`` and
fsync'd, so a crash can leave at most one torn line at the end of the file.
Opening with ``resume=True`` cuts that torn tail (it was never a finished
episode) and reports which episodes are already done; every complete line
is kept. A duplicated episode id can only come from concatenated files: it
is read once and reported.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from .errors import TrajectoryStoreError
from .trajectory import Trajectory


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a trajectory file, ignoring a torn last line, de-duplicating ids."""
    return list(_read(Path(path), repair=False)[0].values())


class TrajectoryStore:
    def __init__(self, path: str | Path, *, resume: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._done: dict[str, Trajectory] = {}
        if self.path.is_dir():
            raise TrajectoryStoreError(f"{self.path} is a directory; give a file path such as {self.path}/trajectories.jsonl")
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
                self._done, _ = _read(self.path, repair=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
        line = (trajectory.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            if trajectory.episode_id in self._done:
                raise TrajectoryStoreError(f"episode {trajectory.episode_id} is already stored in {self.path}")
            os.write(self._fd, line)
            os.fsync(self._fd)
            self._done[trajectory.episode_id] = trajectory

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(list(self._done.values()))

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _read(path: Path, *, repair: bool) -> tuple[dict[str, Trajectory], int]:
    if not path.exists():
        raise TrajectoryStoreError(f"no trajectory file at {path}")
    data = path.read_bytes()
    done: dict[str, Trajectory] = {}
    duplicates = 0
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
            traj = Trajectory.model_validate(json.loads(text))
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
            if is_last and not line.endswith(b"\n"):
                break  # a torn write from a killed run: not a finished episode
            raise TrajectoryStoreError(
                f"{path}:{number} is not a trajectory record ({str(exc).splitlines()[0]}); "
                "fix or remove that line, or write to a new file"
            ) from None
        if traj.episode_id in done:
            duplicates += 1
        else:
            done[traj.episode_id] = traj
        good_end = offset
    if good_end < len(data):
        if repair:
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
            warnings.warn(f"{path}: dropped an unfinished last line ({len(data) - good_end} bytes) left by an interrupted run")
    if duplicates:
        warnings.warn(f"{path}: {duplicates} duplicated episode ids, each read once")
    return done, duplicates
