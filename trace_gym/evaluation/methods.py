"""The methods of TRACE's comparison, as small registered classes.

A method is a way to play the target on its held-out split. Each says how it
builds its agent from an earlier run's artifacts (``build``) and what it cost
to make (``cost``); evaluation plays every method through the same rollout
loop and writes one row each. A method that cannot be built from this run
(its stage did not run, no adapter of its kind was trained) raises
``Unavailable`` with the reason the table's notes print.

    base         the policy as it is
    trace        the capability adapters, one routed per task by the base model
    grpo-target  one adapter trained with GRPO on the target's train split
    merged       one adapter trained on every capability env together
    summed       the capability adapters' weights added into one
    control      adapters of capabilities the contrast did not select, routed alike
    gepa         the policy with the GEPA baseline's best instructions

A user adds a row by subclassing ``Method`` and decorating it with
``register_method``; ``[evaluate] methods`` and ``trace-gym evaluate
--methods`` then accept its name.

Budget matching lives here too: every trained baseline gets as many update
rollouts as the capability adapters together (``trace_budget``), by training
``baseline_scale`` times the iterations of one capability adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..artifacts import AdapterKind, AdapterRecord, AdapterSet, Identification
from ..errors import TraceGymError
from ..identification.gold import GOLD_CAPABILITIES
from ..llm import make_backend
from ..llm.base import SumsAdapters
from ..llm.local.lora import adds_nothing
from ..llm.registry import is_chat_endpoint
from ..registry import agent_words
from ..routing import RouteCapability, Router, capabilities_from_identification
from ..trajectory import Trajectory


class Unavailable(TraceGymError):
    """This run has nothing to build a method from (the reason is the message)."""


def trace_budget(adapters: AdapterSet) -> int:
    """The update rollouts behind TRACE: all capability adapters' together. Every
    baseline trained to compare with TRACE is given this many (GEPA plays as many)."""
    return sum(a.rollouts for a in adapters.of_kind(AdapterKind.CAPABILITY))


def baseline_scale(capability_envs: int) -> int:
    """How many capability adapters' iterations a trained baseline runs, so that its
    rollouts equal ``trace_budget`` (each capability adapter runs the same G x K x
    iterations)."""
    return max(1, capability_envs)


@dataclass
class EvalContext:
    """What a method builds from: the policy's backend (every adapter loaded under
    its name) and the artifacts of the run being evaluated."""

    target: str
    backend: Any
    adapters: AdapterSet
    identification: Identification | None = None
    train_trajectories: list[Trajectory] = field(default_factory=list)
    """The base policy's train-split rollouts (the router's LACKING examples come from them)."""
    gepa: dict[str, Any] | None = None
    """The gepa stage's outputs (its best prompt and cost), if it ran."""
    calibrate_router: bool = False
    analyst_calls: int = 0
    """Analyst calls of identification and synthesis (what TRACE, summed and merged needed)."""
    pre_training_wall_s: float = 0.0
    """Wall time of rollout, identification and synthesis."""


@dataclass
class BuiltAgent:
    """How rollout plays a method: an agent name and its keyword arguments; for a
    routed method, the capabilities it routes among."""

    agent: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    routed: list[str] | None = None
    targets: list[str] = field(default_factory=list)
    """The capabilities it was trained for (specificity compares their LACKING rates with the others')."""
    same_as: str | None = None
    """A method whose agent is exactly this one's (its adapter adds nothing): evaluation
    scores that method's episodes for it instead of playing the same ones again."""
    note: str = ""
    """Said in the table's notes (why ``same_as``)."""


class Method:
    """One row of the comparison."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def build(self, ctx: EvalContext) -> BuiltAgent:
        raise NotImplementedError

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        """Training rollouts, analyst calls and wall time spent to make the method."""
        return {"train_rollouts": 0, "analyst_calls": 0, "wall_s": 0.0}


METHODS: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method available to evaluation by its ``name``."""
    if not cls.name:
        raise TraceGymError(f"{cls.__name__}: a method needs a name")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise TraceGymError(f"a method named '{cls.name}' is already registered ({METHODS[cls.name].__name__})")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> Method:
    try:
        return METHODS[name]()
    except KeyError:
        raise TraceGymError(f"unknown method '{name}' (known: {', '.join(METHODS)})") from None


def _adapter_cost(records: list[AdapterRecord], *, analyst_calls: int = 0, extra_wall_s: float = 0.0) -> dict[str, Any]:
    return {
        "train_rollouts": sum(a.rollouts for a in records),
        "analyst_calls": analyst_calls,
        "wall_s": sum(a.wall_s or 0 for a in records) + extra_wall_s,
    }


def build_router(ctx: EvalContext, records: list[AdapterRecord], *, control: bool = False) -> Any:
    """The router over these adapters: descriptions and LACKING examples from
    identification; the control's capabilities were not selected, so their
    descriptions come from the gold dictionary."""
    names = {(a.capability or a.name) if control else a.name: a.name for a in records}
    caps = []
    if ctx.identification is not None and not control:
        caps = capabilities_from_identification(ctx.identification, names, trajectories=ctx.train_trajectories)
    if not caps:
        caps = [RouteCapability(n, GOLD_CAPABILITIES.get(n, n), adapter) for n, adapter in names.items()]

    return Router(ctx.backend, caps, calibrate=ctx.calibrate_router, agent=agent_words(ctx.target))


