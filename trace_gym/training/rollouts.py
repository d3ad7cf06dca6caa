"""The glue between TRL's ``GRPOTrainer`` and our envs: ``rollout_func``.

TRL hands ``rollout_func(prompts, trainer)`` the generation batch of one
iteration: each dataset row repeated K times in a row (its ``RepeatSampler``),
so a block of K identical prompts is one GRPO group. A prompt here is not text
for the model but a small JSON key naming the episode: ``{"env": ID, "seed": N}``
(a synthesized env's scenario) or ``{"env": ID, "task": TASK}`` (a target's
task). The episodes are played in the env exactly as evaluation plays them
(``trace_gym.rollout.play_batched``, lock-step, the policy being trained,
through ``EnvPool``), and each comes back as the model layer's ``TokenEpisode``:

- ``prompt_ids``: the first prompt (system prompt, tool schemas, first user turn);
- ``completion_ids``: everything after it, the model's turns and the
  environment's in between;
- ``logprobs``: the sampled tokens' logprobs (0.0 on environment tokens);
- ``env_mask``: 1 exactly on tokens the model sampled, 0 on tool results, user
  turns and template tokens (TRL multiplies it into the loss mask when no
  ``tools=`` are given to the trainer);
- ``env_reward``: the env's reward at episode end (the GRPO reward; ``None``
  for an episode the env could not finish, which TRL leaves out of its group's
  baseline and gives no advantage).

Hints: the first ``hinted_per_group`` rollouts of a group are played with
``reset(hint=True)``. A hint only changes the system prompt, so the update
swaps the hinted episode's first prompt for the hint-free one of its group (a
hint-free rollout of the same seed: identical ids up to the hint) and keeps
its completion: the loss never sees a hint token.

Why not TRL's ``environment_factory``: it ends an episode at the model's first
plain-text reply, so a dialogue env (the user answers, the env decides when it
is over) cannot be played with it; the env cannot end an episode itself; and
its tool-call parsing knows the Qwen/Llama chat templates, not the SmolLM2
template our embedded model uses. ``rollout_func`` lets our own loop play the
episode and hand TRL the exact tokens.

What this module must not do: score episodes (the env does), or re-tokenize
decoded text (the model layer keeps the sampled ids).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from trace_gym.agents import make_agent
from trace_gym.errors import TraceGymError
from trace_gym.llm.local import LocalHF
from trace_gym.rollout import Episode, episode_seed, run_episode
from trace_gym.sandbox.env import SandboxedEnv
from trace_gym.seeding import derive_seed
from trace_gym.validation import ValidationConfig, hint_leaks

from .config import GRPOTrainingConfig, TrainingError
from .pool import EnvPool, EpisodeOutcome

ADAPTER_NAME = "default"  # the name peft gives the adapter TRL trains


def episode_key(env_id: str, *, seed: int | None = None, task: str | None = None) -> str:
    """The dataset prompt that names one GRPO group's scenario."""
    return json.dumps({"env": env_id, "seed": seed} if task is None else {"env": env_id, "task": task}, sort_keys=True)


def parse_key(prompt: Any) -> dict[str, Any]:
    try:
        key = json.loads(prompt)
    except (TypeError, json.JSONDecodeError):
        raise TrainingError(
            f"a training prompt must be an episode key from episode_key(), got {str(prompt)[:80]!r}"
        ) from None
    if not isinstance(key, dict) or "env" not in key:
        raise TrainingError(f"an episode key needs an 'env', got {prompt!r}")
    return key


def groups_of(prompts: list[Any], k: int) -> list[str]:
    """The distinct prompts of a generation batch, checking TRL's layout: each one
    K times in a row."""
    if len(prompts) % k:
        raise TrainingError(f"rollout_func got {len(prompts)} prompts, not a multiple of K={k}")
    keys = []
    for start in range(0, len(prompts), k):
        block = prompts[start : start + k]
        if any(p != block[0] for p in block):
            raise TrainingError(
                "rollout_func expects each prompt K times in a row (TRL's RepeatSampler); got a mixed block"
            )
        keys.append(block[0])
    return keys


