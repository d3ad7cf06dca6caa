"""Calibration: is an env trainable for the policy that will be trained on it?

GRPO learns only from the variance inside a group: a group of K episodes with
equal rewards has no advantage and no gradient. So before training, each env
is played by the policy being trained, G seeds x K episodes at a time, seeds
drawn as training draws them and hints given as training gives them. An env
that declares difficulty ``LEVELS`` is moved a level harder when the mean
reward is above ``reward_band``, a level easier when below, until a level is in
band or the levels run out; the level trained at is the in-band one, else the
one with the most informative groups. An env is *trainable* when, at that
level, at least ``min_informative`` of its groups are informative.

``Calibration`` is the artifact (``calibration.json`` in a training run's
folder): every level tried with its figures, the level chosen, whether the
env is trainable and why. Every episode calibration plays is counted there.
What this module must not do: train, or play anything but the env's training
distribution (no held-out task: a target is calibrated on its training tasks).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trace_gym.seeding import derive_seed

from .config import GRPOTrainingConfig, TrainingError
from .rollouts import informative, plan_groups


class UntrainableEnvError(TrainingError):
    """Calibration found that the policy cannot learn from an env (too few informative groups at every level)."""


SCHEMA_VERSION = 1


@dataclass
class LevelFigures:
    """One difficulty level played by the policy: G groups of K episodes."""

    level: int | None
    groups: list[list[float | None]]
    episodes: int

    @property
    def scored(self) -> list[float]:
        return [r for g in self.groups for r in g if r is not None]

    @property
    def mean_reward(self) -> float | None:
        return statistics.fmean(self.scored) if self.scored else None

    def share(self, test: Callable[[list[float]], bool]) -> float:
        groups = [[r for r in g if r is not None] for g in self.groups]
        groups = [g for g in groups if g]
        return sum(map(test, groups)) / len(groups) if groups else 0.0

    @property
    def informative_share(self) -> float:
        return self.share(informative)

    @property
    def all_zero_share(self) -> float:
        return self.share(lambda g: all(r == 0 for r in g))

    @property
    def all_success_share(self) -> float:
        return self.share(lambda g: all(r >= 1.0 - 1e-6 for r in g))

    def summary(self) -> dict[str, Any]:
        mean = self.mean_reward
        return {
            "level": self.level,
            "episodes": self.episodes,
            "mean_reward": None if mean is None else round(mean, 4),
            "informative_groups": round(self.informative_share, 4),
            "all_zero_groups": round(self.all_zero_share, 4),
            "all_success_groups": round(self.all_success_share, 4),
        }


@dataclass
class Calibration:
    """The calibration of one env for one policy (``calibration.json`` holds one per env)."""

    env_id: str
    model: str
    levels: list[LevelFigures]
    level: int | None
    trainable: bool
    reason: str
    reward_band: list[float]
    min_informative: float
    wall_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    @property
    def episodes(self) -> int:
        return sum(f.episodes for f in self.levels)

    @property
    def chosen(self) -> LevelFigures:
        for figures in self.levels:
            if figures.level == self.level:
                return figures
        raise TrainingError(f"the calibration of {self.env_id} chose level {self.level}, which it never played")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["figures"] = [f.summary() for f in self.levels]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Calibration":
        if data.get("schema_version") != SCHEMA_VERSION:
            raise TrainingError(
                f"a calibration of schema {data.get('schema_version')!r}; this trace-gym reads {SCHEMA_VERSION}"
            )
        levels = [LevelFigures(level=f["level"], groups=f["groups"], episodes=f["episodes"]) for f in data["levels"]]
        known = {f.name for f in dataclasses.fields(cls)} - {"levels"}
        return cls(levels=levels, **{k: v for k, v in data.items() if k in known})


def save_calibrations(path: str | Path, calibrations: list[Calibration]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"calibrations": [c.to_dict() for c in calibrations]}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_calibrations(path: str | Path) -> dict[str, Calibration]:
    """env id -> calibration, from a file ``save_calibrations`` wrote; one line for a bad file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {c.env_id: c for c in map(Calibration.from_dict, data["calibrations"])}
    except FileNotFoundError:
        raise TrainingError(f"no calibration file at {path}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrainingError(f"{path} is not a calibration file ({type(exc).__name__}: {exc})") from None


def calibration_keys(config: GRPOTrainingConfig, env_id: str, tasks: list[str] | None, level_index: int) -> list[str]:
    """G episode keys for one level, drawn as training draws its seeds but from a
    stream of their own (calibration never replays the seeds training will use)."""
    groups = config.calibration_groups or config.groups
    seed = derive_seed(config.seed, "calibration", level_index)
    plan = dataclasses.replace(config, env_ids=[env_id], iterations=1, groups=groups, seed=seed)
    return plan_groups(plan, {env_id: tasks})


def decide(figures: list[LevelFigures], band: list[float], min_informative: float) -> tuple[int | None, bool, str]:
    """(level, trainable, reason) from the levels played so far."""

    def in_band(f: LevelFigures) -> bool:
        return f.mean_reward is not None and band[0] <= f.mean_reward <= band[1]

    def closeness(f: LevelFigures) -> tuple[float, float, int]:
        """Most informative groups, then nearest the band; on a tie (all zero, say) the
        level towards the band: the easier one below it, the harder one above it."""
        mean = f.mean_reward or 0.0
        towards = -(f.level or 0) if mean < band[0] else (f.level or 0)
        return f.informative_share, -abs(mean - sum(band) / 2), towards

    chosen = next((f for f in figures if in_band(f)), None)
    if chosen is None:
        chosen = max(figures, key=closeness)
    mean = "n/a" if chosen.mean_reward is None else f"{chosen.mean_reward:.3f}"
    where = f"level {chosen.level}" if chosen.level is not None else "its only level"
    trainable = chosen.informative_share >= min_informative
    why = (
        f"at {where}: mean reward {mean} ({'in' if in_band(chosen) else 'outside'} band {band[0]}-{band[1]}), "
        f"{chosen.informative_share:.0%} informative groups (needs {min_informative:.0%}), "
        f"{chosen.all_zero_share:.0%} all-zero, {chosen.all_success_share:.0%} all-success"
    )
    return chosen.level, trainable, why


def calibrate_env(
    config: GRPOTrainingConfig,
    env_id: str,
    tasks: list[str] | None,
    levels: int | None,
    play: Callable[[int | None, list[str]], list[list[float | None]]],
    say: Callable[[str], None] = print,
) -> Calibration:
    """Calibrate one env: ``play(level, keys)`` plays each key's group of K
    episodes at ``level`` with the policy and returns their rewards. Starts at
    ``config.level`` (else the middle level), moves one level at a time towards
    the band, never to a level already played."""
    t0 = time.perf_counter()
    band = list(config.reward_band)
    if levels:
        level = config.level if config.level is not None else (levels - 1) // 2
        if not 0 <= level < levels:
            raise TrainingError(f"{env_id} has levels 0..{levels - 1}; level {level} does not exist")
    else:
        if config.level is not None:
            raise TrainingError(f"{env_id} declares no difficulty levels; drop level={config.level}")
        level = None
    figures: list[LevelFigures] = []
    while True:
        groups = play(level, calibration_keys(config, env_id, tasks, len(figures)))
        figures.append(LevelFigures(level=level, groups=groups, episodes=sum(len(g) for g in groups)))
        f = figures[-1]
        mean = "n/a" if f.mean_reward is None else f"{f.mean_reward:.3f}"
        say(
            f"calibrate {env_id}{'' if level is None else f' level {level}'}: mean reward {mean}, "
            f"{f.informative_share:.0%} informative groups ({f.episodes} episodes)"
        )
        if level is None or f.mean_reward is None or band[0] <= f.mean_reward <= band[1]:
            break
        step = 1 if f.mean_reward > band[1] else -1
        nxt = level + step
        if not 0 <= nxt < levels or any(g.level == nxt for g in figures):
            break
        level = nxt
    chosen, trainable, reason = decide(figures, band, config.min_informative)
    return Calibration(
        env_id=env_id,
        model=config.model,
        levels=figures,
        level=chosen,
        trainable=trainable,
        reason=reason,
        reward_band=band,
        min_informative=config.min_informative,
        wall_s=round(time.perf_counter() - t0, 3),
    )


def check_trainable(calibration: Calibration, config: GRPOTrainingConfig) -> None:
    """Refuse, in one line, an env the calibration says this policy cannot train on."""
    if calibration.model != config.model:
        raise TrainingError(
            f"the calibration of {calibration.env_id} was made with {calibration.model}, not {config.model}; "
            "calibrate again with the policy being trained"
        )
    if not calibration.trainable and not config.train_anyway:
        raise UntrainableEnvError(
            f"{calibration.env_id} is untrainable for {config.model}: {calibration.reason}; "
            "GRPO would learn from too few groups (--train-anyway trains it all the same)"
        )
