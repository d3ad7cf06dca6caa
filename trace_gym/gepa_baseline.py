"""GEPA: reflective prompt evolution of the policy's instructions, at a fixed rollout budget.

The TRACE paper's strongest baseline besides GRPO. GEPA (the ``gepa`` package)
keeps a pool of candidate prompts, plays a few train tasks with one, shows the
transcripts and their reward components to a *reflection* model, which writes
a better prompt, and keeps the candidates that win on a validation set (a
Pareto front over its tasks).

What is optimized: ``instructions``, a block of text added to the end of the
target's system prompt. The target's own prompt (τ²'s domain policy and tool
rules) is part of the benchmark and stays as it is; the agent's conversation is
otherwise the env's own, exactly as for every other method.

Equal budget: every rollout GEPA asks for is a real episode of the target's
train split, played through :func:`trace_gym.rollout.rollout` (the loop every
method uses) and stored; the search stops before an iteration that could
overrun ``budget``, so GEPA is compared with TRACE and GRPO at the same number
of episodes. The rollouts reported are the episodes in the files, counted.

``out`` holds::

    episodes/call-0001.jsonl ...  every episode the search played, one file per evaluation call
    episodes/calls.jsonl          one line per call: candidate, tasks, episodes played
    search.jsonl                  one line per candidate: parents, validation score, text
    best_prompt.txt               the best candidate's instructions
    gepa.json                     the summary (budget, rollouts used, scores, reflection model and calls)
    state/                        GEPA's own checkpoint: a rerun with ``resume`` continues from it
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import TraceGymError
from .evaluation import method_result
from .llm import EMBEDDED_DEFAULT, GenerationRequest, make_backend
from .llm.registry import is_chat_endpoint
from .registry import EnvKind, get_entry, make
from .rollout import local_settings, rollout
from .seeding import derive_seed
from .store import read_trajectories

COMPONENT = "instructions"
DEFAULT_SEED_PROMPT = (
    "Help the user by following the policy above. Look up the records you need with the tools before you act, "
    "and make every change the user asks for that the policy allows."
)
SMALL_REFLECTOR_WARNING = (
    "the reflection model is the embedded 135M model: far too small to write useful prompts, so this search "
    "shows the machinery, not a fair GEPA baseline; give --reflection openai:<model> for a real one"
)


class GEPAError(TraceGymError):
    """A GEPA search that cannot run as asked (bad settings, a budget too small, a finished run)."""


@dataclass
class GEPAConfig:
    """One GEPA search (``trace-gym baseline gepa``; the pipeline's ``[gepa]`` section)."""

    env: str
    """The target env id (its ``split`` tasks are GEPA's train and validation sets)."""
    budget: int
    """Episodes the search may play in all (the seed prompt's validation included)."""
    out: str = "runs/gepa"
    model: str = "smollm2-135m-instruct"
    """The policy: the embedded model, ``hf:<path>`` or ``openai:<model>``."""
    reflection: str | None = None
    """The model that reads failed episodes and writes new instructions: ``openai:<model>``,
    ``hf:<path>`` or the embedded model (None: the embedded model, with a warning)."""
    split: str = "train"
    tasks: int | None = None
    """Only the first N tasks of ``split`` (None: all)."""
    val_tasks: int = 4
    """The last ``val_tasks`` of those tasks are GEPA's validation set; the rest its train set."""
    minibatch: int = 3
    """Train tasks per reflection (GEPA's ``reflection_minibatch_size``)."""
    seed_prompt: str = DEFAULT_SEED_PROMPT
    temperature: float = 0.0
    max_new_tokens: int = 256
    max_steps: int | None = None
    """Messages per episode before truncation (None: the target's default)."""
    batch: int = 8
    """Local policies: episodes generated together in lock-step."""
    workers: int = 1
    """API policies: episodes played in parallel threads."""
    reflection_max_tokens: int = 1024
    seed: int = 0
    servers: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    """Where the ``policy`` and the ``reflection`` model are served when not at the environment's
    ``OPENAI_BASE_URL`` (``{"policy": {"base_url": ..., "api_key": ...}}``); never recorded."""

    def check(self) -> "GEPAConfig":
        if self.budget < 1:
            raise GEPAError(f"budget must be at least 1 episode, got {self.budget}")
        if self.val_tasks < 1 or self.minibatch < 1:
            raise GEPAError("val_tasks and minibatch must be at least 1")
        first_iteration = 2 * self.val_tasks + 2 * self.minibatch
        if self.budget < first_iteration:
            raise GEPAError(
                f"a budget of {self.budget} episodes cannot pay for the seed prompt's validation ({self.val_tasks}) "
                f"and one GEPA iteration (2 x {self.minibatch} minibatch episodes, then {self.val_tasks} to validate a "
                f"better prompt): give at least {first_iteration}, or fewer validation tasks / a smaller minibatch"
            )
        if not self.seed_prompt.strip():
            raise GEPAError("the seed prompt is empty; GEPA evolves a prompt from a seed")
        return self

    def settings(self) -> dict[str, Any]:
        """What makes two searches the same (a resumed one must match); how a local policy
        decodes, where that must be recorded (``rollout.local_settings``)."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("out", "batch", "workers", "servers")}
        return {**settings, **local_settings("llm", {"model": self.model})}


@dataclass
class GEPAOutcome:
    best_prompt: str
    best_index: int
    seed_val_score: float
    best_val_score: float
    rollouts: int
    budget: int
    candidates: int
    reflection: str
    reflection_calls: int
    reflection_tokens: int
    train_tasks: list[str]
    val_tasks: list[str]
    wall_s: float
    gepa_metric_calls: int | None = None
    warning: str | None = None
    out: str = ""
    evaluation: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the rollout side: GEPA's adapter --------------------------------------------------------


class RolloutAdapter:
    """GEPA's adapter over trace-gym: ``evaluate`` plays real episodes of the target
    with the candidate's instructions (one trajectory file per call), and
    ``make_reflective_dataset`` gives the reflection model each episode's
    transcript and the env's reward components, failed episodes first."""

    propose_new_texts = None  # GEPA's own reflective proposer writes the new instructions

    def __init__(self, config: GEPAConfig, policy: Any, folder: Path, *, transcript_chars: int = 4000):
        self.config = config
        self.policy = policy
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.transcript_chars = transcript_chars
        self.calls = len(list(self.folder.glob("call-*.jsonl")))
        self.rollouts = played_episodes(self.folder)  # a resumed search has already paid for these
        self.local = not is_chat_endpoint(config.model)

    def evaluate(self, batch: list[str], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa.core.adapter import EvaluationBatch

        self.calls += 1
        path = self.folder / f"call-{self.calls:04d}.jsonl"
        unique = list(dict.fromkeys(str(t) for t in batch))  # a task asked twice in one batch is played once
        text = candidate[COMPONENT]
        env_kwargs = {"max_steps": self.config.max_steps} if self.config.max_steps else {}
        rollout(
            self.config.env,
            "llm",
            path,
            overwrite=True,
            task_ids=unique,
            seed=derive_seed(self.config.seed, "gepa-call", self.calls),
            agent_kwargs={
                "model": self.policy,
                "instructions": text,
                "temperature": self.config.temperature,
                "max_new_tokens": self.config.max_new_tokens,
            },
            split=self.config.split,
            env_kwargs=env_kwargs,
            progress=False,
            batch=self.config.batch if self.local else 1,
            workers=1 if self.local else self.config.workers,
        )
        by_task = {t.task_id: t for t in read_trajectories(path)}
        self.rollouts += len(by_task)
        with (self.folder / "calls.jsonl").open("a", encoding="utf-8") as log:
            log.write(
                json.dumps(
                    {
                        "call": self.calls,
                        "candidate": prompt_id(text),
                        "tasks": unique,
                        "episodes": len(by_task),
                        "rollouts_so_far": self.rollouts,
                        "scores": {t: by_task[t].reward for t in unique},
                    }
                )
                + "\n"
            )
        trajectories = [by_task[str(t)] for t in batch]
        return EvaluationBatch(
            outputs=[{"task_id": t.task_id, "reward": t.reward, "success": t.success} for t in trajectories],
            scores=[float(t.reward) for t in trajectories],
            trajectories=trajectories if capture_traces else None,
            num_metric_calls=len(by_task),
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        episodes = sorted(eval_batch.trajectories or [], key=lambda t: t.reward)  # failures first
        records = [
            {
                "Task": t.first_user_message()[:600],
                "Transcript": t.transcript(self.transcript_chars, per_message=300, keep="end"),
                "Feedback": feedback(t),
            }
            for t in episodes
        ]
        return {name: records for name in components_to_update}


def played_episodes(folder: Path) -> int:
    """Episodes stored under ``folder`` (every call's file), counted from the files."""
    return sum(len(read_trajectories(p)) for p in sorted(Path(folder).glob("call-*.jsonl")))


def prompt_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def feedback(t: Any) -> str:
    """The env's verdict in words: reward, how the episode ended, which reward
    components failed, and the expected actions that were not taken (by name)."""
    info = t.reward_info or {}
    parts = [
        f"reward {t.reward:.2f} ({'solved' if t.success else 'not solved'})",
        f"the episode ended by {t.termination_reason or 'unknown'} after {t.steps} messages",
    ]
    if info.get("components"):
        parts.append("reward components: " + ", ".join(f"{k}={v:g}" for k, v in sorted(info["components"].items())))
    if info.get("reason"):
        parts.append(f"verdict: {info['reason']}")
    details = info.get("details") or {}
    missed = [a["name"] for a in details.get("actions", []) if not a.get("met")]
    if missed:
        parts.append("expected actions not taken: " + ", ".join(missed))
    unsaid = [c["info"] for c in details.get("communicate", []) if not c.get("met")]
    if unsaid:
        parts.append("information the user should have been told: " + "; ".join(map(str, unsaid)))
    if t.error:
        parts.append(f"the agent gave up: {t.error[:200]}")
    return "; ".join(parts)


# --- the reflection side ----------------------------------------------------------------------


class Reflector:
    """GEPA's ``reflection_lm``: a prompt in, the model's text out, calls and tokens counted."""

    def __init__(self, backend: Any, max_new_tokens: int = 1024):
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.calls = 0
        self.tokens = 0
        self.error: str | None = None
        """The first failure of the model itself (GEPA swallows a proposer's exceptions and
        would go on spending rollouts without proposals; the search stops on it instead)."""

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        try:
            [completion] = self.backend.complete(
                [GenerationRequest(messages=messages, tools=None, max_new_tokens=self.max_new_tokens, temperature=0.0)]
            )
        except TraceGymError as exc:
            self.error = self.error or str(exc)
            raise
        self.calls += 1
        self.tokens += (completion.prompt_tokens or 0) + (completion.completion_tokens or 0)
        return completion.text


class BudgetStopper:
    """Stops GEPA before an iteration that could overrun the budget: one iteration plays
    the parent and the child on a minibatch, and the child on the validation set when
    it wins."""

    def __init__(self, adapter: RolloutAdapter, budget: int, iteration_cost: int, reflector: Reflector):
        self.adapter = adapter
        self.budget = budget
        self.iteration_cost = iteration_cost
        self.reflector = reflector

    def __call__(self, gepa_state: Any) -> bool:
        return self.reflector.error is not None or self.adapter.rollouts + self.iteration_cost > self.budget


class SearchLog:
    """GEPA's logger: every line into ``gepa_log.txt``; its iteration lines also to ``say``
    (stdout stays free for the command's own output)."""

    def __init__(self, path: Path, say: Callable[[str], None]):
        self.path = path
        self.say = say

    def log(self, message: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{message}\n")
        if message.startswith("Iteration") and ("score" in message or "New program" in message):
            self.say(message)


# --- the search ------------------------------------------------------------------------------


def split_tasks(config: GEPAConfig) -> tuple[list[str], list[str]]:
    """GEPA's train and validation tasks: the first ``tasks`` of the target's ``split``,
    the last ``val_tasks`` of them for validation."""
    entry = get_entry(config.env)
    if entry.kind != EnvKind.TARGET:
        raise GEPAError(f"{config.env} is a training env; GEPA optimizes the policy's prompt on a target benchmark")
    env = make(config.env, split=config.split)
    try:
        task_ids = [str(t) for t in (getattr(env.unwrapped, "task_ids", None) or [])]
    finally:
        env.close()
    if config.tasks is not None:
        task_ids = task_ids[: config.tasks]
    if len(task_ids) <= config.val_tasks:
        raise GEPAError(
            f"{config.env} split '{config.split}' gives {len(task_ids)} tasks; GEPA needs more than the "
            f"{config.val_tasks} validation tasks (the rest are its train set)"
        )
    return task_ids[: -config.val_tasks], task_ids[-config.val_tasks :]


def make_models(config: GEPAConfig) -> tuple[Any, Any, str | None]:
    """The policy backend, the reflection backend (the policy's own when they are the
    same model) and the warning a too-small reflection model earns."""
    policy = make_backend(config.model, **config.servers.get("policy", {}))
    spec = config.reflection or EMBEDDED_DEFAULT
    reflection = policy if spec == config.model else make_backend(spec, **config.servers.get("reflection", {}))
    warning = SMALL_REFLECTOR_WARNING if spec == EMBEDDED_DEFAULT else None
    return policy, reflection, warning


def run_gepa(
    config: GEPAConfig,
    *,
    resume: bool = False,
    say: Callable[[str], None] = print,
    progress: bool = False,
    models: tuple[Any, Any, str | None] | None = None,
) -> GEPAOutcome:
    """Run the search (or continue it with ``resume``) and write ``out``; see the module doc."""
    try:
        import gepa
    except ImportError:
        raise GEPAError("the GEPA baseline needs the gepa package: pip install 'trace-gym[baselines]'") from None

    config.check()
    out = Path(config.out)
    settings_path = out / "settings.json"
    if settings_path.exists():
        if not resume:
            raise GEPAError(
                f"{out} already holds a GEPA search; pass --resume to continue or keep it, or choose another --out"
            )
        recorded = json.loads(settings_path.read_text(encoding="utf-8"))
        if recorded != json.loads(json.dumps(config.settings())):
            changed = sorted(
                k for k in set(recorded) | set(config.settings()) if recorded.get(k) != config.settings().get(k)
            )
            raise GEPAError(f"{out} holds a search with other settings ({', '.join(changed)}); choose another --out")
        if (out / "gepa.json").exists():
            say(f"{out}: the search is finished; kept")
            return GEPAOutcome(
                **{
                    k: v
                    for k, v in json.loads((out / "gepa.json").read_text()).items()
                    if k in GEPAOutcome.__dataclass_fields__
                }
            )
    train, val = split_tasks(config)
    policy, reflection_backend, warning = models or make_models(config)
    out.mkdir(parents=True, exist_ok=True)  # only now: a mistake above leaves nothing behind to refuse a rerun
    settings_path.write_text(json.dumps(config.settings(), indent=2) + "\n", encoding="utf-8")
    if warning:
        say(f"WARNING: {warning}")
    reflector = Reflector(reflection_backend, config.reflection_max_tokens)
    adapter = RolloutAdapter(
        config, policy, out / "episodes", transcript_chars=1500 if warning else 4000
    )  # the small model's context is 8k tokens
    if adapter.rollouts:
        say(f"resuming: {adapter.rollouts} episodes already played")
    iteration_cost = 2 * config.minibatch + len(val)
    say(
        f"GEPA on {config.env} ({config.split}: {len(train)} train, {len(val)} validation tasks), budget "
        f"{config.budget} episodes, reflection {reflection_backend.name}"
    )
    started = time.perf_counter()
    result = gepa.optimize(
        seed_candidate={COMPONENT: config.seed_prompt},
        trainset=train,
        valset=val,
        adapter=adapter,
        reflection_lm=reflector,
        reflection_minibatch_size=config.minibatch,
        candidate_selection_strategy="pareto",
        stop_callbacks=[BudgetStopper(adapter, config.budget, iteration_cost, reflector)],
        logger=SearchLog(out / "gepa_log.txt", say),
        max_metric_calls=config.budget,
        run_dir=str(out / "state"),
        seed=config.seed,
        display_progress_bar=progress,
        raise_on_exception=True,
        track_best_outputs=False,
    )
    wall = time.perf_counter() - started
    if reflector.error:
        raise GEPAError(
            f"the reflection model {reflection_backend.name} failed: {reflector.error}; the episodes played "
            f"so far are kept in {out / 'episodes'}, --resume continues"
        )
    if adapter.rollouts > config.budget:  # cannot happen unless GEPA changes its iteration; never hide it
        raise GEPAError(f"the search played {adapter.rollouts} episodes, over its budget of {config.budget}")
    with (out / "search.jsonl").open("w", encoding="utf-8") as log:
        for i, candidate in enumerate(result.candidates):
            log.write(
                json.dumps(
                    {
                        "index": i,
                        "parents": result.parents[i],
                        "val_score": result.val_aggregate_scores[i],
                        "found_at_metric_calls": result.discovery_eval_counts[i],
                        "prompt_id": prompt_id(candidate[COMPONENT]),
                        COMPONENT: candidate[COMPONENT],
                    }
                )
                + "\n"
            )
    best = result.best_candidate[COMPONENT]
    (out / "best_prompt.txt").write_text(best + "\n", encoding="utf-8")
    outcome = GEPAOutcome(
        best_prompt=best,
        best_index=result.best_idx,
        seed_val_score=result.val_aggregate_scores[0],
        best_val_score=result.val_aggregate_scores[result.best_idx],
        rollouts=played_episodes(out / "episodes"),
        budget=config.budget,
        candidates=len(result.candidates),
        reflection=reflection_backend.name,
        reflection_calls=reflector.calls,
        reflection_tokens=reflector.tokens,
        train_tasks=train,
        val_tasks=val,
        wall_s=round(wall, 1),
        gepa_metric_calls=result.total_metric_calls,
        warning=warning,
        out=str(out),
    )
    (out / "gepa.json").write_text(json.dumps(outcome.as_dict(), indent=2) + "\n", encoding="utf-8")
    say(
        f"{outcome.candidates} candidates from {outcome.rollouts} episodes (budget {config.budget}); validation "
        f"score {outcome.seed_val_score:.3f} (seed) -> {outcome.best_val_score:.3f} (best, candidate {outcome.best_index})"
    )
    return outcome


def evaluate_prompt(
    config: GEPAConfig,
    instructions: str,
    out: str | Path,
    *,
    split: str = "test",
    tasks: int | None = None,
    samples: int = 1,
    policy: Any = None,
    cost: dict[str, Any] | None = None,
    method: str = "gepa",
) -> Any:
    """The held-out row: the policy with ``instructions`` on ``split``, through the same
    rollout loop as every method; returns its ``MethodResult``."""
    env_kwargs = {"max_steps": config.max_steps} if config.max_steps else {}
    local = not is_chat_endpoint(config.model)
    rollout(
        config.env,
        "llm",
        out,
        resume=True,
        split=split,
        limit=tasks,
        samples=samples,
        seed=derive_seed(config.seed, "evaluate"),
        agent_kwargs={
            "model": policy or config.model,
            "instructions": instructions,
            "temperature": config.temperature,
            "max_new_tokens": config.max_new_tokens,
        },
        env_kwargs=env_kwargs,
        batch=config.batch if local else 1,
        workers=1 if local else config.workers,
        progress=False,
    )
    return method_result(method, read_trajectories(out), cost=cost)
