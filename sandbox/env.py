"""SandboxedEnv: a registry env whose env.py runs only inside a sandbox worker.

The host never imports env.py. It asks the worker for ``TOOLS``, checks that
every name is a tool of the target, and shows the agent the target's frozen
schemas for those names, byte for byte: the env code cannot change what the
agent sees of the interface. Calls to a tool outside ``TOOLS``, or with an
argument name the schema lacks or without a required one, are answered here in
the target's own words (``[call_errors]`` of its manifest): env code only ever
sees well-named calls and judges their values. An exception raised by env code
inside a tool call is answered as the target answers one (τ²: ``Error:
<message>``), its traceback kept in ``tool_exceptions``; an exception anywhere
else (reset, reward, a message step) stays an error. Actions reach the env as JSON data (``{"type":
"tool_call", ...}`` or ``{"type": "message", ...}``), never as code, and the
reward is computed by the env inside the sandbox, out of the agent's reach.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trace_gym.actions import ToolCall, format_tool_call
from trace_gym.env import Reply, Score, Start, TextEnv, ToolResult
from trace_gym.errors import EnvContractError
from trace_gym.registry import get_entry, read_manifest
from trace_gym.tools import call_error, load_frozen_tools, select_tools, tool_name

from .backends import Backend, Limits
from .errors import SandboxEnvError
from .host import SandboxWorker

DEFAULT_MAX_STEPS = 20
MAX_OBSERVATION_CHARS = 20_000
"""Longest text an env may hand the agent at once (an observation, a system prompt,
a user message); longer is cut here, and says so. τ²-retail's longest tool result
is about 3,000 characters."""
MAX_REWARD_COMPONENTS = 32
MAX_COMPONENT_NAME = 64


class SandboxedEnv(TextEnv):
    """Args:
    path: the env folder (manifest.toml, env.py).
    backend: sandbox backend (auto, docker, bwrap; subprocess only for trusted code).
    hint: pass ``hint=True`` to the env's reset (expert guidance in the system prompt).
    level: the difficulty level to reset at, for an env that declares ``LEVELS``
        (0 easiest .. LEVELS - 1 hardest); None: the env's own default. Calibration
        moves it until the policy being trained is in band.
    limits: sandbox resource limits.
    max_observation_chars: longest text the env may hand the agent at once; longer
        is cut, with a note saying so (env text reaches a model's context and the
        training logs, whatever the env sends).
    """

    def __init__(
        self,
        path: str | Path,
        backend: Backend | str = "auto",
        hint: bool = False,
        level: int | None = None,
        limits: Limits | None = None,
        max_steps: int | None = None,
        render_mode: str | None = None,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
    ):
        self.path = Path(path)
        self.max_observation_chars = max_observation_chars
        self.entry = read_manifest(self.path)
        source = (self.path / "env.py").read_text(encoding="utf-8")
        target = get_entry(self.entry.target)
        self.target_tools = load_frozen_tools(target.tools_path)
        self.call_errors = target.call_error_style()
        self.worker = SandboxWorker(source, backend=backend, limits=limits, filename=f"{self.path.name}/env.py")
        try:
            names = self._declared_tools(self.worker.info.get("tools"))
            declared_steps = self.worker.info.get("max_steps")
            steps = max_steps or (
                declared_steps if isinstance(declared_steps, int) and declared_steps > 0 else DEFAULT_MAX_STEPS
            )
        except EnvContractError:
            self.worker.close()
            raise
        super().__init__(max_steps=steps, render_mode=render_mode)
        self._tools = select_tools(self.target_tools, names)
        self.hint = hint
        self.levels: int | None = self.worker.info.get("levels")
        try:
            self.level = self._check_level(level)
        except EnvContractError:
            self.worker.close()
            raise
        self._seed: int | None = None
        self.tool_exceptions: list[dict[str, Any]] = []

    def _declared_tools(self, names: Any) -> list[str]:
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise EnvContractError(f"{self.path.name}/env.py must define TOOLS, a non-empty list of tool names")
        known = {tool_name(t) for t in self.target_tools}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise EnvContractError(
                f"{self.path.name}/env.py declares tools that {self.entry.target} does not have: {', '.join(unknown)}"
            )
        return list(dict.fromkeys(names))

    def _check_level(self, level: Any) -> int | None:
        if level is None:
            return None
        if not self.levels:
            raise EnvContractError(
                f"{self.path.name} has no difficulty levels (env.py declares no LEVELS); drop level={level!r}"
            )
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self.levels:
            raise EnvContractError(f"{self.path.name}: level must be an integer in 0..{self.levels - 1}, got {level!r}")
        return level

    # --- TextEnv hooks ------------------------------------------------------------
    def _start(self, seed: int | None, options: dict[str, Any]) -> Start:
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._seed = int(seed)
        hint = bool(options.get("hint", self.hint))
        level = self.level if options.get("level") is None else options["level"]
        if level is not None and level != self.level:
            level = self._check_level(level)
        result = self.worker.call("reset", seed=self._seed, hint=hint, **({} if level is None else {"level": level}))
        if not (
            isinstance(result, dict)
            and isinstance(result.get("system_prompt"), str)
            and isinstance(result.get("user_message"), str)
        ):
            raise EnvContractError(
                f"reset() must return {{'system_prompt': str, 'user_message': str}}, got {_short(result)}"
            )
        return Start(
            observation=self._bounded(result["user_message"], "user message"),
            system_prompt=self._bounded(result["system_prompt"], "system prompt"),
            task_id=f"seed-{self._seed}",
            info={"seed": self._seed, "hint": hint, "level": level, "capability": self.entry.capability.get("name")},
        )

    def _call_tools(self, calls: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        results: list[ToolResult] = []
        for call, _ in calls:
            if results and results[-1].done:
                results.append(ToolResult(content="Not run: the episode had ended.", error=True))
                continue
            wrong = call_error(self.tools, call.name, call.arguments, self.call_errors)
            if wrong is not None:  # answered here, as the target would: env code sees only well-named calls
                results.append(ToolResult(content=wrong, error=True))
                continue
            try:
                step = self._step({"type": "tool_call", "name": call.name, "arguments": call.arguments})
            except SandboxEnvError as exc:
                if exc.where != "step" or not self.worker.alive:
                    raise
                results.append(ToolResult(content=self._tool_exception(call, exc), error=True))
                continue
            results.append(ToolResult(content=step["observation"], done=step["done"]))
        return results

    def _tool_exception(self, call: ToolCall, exc: SandboxEnvError) -> str:
        """An exception raised inside a tool, answered as the target answers one
        (``[call_errors] tool_exception`` of its manifest); the traceback is kept
        in ``tool_exceptions`` for validation's evidence, never shown to the agent."""
        self.tool_exceptions.append(
            {
                "tool": call.name,
                "arguments": call.arguments,
                "exception": exc.exception_type,
                "message": exc.message,
                "traceback": exc.traceback,
            }
        )
        del self.tool_exceptions[:-100]
        return self.call_errors.tool_exception.format(
            message=exc.message, type=exc.exception_type, name=call.name, prefix=self.call_errors.prefix
        )

    def _reply(self, content: str) -> Reply:
        step = self._step({"type": "message", "content": content})
        return Reply(content=step["observation"], done=step["done"], reason="env_done")

    def _score(self, termination_reason: str) -> Score:
        result = self.worker.call("reward")
        return parse_reward(result)

    def oracle_actions(self) -> list[str] | None:
        if not self.worker.info.get("has_oracle"):
            return None
        actions = self.worker.call("oracle")
        if not isinstance(actions, list):
            raise EnvContractError(f"oracle() must return a list of actions, got {_short(actions)}")
        return [action_text(a) for a in actions]

    def close(self) -> None:
        self.worker.close()
        super().close()

    def _step(self, action: dict[str, Any]) -> dict[str, Any]:
        result = self.worker.call("step", action=action)
        if not (
            isinstance(result, dict)
            and isinstance(result.get("observation"), str)
            and isinstance(result.get("done"), bool)
        ):
            raise EnvContractError(f"step() must return {{'observation': str, 'done': bool}}, got {_short(result)}")
        return {**result, "observation": self._bounded(result["observation"], "observation")}

    def _bounded(self, text: str, what: str) -> str:
        """Env text as the agent may see it: at most ``max_observation_chars``."""
        limit = self.max_observation_chars
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n[trace-gym: this {what} was cut at {limit} characters; the env sent {len(text)}]"


