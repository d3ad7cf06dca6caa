"""Routing at inference (TRACE stage 4): the base model picks one adapter per task.

The router shows the base model the task's first user message and, under the
labels ``A, B, C, ...``, each capability's description with a few tasks where
an agent was found lacking it, plus ``none``. It scores every label as the
answer (the model layer's ``score``: ``LocalHF`` logits, or ``top_logprobs``
from an OpenAI-compatible server) and takes the argmax, as the TRACE paper's
first version does; ``none`` means the base model without an adapter.
With ``calibrate`` (off by default, as in the paper) the argmax is taken over
the scores minus those of a content-free task, which removes a small model's
preference for the first label.

It must not generate free text to parse (labels are scored, never sampled),
nor see anything of a task beyond what the agent sees at its start.
``RoutedAgent`` is an ``LLMAgent`` whose adapter is chosen per task; the
decision and its scores go into the trajectory's ``agent_info["route"]``.
"""

from __future__ import annotations

import math
import string
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from trace_gym.agents.llm_agent import LLMAgent
from .artifacts import ArtifactError, Identification
from .errors import TraceGymError

NONE_LABEL = "none"
CONTENT_FREE_TASK = "N/A"


class RoutingError(TraceGymError):
    """The router cannot be built or asked (no capabilities, a backend that cannot score)."""


@dataclass
class RouteCapability:
    """One destination of the router."""

    name: str
    """The capability's short name (as identification wrote it)."""
    description: str
    """One sentence the router reads."""
    adapter: str
    """The adapter's name in the policy backend (a ``LocalHF`` adapter, a vLLM LoRA model name)."""
    examples: list[str] = field(default_factory=list)
    """First user messages of tasks where the capability was found lacking."""


@dataclass
class RouteDecision:
    capability: str | None
    """The chosen capability, or None for the base model."""
    adapter: str | None
    label: str
    scores: dict[str, float]
    """Each label's log-probability as the router's answer."""
    calibrated: dict[str, float] | None = None
    """With calibration: the scores minus the content-free baseline, which the argmax was taken over."""
    names: dict[str, str] = field(default_factory=dict)
    """What each label stands for: a capability's name, or ``none`` for the base model."""

    def named(self, scores: dict[str, float]) -> dict[str, float]:
        """``scores`` keyed by what each label stands for, for people to read."""
        return {self.names.get(label, label): value for label, value in scores.items()}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def router_system(agent: str = "a tool-using agent") -> str:
    """The router's system prompt; ``agent``: what the target's agent is (``registry.agent_words``)."""
    return (
        f"You route the tasks of {agent} to specialists. Each specialist is good at one skill. "
        "Read the task and answer with the label of the one skill the task needs most, "
        f"or '{NONE_LABEL}' if it needs none of them. Answer with the label alone."
    )


