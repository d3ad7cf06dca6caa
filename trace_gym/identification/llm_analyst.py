"""The LLM analyst: discovery, merging and labelling through an OpenAI-compatible model.

- Discovery: each run shows the analyst a seeded batch of failed trajectories
  (default 50), compacted to fit a character budget, and asks for the lacking
  capabilities; the runs' candidates are pooled and near-duplicates merged by
  the analyst itself.
- Labelling: PRESENT, LACKING or NOT_APPLICABLE with evidence, one call per
  (trajectory, capability) pair or, with ``per_trajectory``, one call per
  trajectory for all capabilities.
- Every answer is JSON validated with pydantic and asked again when malformed;
  valid answers are cached on disk by model and prompt, so a re-run costs no
  call. Calls and tokens are counted. Prompts are versioned files in prompts/.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from trace_gym.errors import TraceGymError
from trace_gym.llm.registry import is_chat_endpoint, make_backend
from trace_gym.prompts import render_prompt
from trace_gym.registry import agent_words
from trace_gym.seeding import derive_seed
from trace_gym.trajectory import Trajectory

from .stats import Label, Verdict, capability_id

PROMPTS = Path(__file__).with_name("prompts")
PROMPT_VERSION = "v1"
T = TypeVar("T", bound=BaseModel)


class Candidate(BaseModel):
    name: str = Field(min_length=2, max_length=80)
    description: str = Field(min_length=5, max_length=600)


class DiscoveryAnswer(BaseModel):
    capabilities: list[Candidate] = Field(min_length=1)


class MergeGroup(Candidate):
    members: list[int] = Field(min_length=1)


class MergeAnswer(BaseModel):
    groups: list[MergeGroup]


class Evidence(BaseModel):
    message_index: int | None = None
    quote: str = ""


class PairLabel(BaseModel):
    label: Verdict
    evidence: Evidence = Field(default_factory=Evidence)


class NamedLabel(PairLabel):
    capability: str


class TrajectoryLabels(BaseModel):
    labels: list[NamedLabel]


class AnalystError(TraceGymError):
    """The analyst never gave a valid answer."""


def render(template: str, /, **values: Any) -> str:
    """The analyst's prompt ``template`` of this version, filled."""
    return render_prompt(PROMPTS, template, PROMPT_VERSION, **values)


def _agent(trajectories: list[Trajectory]) -> str:
    """What the agent of these trajectories is, in the words of its target's manifest."""
    return agent_words(trajectories[0].env_id if trajectories else None)


def compact(trajectory: Trajectory, budget: int = 4000, per_message: int = 400) -> str:
    """A trajectory as the analyst reads it: its id and reward, then its transcript."""
    head = f"episode {trajectory.episode_id}, reward {trajectory.reward:.2f}\n"
    return head + trajectory.transcript(budget - len(head), per_message=per_message)


class AnswerCache:
    """Valid analyst answers on disk, one JSON file per (model, prompt) hash."""

    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder else None
        if self.folder:
            self.folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(f"{model}\0{prompt}".encode()).hexdigest()

    def get(self, key: str) -> str | None:
        if not self.folder:
            return None
        path = self.folder / f"{key}.json"
        return json.loads(path.read_text())["answer"] if path.exists() else None

    def put(self, key: str, answer: str) -> None:
        if self.folder:
            tmp = self.folder / f".{key}.tmp"
            tmp.write_text(json.dumps({"answer": answer}))
            tmp.replace(self.folder / f"{key}.json")


def analyst_backend(
    spec: str, *, base_url: str | None = None, api_key: str | None = None, offline: tuple[str, ...] = ()
) -> Any:
    """The OpenAI-compatible client an analyst talks through (time-outs, back-off on
    transient errors), one request at a time: identification's and synthesis's.
    ``offline``: the caller's analysts that need no server, named in the refusal."""
    if not is_chat_endpoint(spec):
        raise TraceGymError(unknown_analyst(spec, offline))
    return make_backend(spec, base_url=base_url, api_key=api_key, concurrency=1)


def unknown_analyst(spec: str, offline: tuple[str, ...] = ()) -> str:
    """The one-line refusal of an analyst spec, naming the caller's offline analysts
    (``gold``, ``registry``, ...) beside ``openai:<model>``."""
    choices = ", ".join(offline) + " or " if offline else "an OpenAI-compatible server's "
    return f"unknown analyst '{spec}'; use {choices}openai:<model>"


