"""What the synthesis analyst is shown: versioned templates filled from a capability and a target.

The templates live in ``prompts/<name>_<version>.md`` (``string.Template``
placeholders). Everything target-specific comes from the registry entry of the
target (its frozen ``tools.json``, any frozen files beside it) or from the
target run through the ordinary env API (policy text = the system prompt,
sample results = the oracle's tool results); nothing here names a benchmark.
This module builds text only: it never calls a model and never runs env code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.errors import TraceGymError
from trace_gym.prompts import prompt_text, render_prompt
from trace_gym.registry import EnvEntry, make_train
from trace_gym.rollout import replay_oracle
from trace_gym.sandbox import world
from trace_gym.sandbox.language import MODULES
from trace_gym.tools import load_frozen_tools

PROMPTS = Path(__file__).with_name("prompts")
TEMPLATE_VERSION = "v1"
TEMPLATES = ("generate", "repair", "calibrate", "contract")


def template_text(name: str, version: str = TEMPLATE_VERSION) -> str:
    return prompt_text(PROMPTS, name, version)


def template_hash(version: str = TEMPLATE_VERSION) -> str:
    """sha256 over every template of ``version``: what the provenance records."""
    digest = hashlib.sha256()
    for name in TEMPLATES:
        digest.update(name.encode() + b"\0" + template_text(name, version).encode() + b"\0")
    return digest.hexdigest()


def render(name: str, /, **values: Any) -> str:
    return render_prompt(PROMPTS, name, TEMPLATE_VERSION, **values)


@dataclass
class Capability:
    """One capability to synthesize an env for, with what identification saw of it."""

    name: str
    description: str
    evidence: list[str] = field(default_factory=list)
    """Quotes behind its LACKING labels."""
    trajectories: list[str] = field(default_factory=list)
    """Compacted failed trajectories where it was lacking."""


@dataclass
class TargetContext:
    """The target as the analyst sees it."""

    entry: EnvEntry
    tools: list[dict[str, Any]]
    policy: str
    tool_results: list[str]
    sources: list[str]
    """Where the policy and results came from (for the report)."""


def target_context(
    entry: EnvEntry, trajectories: list[Any] | None = None, *, samples: int = 8, per_result: int = 700
) -> TargetContext:
    """The target's frozen schemas, its policy text and real tool results.

    Policy and results come, in order of preference, from recorded trajectories
    of the target, from the target itself (reset, then its oracle's tool calls;
    skipped when its package is not installed), or from frozen text files in
    the target's registry folder (``policy.md``, ``*results*.json``)."""
    tools = load_frozen_tools(entry.tools_path)
    policy, results, sources = "", [], []
    for trajectory in trajectories or []:
        if not policy and trajectory.messages and trajectory.messages[0].role == "system":
            policy = trajectory.messages[0].content or ""
            sources.append("policy: the system prompt of a recorded trajectory")
        for i, m in enumerate(trajectory.messages):
            if m.role == "tool" and m.content and len(results) < samples:
                call = _call_of(trajectory.messages, i)
                results.append(f"{call} ->\n{m.content[:per_result]}")
    if results:
        sources.append("tool results: recorded trajectories")
    if not policy or not results:
        live_policy, live_results, why = _from_live_target(entry, samples, per_result)
        if live_policy and not policy:
            policy = live_policy
            sources.append(f"policy: {entry.id} reset")
        if live_results and not results:
            results = live_results
            sources.append(f"tool results: {entry.id} played by its oracle")
        if why:
            sources.append(why)
    if not policy and (entry.path / "policy.md").exists():
        policy = (entry.path / "policy.md").read_text(encoding="utf-8")
        sources.append("policy: frozen policy.md")
    shapes = result_shapes(entry.path / "results.json")
    if shapes:
        results.append(shapes)
        sources.append("result shapes: frozen results.json")
    return TargetContext(entry, tools, policy, results, sources)


def result_shapes(path: Path) -> str:
    """The target's frozen result shapes (``results.json``: per tool, text or a JSON
    object's fields) as a short listing; "" when the target has none."""
    if not path.exists():
        return ""
    try:
        frozen = json.loads(path.read_text(encoding="utf-8"))
        lines = ["Result shapes (every field must be present; null where there is no value):"]
        for name, shape in sorted(frozen.get("tools", {}).items()):
            schema = shape.get("schema") or {}
            if shape.get("format") == "json" and schema.get("properties"):
                lines.append(f"- {name}: JSON {schema.get('title') or 'object'} with {', '.join(schema['properties'])}")
            else:
                lines.append(f"- {name}: {shape.get('format', 'text')}")
        if frozen.get("error_prefix"):
            lines.append(f"Errors start with {frozen['error_prefix']!r}.")
        return "\n".join(lines)
    except (ValueError, AttributeError, TypeError):
        return ""