def informative(rewards: list[float | None]) -> bool:
    """A group GRPO can learn from: at least two scored episodes whose rewards differ."""
    scored = {r for r in rewards if r is not None}
    return len(scored) > 1


def redraw_key(key: dict[str, Any], draw: int, run_seed: int, tasks: list[str] | None) -> str:
    """The episode key that replaces a constant group on its ``draw``-th draw
    (2, 3, ...): a fresh seed of the same env, or another task of a target's
    training tasks; derived from the run seed and the key, so a resumed run
    draws the same."""
    env_id = key["env"]
    parts = (run_seed, "redraw", json.dumps(key, sort_keys=True), draw)
    if key.get("task") is not None:
        if not tasks:
            raise TrainingError(f"{env_id}: cannot redraw a task without the target's task list")
        return episode_key(env_id, task=random.Random(derive_seed(*parts)).choice(tasks))
    return episode_key(env_id, seed=derive_seed(*parts))


class EnvTurnedError(TrainingError):
    """A synthesized env behaves on training's seeds otherwise than validation saw."""


@dataclass
class IterationRecord:
    """What one call of ``rollout_func`` played, for the training log. ``rewards``
    and ``groups`` are what the update sees (after dynamic sampling);
    ``first_rewards`` the first draw of every group, an unbiased sample of the
    policy's reward on the env (the learning curve's figure)."""

    rewards: list[float | None] = field(default_factory=list)
    groups: list[list[float | None]] = field(default_factory=list)
    first_rewards: list[float | None] = field(default_factory=list)
    draws: int = 0
    redrawn_groups: int = 0
    components: dict[str, list[float]] = field(default_factory=dict)
    hinted: int = 0
    episodes_played: int = 0
    failed: list[str] = field(default_factory=list)
    gave_up: int = 0
    tokens_sampled: int = 0
    spot_checks: list[str] = field(default_factory=list)
    bounds_hit: list[str] = field(default_factory=list)
    played: list[str] = field(default_factory=list)
    """Every group played, draws included: ``env|task ID`` or ``env|seed N`` (K episodes each)."""
    rollout_s: float = 0.0

    @classmethod
    def merged(cls, records: list["IterationRecord"]) -> "IterationRecord":
        """One record of several ranks' parts of one iteration, groups in rank order
        (as TRL gathers their rows); the ranks play at once, so its time is the longest."""
        if len(records) == 1:
            return records[0]
        whole = cls()
        for record in records:
            for f in dataclasses.fields(cls):
                mine, theirs = getattr(whole, f.name), getattr(record, f.name)
                if f.name == "components":
                    for name, values in theirs.items():
                        mine.setdefault(name, []).extend(values)
                elif f.name == "rollout_s":
                    whole.rollout_s = max(mine, theirs)
                else:
                    setattr(whole, f.name, mine + theirs)  # lists concatenate, counts add up
        return whole

    def first_groups(self) -> list[list[float | None]]:
        """The first draw's rewards, group by group (a group's K rows are consecutive)."""
        k = len(self.first_rewards) // len(self.groups) if self.groups else 0
        return [self.first_rewards[g * k : (g + 1) * k] for g in range(len(self.groups))] if k else []

    def summary(self) -> dict[str, Any]:
        scored = [r for r in self.rewards if r is not None]
        first = [r for r in self.first_rewards if r is not None]
        constant = [g for g in self.groups if not informative(g)]
        return {
            "mean_reward": statistics.fmean(first) if first else None,
            "mean_reward_trained": statistics.fmean(scored) if scored else None,
            "constant_reward_groups": len(constant) / len(self.groups) if self.groups else None,
            "informative_groups": len(self.groups) - len(constant),
            "first_draw_groups": self.first_groups(),
            "draws": self.draws,
            "redrawn_groups": self.redrawn_groups,
            "reward_components": {name: statistics.fmean(v) for name, v in sorted(self.components.items()) if v},
            "hinted": self.hinted,
            "episodes_played": self.episodes_played,
            "failed_episodes": len(self.failed),
            "failures": self.failed[:5],
            "gave_up": self.gave_up,
            "spot_checks": self.spot_checks,
            "bounds_hit": self.bounds_hit,
            "played": self.played,
            "tokens_sampled": self.tokens_sampled,
            "rollout_s": round(self.rollout_s, 3),
        }


