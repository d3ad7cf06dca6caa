"""Registry envs for TRL's own trainer: ``GRPOTrainer(environment_factory=...)``.

TRL turns the public methods of an environment object into the model's tools,
calls ``reset(**row)`` before each rollout and ``get_reward()`` after it. A
registry env states its tools as OpenAI schemas (``info["tools"]``), so
``environment_factory(env_id)`` builds a class with one method per tool whose
signature and docstring give TRL that schema (nested objects lose their inner
fields: TRL reads Python type hints); a call plays the tool in the env (in its
sandbox, for a synthesized env) and returns what the env answered.
``dataset(env_id, seeds)`` gives the rows: the env's own system prompt and first
message for each seed (or task), with the seed that ``reset`` replays.

    from trl import GRPOConfig, GRPOTrainer
    from trace_gym.trl_environment import dataset, environment_factory

    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=dataset("trace/tau2-retail-v0", range(64)),
                          environment_factory=environment_factory("trace/tau2-retail-v0"))

What TRL's loop cannot do, this path does not: a dialogue. TRL ends a rollout at
the model's first plain-text reply, so the env's user never answers; ``get_reward``
ends the episode there (``agent_stop``) and the env scores what was done, as its
rules score an agent that stops. ``trace-gym train`` plays the whole dialogue.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterable
from typing import Any

from .actions import format_tool_call
from .errors import TraceGymError

TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict}


def _annotation(schema: dict[str, Any]) -> Any:
    if schema.get("type") == "array":
        inner = TYPES.get((schema.get("items") or {}).get("type"))
        return list[inner] if inner else list
    return TYPES.get(schema.get("type"), str)


def _tool_method(schema: dict[str, Any]) -> Any:
    """A method ``name(self, **arguments)`` whose signature, type hints and docstring
    say ``schema`` as TRL (transformers' ``get_json_schema``) reads them."""
    function = schema.get("function", schema)
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])

    def call(self: Any, **arguments: Any) -> str:
        return self._play(name, arguments)

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    for arg, spec in properties.items():
        hint = _annotation(spec)
        annotations[arg] = hint if arg in required else hint | None
        signature.append(
            inspect.Parameter(
                arg,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if arg in required else None,
                annotation=annotations[arg],
            )
        )
        description = " ".join(str(spec.get("description") or arg).split())
        lines.append(f"    {arg}: {description}")
    annotations["return"] = str
    call.__name__ = call.__qualname__ = name
    call.__signature__ = inspect.Signature(signature, return_annotation=str)
    call.__annotations__ = annotations
    summary = " ".join(str(function.get("description") or name).split())
    call.__doc__ = summary + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    return call


class RegistryToolEnv:
    """One registry env as TRL's environment object (``environment_factory`` makes the
    class of an env id; each instance holds one env, reset for every rollout)."""

    env_id: str = ""
    make_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self._env = _make(self.env_id, self.make_kwargs)
        self._reward: float | None = None
        weakref.finalize(self, self._env.close)  # (no public close: TRL would offer it to the model as a tool)

    def reset(self, seed: int | None = None, task_id: str | None = None, **_: Any) -> None:
        """Start the episode of ``seed`` (and ``task_id``, a target's task); the row's
        prompt already holds its system prompt and first message, so nothing is added."""
        self._env.reset(seed=seed, options={"task_id": task_id} if task_id is not None else None)
        self._reward = None

    def get_reward(self) -> float:
        """The env's reward for the episode; one the model stopped is ended here (``agent_stop``)."""
        if self._reward is None:
            self._reward = self._env.unwrapped.end("agent_stop")
        return float(self._reward)

    def _play(self, name: str, arguments: dict[str, Any]) -> str:
        arguments = {k: v for k, v in arguments.items() if v is not None}  # an optional argument left out
        observation, reward, terminated, truncated, _ = self._env.step(format_tool_call(name, arguments))
        if (terminated or truncated) and self._reward is None:
            self._reward = reward
        return observation


def _make(env_id: str, make_kwargs: dict[str, Any]) -> Any:
    """The env as training plays it: a target on its train split unless ``split`` names
    another, never the held-out one (evaluation's alone)."""
    from .registry import HELD_OUT_SPLIT, make, make_train

    if make_kwargs.get("split") == HELD_OUT_SPLIT:
        raise TraceGymError(
            f"{env_id}: split='{HELD_OUT_SPLIT}' is the held-out split, played by evaluation alone; "
            "leave split out to train on the train split"
        )
    return make(env_id, **make_kwargs) if "split" in make_kwargs else make_train(env_id, **make_kwargs)[0]


def tool_methods(env_id: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One method per tool schema, by name; refuses, in one line, a tool name that
    cannot be a Python method or that TRL reserves."""
    methods = {}
    for schema in tools:
        method = _tool_method(schema)
        if not method.__name__.isidentifier() or method.__name__ in ("reset", "get_reward"):
            raise TraceGymError(f"{env_id}: tool '{method.__name__}' cannot be a method of TRL's environment object")
        methods[method.__name__] = method
    return methods


def environment_factory(env_id: str, **make_kwargs: Any) -> type[RegistryToolEnv]:
    """The environment class TRL's ``GRPOTrainer(environment_factory=...)`` takes for
    ``env_id`` (``make_kwargs``: ``registry.make``'s; a target plays its train split,
    never the held-out one), with one method per tool of the env."""
    env = _make(env_id, make_kwargs)
    try:
        _, info = env.reset(seed=0)
        tools = info.get("tools") or []
    finally:
        env.close()
    methods = tool_methods(env_id, tools)
    name = "".join(part.capitalize() for part in env_id.split("/")[-1].replace("-", "_").split("_")) or "Env"
    return type(name, (RegistryToolEnv,), {"env_id": env_id, "make_kwargs": dict(make_kwargs), **methods})


def dataset(env_id: str, seeds: Iterable[int], **make_kwargs: Any) -> list[dict[str, Any]]:
    """TRL's rows for ``env_id``: per seed, ``prompt`` (the env's system prompt and first
    message, as its episode opens) and ``seed``; a target's rows also name the task, so
    ``reset`` replays the same one. A target plays its train split; the held-out one
    is refused, as in every stage but evaluation."""
    from .env import opening_messages

    env = _make(env_id, make_kwargs)
    rows = []
    try:
        for seed in seeds:
            observation, info = env.reset(seed=int(seed))
            row = {"prompt": opening_messages(observation, info), "seed": int(seed)}
            if info.get("task_id") is not None:
                row["task_id"] = str(info["task_id"])
            rows.append(row)
    finally:
        env.close()
    return rows