def _call_of(messages: list[Any], tool_index: int) -> str:
    tool = messages[tool_index]
    for m in reversed(messages[:tool_index]):
        for call in m.tool_calls or []:
            if call.id == tool.tool_call_id:
                return f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
    return tool.name or "tool"


def _from_live_target(entry: EnvEntry, samples: int, per_result: int) -> tuple[str, list[str], str]:
    """Reset the target and replay its oracle's tool calls; ("", [], why) where it cannot run."""
    try:  # the analyst sees the train split's tool results, never the held-out tasks evaluation scores
        env, _ = make_train(entry.id)
    except (TraceGymError, ImportError) as exc:
        return "", [], f"the live target could not be made ({str(exc).splitlines()[0][:120]})"
    results: list[str] = []
    shown: dict[str, int] = {}
    policy = ""
    try:
        for seed in range(6):
            _, info = env.reset(seed=seed)
            policy = policy or info.get("system_prompt", "")
            for parsed, obs, _ in replay_oracle(env):
                if not parsed.is_tool_call:
                    continue
                call = parsed.tool_calls[0]
                if shown.get(call.name, 0) < 2:  # a variety of tools rather than one tool's results again
                    shown[call.name] = shown.get(call.name, 0) + 1
                    results.append(
                        f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)}) ->\n{obs[:per_result]}"
                    )
                if len(results) >= samples:
                    break
            if len(results) >= samples:
                break
    except TraceGymError as exc:
        return policy, results, f"the live target stopped early ({str(exc).splitlines()[0][:120]})"
    finally:
        env.close()
    return policy, results, ""


WORLD_KITS = {
    "trace/tau2-retail-v0": (
        "retail_",
        ("CANCEL_REASONS", "CANCEL_SAID", "ADDRESS_FIELDS", "RETAIL_ID_LISTS"),
        ("called", "before", "logged_in", "read_ids", "figures", "script", "graded"),
    ),
    "trace/tau2-airline-v0": (
        "airline_",
        ("CABINS", "MEMBERSHIPS", "FLIGHT_STATUSES", "AIRLINE_TODAY", "AIRPORTS"),
        ("called", "before", "figures", "script", "graded"),
    ),
}
"""The targets the world kit (``sandbox/world.py``) builds records for: the prefix of their
functions, the names of the kit's data about them, and the kit's other functions that
serve their envs (``logged_in`` reads retail's login calls: not airline's)."""


def world_kit_text(target: str) -> str:
    """What the generation prompt says about the world kit for ``target``: each of its
    functions (the target's and the others it serves, such as ``script`` and ``graded``)
    with its signature and docstring, read from the kit itself, and the kit's data about
    the target."""
    if target not in WORLD_KITS:
        return f"It has nothing for {target} yet: build the records yourself, with every field the results above show."
    prefix, data, shared = WORLD_KITS[target]
    lines = [f"For {target} (each `seed` an int drawn from your rng: `rng.randrange(2**31)`):"]
    for name in sorted(vars(world), key=lambda n: (not n.startswith(prefix), n)):
        value = getattr(world, name)
        mine = inspect.isfunction(value) and value.__module__ == world.__name__
        if mine and (name.startswith(prefix) or name in shared):
            doc = " ".join((inspect.getdoc(value) or "").split())
            lines.append(f"   - `world.{name}{inspect.signature(value)}`: {doc}")
    shown = {n: dict(v) if isinstance(v := getattr(world, n), Mapping) else v for n in data}  # (not mappingproxy(...))
    lines.append(f"   Its data: {', '.join(f'`world.{n}` = {v!r}' for n, v in shown.items())}.")
    tools = ", ".join(getattr(world, prefix.upper() + "TOOLS"))
    lines.append(f"   It plays {tools}; answer other tools yourself.")
    return "\n".join(lines)


def generation_prompt(capability: Capability, context: TargetContext) -> str:
    tools = json.dumps(context.tools, indent=1, ensure_ascii=False)
    return render(
        "generate",
        target=context.entry.id,
        capability_name=capability.name,
        capability_description=capability.description,
        evidence="\n".join(f"- {q}" for q in capability.evidence) or "(none recorded)",
        trajectories="\n\n".join(capability.trajectories) or "(none given)",
        policy=context.policy.strip() or "(not available)",
        tools=tools,
        tool_results="\n\n".join(context.tool_results) or "(not available: follow the schemas' descriptions)",
        contract=template_text("contract"),
        allowed_imports="; ".join(
            f"{m} ({', '.join(sorted(names))})"
            for m, names in sorted(MODULES.items())
            if m != "world" or context.entry.id in WORLD_KITS  # the kit only where it has this target's records
        ),
        world_kit=world_kit_text(context.entry.id),
    )