class LLMAnalyst:
    def __init__(
        self,
        spec: str,
        *,
        per_trajectory: bool = False,
        cache_dir: str | Path | None = None,
        batch_size: int = 50,
        budget_chars: int = 120_000,
        max_retries: int = 2,
        concurrency: int = 4,
        base_url: str | None = None,
        api_key: str | None = None,
    ):
        self.name = spec
        self.backend = analyst_backend(spec, base_url=base_url, api_key=api_key)
        self.per_trajectory = per_trajectory
        self.cache = AnswerCache(Path(cache_dir) if cache_dir else None)
        self.batch_size = batch_size
        self.budget_chars = budget_chars
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.calls = 0
        self.tokens = 0
        self.cache_hits = 0
        self._lock = threading.Lock()

    # --- discovery ----------------------------------------------------------------------
    def discover(self, failures: list[Trajectory], *, runs: int, seed: int = 0) -> dict[str, str]:
        if not failures:
            raise AnalystError("discovery needs failed trajectories")
        pooled: list[Candidate] = []
        for r in range(runs):
            batch = random.Random(derive_seed(seed, "discovery", r)).sample(
                failures, min(self.batch_size, len(failures))
            )
            per = max(400, self.budget_chars // len(batch))
            text = "\n\n".join(compact(t, budget=per) for t in batch)
            pooled += self.ask(
                render("discovery", agent=_agent(batch), count=len(batch), trajectories=text), DiscoveryAnswer
            ).capabilities
        return self.merge(pooled)

    def merge(self, pooled: list[Candidate]) -> dict[str, str]:
        unique = list({capability_id(c.name): c for c in pooled}.values())
        if len(unique) <= 1:
            return {capability_id(c.name): c.description for c in unique}
        listing = "\n".join(f"{i}. {c.name}: {c.description}" for i, c in enumerate(unique))
        answer = self.ask(
            render("merge", candidates=listing),
            MergeAnswer,
            check=lambda a: sorted(m for g in a.groups for m in g.members) == list(range(len(unique))),
        )
        return {capability_id(g.name): g.description for g in answer.groups}

    # --- labelling ----------------------------------------------------------------------
    def label_all(self, trajectories: list[Trajectory], candidates: dict[str, str]) -> list[Label]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            if self.per_trajectory:
                chunks = pool.map(lambda t: self._label_trajectory(t, candidates), trajectories)
            else:
                chunks = pool.map(
                    lambda pair: [self._label_pair(*pair)],
                    [(t, name, desc) for t in trajectories for name, desc in candidates.items()],
                )
            return [label for chunk in chunks for label in chunk]

    def _label_pair(self, trajectory: Trajectory, name: str, description: str) -> Label:
        answer = self.ask(
            render(
                "label_pair",
                agent=_agent([trajectory]),
                name=name,
                description=description,
                trajectory=compact(trajectory, 12_000),
            ),
            PairLabel,
        )
        return Label(trajectory.episode_id, name, answer.label, _evidence(answer.evidence))

    def _label_trajectory(self, trajectory: Trajectory, candidates: dict[str, str]) -> list[Label]:
        listing = "\n".join(f'- "{n}": {d}' for n, d in candidates.items())
        answer = self.ask(
            render(
                "label_trajectory",
                agent=_agent([trajectory]),
                capabilities=listing,
                trajectory=compact(trajectory, 12_000),
            ),
            TrajectoryLabels,
            check=lambda a: {x.capability for x in a.labels} >= set(candidates),
        )
        by_name = {x.capability: x for x in answer.labels}
        return [Label(trajectory.episode_id, n, by_name[n].label, _evidence(by_name[n].evidence)) for n in candidates]

    # --- one validated, cached question ---------------------------------------------------
    def ask(self, prompt: str, schema: type[T], check=None) -> T:
        """One question, answered with JSON that ``schema`` (and ``check``) accept.

        A malformed answer is not asked again blind: at temperature 0 the same
        prompt would get the same answer. The retry continues the conversation
        with the answer and what was wrong with it, so the model can fix it."""
        key = AnswerCache.key(self.backend.model, prompt)
        cached = self.cache.get(key)
        if cached is not None:
            with self._lock:
                self.cache_hits += 1
            return schema.model_validate_json(cached)
        conversation = [{"role": "user", "content": prompt}]
        problem = ""
        for _ in range(self.max_retries + 1):
            [completion] = self.backend.generate([conversation], max_new_tokens=2048, temperature=0.0)
            with self._lock:
                self.calls += 1
                self.tokens += (completion.prompt_tokens or 0) + (completion.completion_tokens or 0)
            try:
                answer = schema.model_validate_json(extract_json(completion.text))
                if check is not None and not check(answer):
                    raise ValueError("the answer does not cover everything that was asked")
            except (ValidationError, ValueError) as exc:
                problem = _first_problem(exc)
                conversation = conversation + [
                    {"role": "assistant", "content": completion.text},
                    {"role": "user", "content": RETRY_PROMPT.format(problem=problem)},
                ]
                continue
            self.cache.put(key, answer.model_dump_json())
            return answer
        raise AnalystError(
            f"{self.name} gave no valid answer in {self.max_retries + 1} tries (last problem: {problem})"
        )


RETRY_PROMPT = (
    "Your answer could not be used: {problem}. Answer the same question again with only the JSON "
    "object described above, no prose."
)


def _first_problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ())) or "the answer"
        return f"{where}: {error.get('msg', 'invalid')}"[:300]
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def extract_json(text: str) -> str:
    """The first JSON object in a model's answer (models wrap JSON in prose or fences).

    Decoding starts at each ``{`` in turn with the standard JSON decoder, so
    strings with escaped quotes or braces are read exactly as JSON reads them."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the answer")
    first_error = None
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            first_error = first_error or exc
        else:
            if isinstance(value, dict):
                return text[start:end]
        start = text.find("{", start + 1)
    raise ValueError(
        f"no complete JSON object in the answer ({first_error.msg} at character {first_error.pos})"
        if first_error
        else "no JSON object in the answer"
    )


def _evidence(evidence: Evidence) -> str:
    where = f"message {evidence.message_index}: " if evidence.message_index is not None else ""
    return (where + evidence.quote)[:300]