class EnvRolloutFunc:
    """``rollout_func`` for TRL's ``GRPOTrainer``: plays each group's K episodes in
    the env with the policy being trained and returns their tokens and rewards.
    ``records`` keeps one ``IterationRecord`` per call; ``last_batch`` the last
    batch returned (what the update will see)."""

    def __init__(
        self,
        config: GRPOTrainingConfig,
        pool: EnvPool,
        tokenizer: Any,
        task_lists: dict[str, list[str] | None] | None = None,
        adapter: str | None = ADAPTER_NAME,
    ):
        self.config = config
        self.pool = pool
        self.tokenizer = tokenizer
        self.task_lists = task_lists or {}
        self.adapter = adapter
        self.records: list[IterationRecord] = []
        self.last_batch: dict[str, list] | None = None
        self.last_outcomes: list[EpisodeOutcome | None] = []  # row by row, what ``last_batch`` was made from
        self._backend = None
        self._model = None

    def backend_for(self, trainer: Any) -> Any:
        """The trainer's current policy as a token-level backend; its caches are
        cleared on every call, since the weights changed since the last one."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._backend is None or self._model is not model:
            self._backend, self._model = (
                LocalHF.from_model(model, self.tokenizer, max_batch=self.config.rollouts_per_iteration),
                model,
            )
        self._backend.clear_cache()
        return self._backend

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        batch = self.play(groups_of(prompts, self.config.rollouts_per_group), self.backend_for(trainer))
        self.last_batch = batch
        return batch

    def play(self, keys: list[str], backend: Any) -> dict[str, list]:
        """Play each key's group of K episodes with ``backend``; with dynamic
        sampling (``max_draws`` > 1) a group whose rewards are all equal is played
        again under a fresh key, up to ``max_draws`` draws, every episode counted.
        Returns the rows (K per key, in order) and appends an ``IterationRecord``."""
        k = self.config.rollouts_per_group
        record = IterationRecord()
        t0 = time.perf_counter()
        if self.config.spot_check:
            seeds = {key["env"]: key["seed"] for key in map(parse_key, keys) if key.get("seed") is not None}
            for env_id, seed in seeds.items():
                if env_id in self.config.train_unvalidated:  # never validated: nothing to compare with
                    continue
                record.spot_checks.append(self.spot_check(env_id, int(seed)))
        rows: list[dict[str, Any] | None] = [None] * (len(keys) * k)
        self.last_outcomes = [None] * len(rows)
        pending = [(g, parse_key(key)) for g, key in enumerate(keys)]
        for draw in range(1, self.config.max_draws + 1):
            by_env: dict[str, list[tuple[int, dict[str, Any]]]] = {}
            for g, key in pending:
                by_env.setdefault(key["env"], []).append((g, key))
            for env_id, items in by_env.items():
                self._play_env(env_id, [key for _, key in items], [g for g, _ in items], backend, rows, record)
            record.draws += len(pending)
            record.played += [
                f"{key['env']}|{'task' if key.get('task') is not None else 'seed'} "
                f"{key.get('task') if key.get('task') is not None else key.get('seed')}"
                for _, key in pending
            ]
            if draw == 1:
                record.first_rewards = [row["env_reward"] for row in rows]
            pending = [
                (g, key)
                for g, key in pending
                if not informative([row["env_reward"] for row in rows[g * k : (g + 1) * k]])
            ]
            if not pending or draw == self.config.max_draws:
                break
            if time.perf_counter() - t0 > self.config.max_iteration_s:
                record.bounds_hit.append(
                    f"no redraw after draw {draw}: the iteration ran past max_iteration_s "
                    f"({self.config.max_iteration_s:g} s)"
                )
                break
            record.redrawn_groups += len(pending)
            pending = [
                (g, parse_key(redraw_key(key, draw + 1, self.config.seed, self.task_lists.get(key["env"]))))
                for g, key in pending
            ]
        record.rewards = [row["env_reward"] for row in rows]
        record.groups = [record.rewards[g * k : (g + 1) * k] for g in range(len(keys))]
        record.rollout_s = time.perf_counter() - t0
        self.records.append(record)
        batch = {
            name: [row[name] for row in rows]
            for name in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward")
        }
        batch["hinted"] = [row["hinted"] for row in rows]
        return batch

    def spot_check(self, env_id: str, seed: int) -> str:
        """Training's own look at a synthesized env, on a seed this iteration trains on:
        validation saw the oracle solve its seeds and the floor policies go unpaid, and
        an env honest on validation's seeds only (a time bomb) shows itself here. Plays
        the oracle and a message-only agent (no model; not counted in the rollout
        budget), and scans the seed's hinted prompt for its answer. Raises
        ``EnvTurnedError`` (one line) when any of them disagrees with validation."""
        limits = ValidationConfig()
        problems = []
        env = self.pool.make_env(env_id)
        # judged as validation judged it: under the env's own step limit (validation's cap), not training's
        # max_steps, which may cut an oracle short of its last call
        declared = env.unwrapped.worker.info.get("max_steps")
        env.unwrapped.max_steps = min(
            declared if isinstance(declared, int) and declared > 0 else limits.max_episode_steps,
            limits.max_episode_steps,
        )
        try:
            leaks = hint_leaks(env.unwrapped.worker, seed, episode_seed(seed, "other", 0))
            if leaks:
                problems.append("; ".join(leaks[:2]))
            for name in ("oracle", "message_only"):
                episode = Episode(f"seed-{seed}", 0, seed, env_seed=seed)
                reward = run_episode(env, make_agent(name, seed=seed), env_id, episode).reward
                if name == "oracle" and reward < limits.solvable_reward:
                    problems.append(f"the oracle scored {reward:.2f}")
                if name == "message_only" and reward > limits.trivial_max:
                    problems.append(f"a message-only agent scored {reward:.2f}")
        except TraceGymError as exc:
            problems.append(f"the env failed ({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            env.close()
        if problems:
            raise EnvTurnedError(
                f"{env_id} on training seed {seed}: {'; '.join(problems)}, where validation saw the "
                "oracle solve and the floor policies fail; training stops this env (a time bomb?)"
            )
        return f"{env_id} seed {seed}: oracle solved, message-only unpaid, hint gives nothing away"

    def _play_env(
        self,
        env_id: str,
        keys: list[dict[str, Any]],
        group_ids: list[int],
        backend: Any,
        rows: list[dict[str, Any] | None],
        record: IterationRecord,
    ) -> None:
        k = self.config.rollouts_per_group
        episodes, hinted = [], []
        for key in keys:
            task, seed = key.get("task"), key.get("seed")
            name = f"{env_id}|{task if task is not None else seed}"
            for sample in range(k):
                episodes.append(
                    Episode(
                        task,
                        sample,
                        episode_seed(self.config.seed, name, sample),
                        env_seed=None if task is not None else int(seed),
                    )
                )
                hinted.append(sample < self.config.hinted_per_group)
        agents = [
            make_agent(
                "llm",
                model=backend,
                adapter=self.adapter,
                temperature=self.config.temperature,
                max_new_tokens=self.config.max_new_tokens,
                seed=self.config.seed,
            )
            for _ in episodes
        ]

        can_hint = {}

        def configure(env: Any, i: int) -> None:
            core = env.unwrapped
            can_hint[i] = isinstance(core, SandboxedEnv)  # a synthesized env takes hints; a target has none
            if can_hint[i]:
                core.hint = hinted[i]

        outcomes = self.pool.play(env_id, episodes, agents, configure)
        record.episodes_played += sum(o.attempts for o in outcomes)
        for j, group in enumerate(group_ids):
            block = outcomes[j * k : (j + 1) * k]
            flags = [hinted[j * k + s] and can_hint.get(j * k + s, False) for s in range(k)]
            group_rows = self._group_rows(block, flags, record)
            for s, row in enumerate(group_rows):
                rows[group * k + s] = row
                self.last_outcomes[group * k + s] = block[s]

    def _group_rows(
        self, block: list[EpisodeOutcome], hinted: list[bool], record: IterationRecord
    ) -> list[dict[str, Any]]:
        """One GRPO group's rows; hinted rows get the group's hint-free prompt."""
        plain_prompts = {
            tuple(o.played.tokens.turns[0].prompt_ids)
            for o, h in zip(block, hinted)
            if not h and not o.failed and o.played.tokens is not None and o.played.tokens.turns
        }
        if (
            len(plain_prompts) > 1
        ):  # the env is at fault, not the run: this group is voided, counted, and training goes on
            reason = (
                "the hint-free rollouts of one group started from different prompts (the env's reset is not "
                "deterministic in its seed); group voided"
            )
            return [self._void_row(None, reason, record) for _ in block]
        plain = list(next(iter(plain_prompts))) if plain_prompts else None
        rows = []
        for outcome, is_hinted in zip(block, hinted):
            tokens = outcome.played.tokens
            usable = not outcome.failed and tokens is not None and tokens.turns
            if usable and is_hinted and plain is None:
                outcome.failure = (
                    "a hinted rollout whose group has no finished hint-free rollout (its prompt is unknown)"
                )
                usable = False
            if not usable:
                rows.append(
                    self._void_row(
                        plain or (tokens.turns[0].prompt_ids if tokens is not None and tokens.turns else None),
                        outcome.failure or "no tokens (the backend is not token-level)",
                        record,
                    )
                )
                continue
            tokens.check()
            grpo = tokens.for_grpo()
            if is_hinted:
                grpo["prompt_ids"] = list(plain)
                record.hinted += 1
            trajectory = outcome.played.trajectory
            reward = float(trajectory.reward)
            record.tokens_sampled += sum(grpo["env_mask"])
            if trajectory.error:
                record.gave_up += 1
            for name, value in (trajectory.reward_info or {}).get("components", {}).items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    record.components.setdefault(name, []).append(float(value))
            rows.append({**grpo, "env_reward": reward, "hinted": is_hinted})
        return rows

    def _void_row(self, prompt_ids: list[int] | None, reason: str, record: IterationRecord) -> dict[str, Any]:
        """A rollout the env could not finish: no reward (TRL gives it no advantage)
        and no token with a loss weight."""
        record.failed.append(reason)
        eos = self.tokenizer.eos_token_id
        return {
            "prompt_ids": list(prompt_ids or [eos]),
            "completion_ids": [eos],
            "logprobs": [0.0],
            "env_mask": [0],
            "env_reward": None,
            "hinted": False,
        }


def env_reward(
    prompts: list[Any], completions: list[Any], env_reward: list[float | None], **_: Any
) -> list[float | None]:
    """TRL reward function: the env's own reward at episode end, as ``rollout_func`` reported it."""
    return list(env_reward)


def plan_groups(config: GRPOTrainingConfig, task_lists: dict[str, list[str] | None]) -> list[str]:
    """The dataset: G episode keys per iteration, for every iteration. Env ids take
    turns group by group (the merged baseline's mixture); a synthesized env's
    seeds are derived from the run seed, a target's tasks are cycled in a seeded
    order."""
    orders = {}
    for env_id, tasks in task_lists.items():
        if tasks is not None:
            if not tasks:
                raise TrainingError(f"{env_id} has no tasks to train on")
            order = list(tasks)
            random.Random(derive_seed(config.seed, "task-order", env_id)).shuffle(order)
            orders[env_id] = order
    keys, used = [], {env_id: 0 for env_id in task_lists}
    for n in range(config.iterations * config.groups):
        env_id = config.env_ids[n % len(config.env_ids)]
        i = used[env_id]
        used[env_id] += 1
        if env_id in orders:
            keys.append(episode_key(env_id, task=orders[env_id][i % len(orders[env_id])]))
        else:
            keys.append(episode_key(env_id, seed=derive_seed(config.seed, env_id, i)))
    return keys