def parse_reward(result: Any) -> Score:
    """A reward dict from env code, checked: a finite float in [0, 1] and float components."""
    if not isinstance(result, dict) or "reward" not in result:
        raise EnvContractError(
            f"reward() must return {{'reward': float, 'components': {{...}}, 'reason': str}}, got {_short(result)}"
        )
    reward = result["reward"]
    if (
        isinstance(reward, bool)
        or not isinstance(reward, (int, float))
        or not math.isfinite(reward)
        or not 0.0 <= reward <= 1.0
    ):
        raise EnvContractError(f"reward() returned reward={_short(reward)}; it must be a finite number in [0, 1]")
    components = result.get("components") or {}
    if isinstance(components, dict) and (
        len(components) > MAX_REWARD_COMPONENTS
        or any(isinstance(k, str) and len(k) > MAX_COMPONENT_NAME for k in components)
    ):
        raise EnvContractError(
            f"reward() returned {len(components)} components (names up to "
            f"{max((len(str(k)) for k in components), default=0)} characters); at most "
            f"{MAX_REWARD_COMPONENTS}, named in at most {MAX_COMPONENT_NAME} characters"
        )
    if not isinstance(components, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in components.items()
    ):
        raise EnvContractError(f"reward() components must map names to finite numbers, got {_short(components)}")
    return Score(
        reward=float(reward),
        components={k: float(v) for k, v in components.items()},
        reason=str(result.get("reason", ""))[:2000],
    )


def action_text(action: Any) -> str:
    """An action dict (the env contract's form) as the text an agent would write."""
    if (
        isinstance(action, dict)
        and action.get("type") == "tool_call"
        and isinstance(action.get("arguments") or {}, dict)
    ):
        return format_tool_call(str(action.get("name")), dict(action.get("arguments") or {}))
    if isinstance(action, dict) and action.get("type") == "message":
        return str(action.get("content", ""))
    raise EnvContractError(f"an oracle action must be a tool_call or message dict, got {_short(action)}")


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text[:200]