class Router:
    """Argmax over label scores from the base model (``backend.score``)."""

    def __init__(
        self,
        backend: Any,
        capabilities: list[RouteCapability],
        *,
        max_examples: int = 2,
        example_chars: int = 300,
        calibrate: bool = False,
        agent: str = "a tool-using agent",
    ):
        if not capabilities:
            raise RoutingError("the router needs at least one capability with an adapter")
        if len(capabilities) > len(string.ascii_uppercase):
            raise RoutingError(
                f"at most {len(string.ascii_uppercase)} capabilities can be routed, got {len(capabilities)}"
            )
        if not callable(getattr(backend, "score", None)):
            raise RoutingError(f"the backend {getattr(backend, 'name', backend)!r} cannot score labels")
        self.backend = backend
        self.capabilities = capabilities
        self.max_examples = max_examples
        self.example_chars = example_chars
        self.by_label = {string.ascii_uppercase[i]: c for i, c in enumerate(capabilities)}
        self.labels = [*self.by_label, NONE_LABEL]
        self.calibrate = calibrate
        self.agent = agent
        self._baseline: dict[str, float] | None = None

    def prompt(self, task_message: str) -> list[dict[str, str]]:
        lines = ["Skills:"]
        for label, cap in self.by_label.items():
            lines.append(f"{label}. {cap.name}: {cap.description}")
            for example in cap.examples[: self.max_examples]:
                lines.append(f"   A task that needed it: {_clip(example, self.example_chars)}")
        lines.append(f"{NONE_LABEL}. The task needs none of these skills.")
        lines += [
            "",
            "Task:",
            task_message.strip(),
            "",
            f"Which skill does this task need most? Answer with one label: {', '.join(self.labels)}.",
        ]
        return [{"role": "system", "content": router_system(self.agent)}, {"role": "user", "content": "\n".join(lines)}]

    def _scores(self, task_message: str) -> dict[str, float]:
        scores = self.backend.score(self.prompt(task_message), self.labels, adapter=None)
        missing = [label for label in self.labels if label not in scores]
        if missing:
            raise RoutingError(f"the backend returned no score for the labels {missing}")
        return {k: float(scores[k]) for k in self.labels}

    def baseline(self) -> dict[str, float]:
        """The label scores for a content-free task ("N/A"): the router's prior over labels."""
        if self._baseline is None:
            self._baseline = self._scores(CONTENT_FREE_TASK)
        return self._baseline

    def route(self, task_message: str) -> RouteDecision:
        """The argmax label; with ``calibrate``, of the scores minus the content-free baseline
        (contextual calibration: small models prefer the first label whatever the task)."""
        scores = self._scores(task_message)
        decide = scores
        if self.calibrate:
            prior = self.baseline()
            decide = {k: scores[k] - prior[k] if math.isfinite(prior[k]) else scores[k] for k in self.labels}
        label = max(self.labels, key=lambda lab: (decide[lab], lab == NONE_LABEL))  # ties go to the base model
        cap = self.by_label.get(label)
        return RouteDecision(
            cap.name if cap else None,
            cap.adapter if cap else None,
            label,
            scores,
            decide if self.calibrate else None,
            names={**{k: c.name for k, c in self.by_label.items()}, NONE_LABEL: NONE_LABEL},
        )


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def capabilities_from_identification(
    identified: Any, adapters: dict[str, str], *, trajectories: Iterable[Any] = (), max_examples: int = 2
) -> list[RouteCapability]:
    """Route destinations from identification (an ``Identification`` or identify's
    output folder): the selected capabilities that have an adapter (``adapters``:
    capability name -> adapter name), each with the first user messages of up to
    ``max_examples`` trajectories labelled LACKING."""
    if not isinstance(identified, Identification):
        try:
            identified = Identification.load(identified)
        except ArtifactError as exc:
            raise RoutingError(str(exc)) from None
    lacking = {name: [label.episode_id for label in labels] for name, labels in identified.lacking().items()}
    first_message = {t.episode_id: t.first_user_message() for t in trajectories}
    out = []
    for cap in identified.selected:
        if cap.name not in adapters:
            continue
        examples = [first_message[e] for e in lacking.get(cap.name, []) if first_message.get(e)][:max_examples]
        out.append(RouteCapability(cap.name, cap.description, adapters[cap.name], examples))
    return out


class RoutedAgent(LLMAgent):
    """An ``LLMAgent`` whose adapter is chosen per task by a ``Router`` over the same backend."""

    name = "routed"

    def __init__(self, router: Router | None = None, **kwargs: Any):
        if router is None:
            raise RoutingError(
                "the routed agent needs a router (capabilities and their adapters): "
                "`trace-gym run` builds one in its evaluate stage"
            )
        model = kwargs.pop("model", None)
        if model is not None and model is not router.backend:
            raise RoutingError("a routed agent plays with its router's own backend (the base model routes)")
        super().__init__(model=router.backend, **kwargs)
        self.router = router
        self.decision: RouteDecision | None = None

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        self.decision = self.router.route(observation)
        self.adapter = self.decision.adapter
        super().reset(observation, info, env)

    def info(self) -> dict[str, Any]:
        return {"route": self.decision.as_dict() if self.decision else None}