@register_method
class Base(Method):
    name = "base"
    description = "the policy as it is"

    def build(self, ctx: EvalContext) -> BuiltAgent:
        return BuiltAgent("llm")


class RoutedAdapters(Method):
    """Adapters of one kind, one picked per task by the base model's router."""

    kind: ClassVar[AdapterKind] = AdapterKind.CAPABILITY
    missing: ClassVar[str] = ""

    def build(self, ctx: EvalContext) -> BuiltAgent:
        records = ctx.adapters.of_kind(self.kind)
        if not records:
            raise Unavailable(self.missing)
        names = [a.capability or a.name for a in records]
        return BuiltAgent(
            "routed", {"router": build_router(ctx, records, control=self.kind is AdapterKind.CONTROL)}, names, names
        )

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        return _adapter_cost(ctx.adapters.of_kind(self.kind))  # type: ignore[arg-type]


@register_method
class Trace(RoutedAdapters):
    name = "trace"
    description = "capability adapters, routed per task"
    missing = "no capability adapter was trained"

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        return _adapter_cost(
            ctx.adapters.of_kind(AdapterKind.CAPABILITY),
            analyst_calls=ctx.analyst_calls,
            extra_wall_s=ctx.pre_training_wall_s,
        )


class TrainedBaseline(Method):
    """A baseline adapter the train stage made under this method's name."""

    def build(self, ctx: EvalContext) -> BuiltAgent:
        record = ctx.adapters.named(self.name)
        if record is None:
            raise Unavailable(f"no '{self.name}' adapter was trained")
        built = BuiltAgent("llm", {"adapter": self.name}, targets=self.targets(ctx))
        if Path(record.adapter).is_dir() and adds_nothing(record.adapter):
            built.same_as = "base"
            built.note = "its adapter adds nothing to the policy (every LoRA update is 0): base's episodes are its own"
        return built

    def targets(self, ctx: EvalContext) -> list[str]:
        return []

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        record = ctx.adapters.named(self.name)
        return _adapter_cost([record] if record else [])


@register_method
class GRPOTarget(TrainedBaseline):
    name = "grpo-target"
    description = "GRPO on the target's train split"


@register_method
class Merged(TrainedBaseline):
    name = "merged"
    description = "one adapter over every capability env"

    def targets(self, ctx: EvalContext) -> list[str]:
        return [a.name for a in ctx.adapters.of_kind(AdapterKind.CAPABILITY)]

    def cost(self, ctx: EvalContext) -> dict[str, Any]:  # it needed identification and synthesis too
        record = ctx.adapters.named(self.name)
        return _adapter_cost(
            [record] if record else [], analyst_calls=ctx.analyst_calls, extra_wall_s=ctx.pre_training_wall_s
        )


@register_method
class Summed(Method):
    name = "summed"
    description = "the capability adapters' weights added"

    def build(self, ctx: EvalContext) -> BuiltAgent:
        records = ctx.adapters.of_kind(AdapterKind.CAPABILITY)
        if len(records) < 2:
            raise Unavailable("summing needs two or more capability adapters")
        if not isinstance(ctx.backend, SumsAdapters):
            raise Unavailable(
                "adding adapters' weights needs a local policy (hf: or the embedded model); a server "
                "must serve the sum itself"
            )
        names = [a.name for a in records]
        ctx.backend.add_summed_adapter(self.name, names)
        return BuiltAgent("llm", {"adapter": self.name}, targets=names)

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        return Trace().cost(ctx)


@register_method
class Control(RoutedAdapters):
    name = "control"
    description = "adapters of unselected capabilities, routed alike"
    kind = AdapterKind.CONTROL
    missing = "no control adapter was trained ([train] control)"


@register_method
class GEPA(Method):
    name = "gepa"
    description = "the GEPA baseline's best instructions"

    def build(self, ctx: EvalContext) -> BuiltAgent:
        if ctx.gepa is None:
            raise Unavailable("the gepa stage did not run (add it to [run] stages)")
        return BuiltAgent("llm", {"instructions": ctx.gepa["best_prompt"]})

    def cost(self, ctx: EvalContext) -> dict[str, Any]:
        g = ctx.gepa or {}
        return {
            "train_rollouts": g.get("rollouts", 0),
            "analyst_calls": g.get("reflection_calls", 0),
            "wall_s": g.get("wall_s", 0.0),
        }


def policy_backend(model: str, adapters: AdapterSet, **server: Any) -> Any:
    """The policy with every trained adapter loaded under its name. An OpenAI-compatible
    server (vLLM) must already serve them under those names (``--lora-modules name=path``);
    ``server``: its ``base_url``/``api_key`` where they are not the environment's."""
    backend = make_backend(model, **server)
    if not is_chat_endpoint(model):
        for a in adapters.adapters:
            backend.load_adapter(a.name, a.adapter)
    return backend


def build_methods(
    names: list[str], ctx: EvalContext, say: Callable[[str], None] = print
) -> list[tuple[str, BuiltAgent, dict[str, Any]]]:
    """(name, agent, cost) of each method that this run can build, in ``names``
    order; the others are said and left out."""
    out = []
    for name in names:
        method = get_method(name)
        try:
            built = method.build(ctx)
        except Unavailable as exc:
            say(f"{name}: {exc}; left out of the table")
            continue
        out.append((name, built, method.cost(ctx)))
    return out
