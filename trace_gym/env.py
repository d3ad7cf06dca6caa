"""The text environment API every trace-gym env speaks (targets and synthesized).

``reset(seed, options) -> (obs, info)`` with ``info["system_prompt"]``,
``info["tools"]`` (OpenAI function schemas) and ``info["task_id"]``;
``step(action_text) -> (obs, reward, terminated, truncated, info)``. The action
is the agent's raw text, parsed here by :func:`trace_gym.actions.parse_action`;
a malformed call is answered with an observation that says what was wrong,
never an exception. The reward arrives when the episode ends, with its
components in ``info["reward_info"]``.

Subclasses implement a handful of hooks (``_start``, ``_call_tool``,
``_reply``, ``_score``); the bookkeeping (transcript, step limit, the
after-the-end guard) lives here once.
"""

from __future__ import annotations

import multiprocessing
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import shared_memory

from .actions import ActionKind, ParsedAction, ToolCall, parse_action
from .errors import EpisodeStateError, TargetContractError
from .tools import ToolSchema, schemas_problem, tool_name
from .trajectory import Message, ToolCallRecord

MAX_TEXT = 1_000_000
ENV_FEEDBACK = "environment"  # the `name` of user-role messages the env itself wrote


class AnyText(spaces.Text):
    """A ``gymnasium.spaces.Text`` that holds any Unicode string up to ``max_length``.

    ``spaces.Text`` checks membership against a charset (alphanumerics by
    default); agent and tool text is JSON, punctuation and any language.
    """

    def __init__(self, max_length: int = MAX_TEXT):
        super().__init__(max_length=max_length, min_length=0)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length})"


# Async vector envs pass observations through shared memory. Gymnasium writes a Text
# observation there as indices into its charset, which any Unicode text is not in,
# and reads it back once: an AnyText slot holds the text's length, then its code
# points, and what the vector env returns reads them at the time (a copy: a tuple).
@shared_memory.create_shared_memory.register(AnyText)
def _create_any_text_memory(space: AnyText, n: int = 1, ctx: Any = multiprocessing) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


@shared_memory.write_to_shared_memory.register(AnyText)
def _write_any_text(space: AnyText, index: int, value: str, memory: Any) -> None:
    size = space.max_length + 1
    slot = np.frombuffer(memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size]
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.int32)
    slot[0] = len(codes)
    slot[1 : 1 + len(codes)] = codes


class SharedTexts(Sequence):
    """The texts of a vector env's shared memory, as they are when read."""

    def __init__(self, space: AnyText, memory: Any, n: int):
        self._rows = np.frombuffer(memory.get_obj(), dtype=np.int32).reshape((n, space.max_length + 1))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        return row[1 : 1 + int(row[0])].tobytes().decode("utf-32-le")

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: Any) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self))


@shared_memory.read_from_shared_memory.register(AnyText)
def _read_any_text(space: AnyText, memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, memory, n)


@dataclass
class ToolResult:
    content: str
    error: bool = False
    done: bool = False  # the env ended the episode with this call
    reason: str | None = None  # why it ended (the target's own name for it); "env_done" if unsaid


@dataclass
class Start:
    """What ``_start`` returns: the first observation and the episode's framing."""

    observation: str
    system_prompt: str
    task_id: str | None = None
    prelude: list[Message] = field(default_factory=list)  # e.g. the agent's greeting
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """The other side's answer to an agent message."""

    content: str
    done: bool = False
    reason: str | None = None
    from_user: bool = True  # False when the agent itself ended the episode


@dataclass
class Score:
    reward: float
    components: dict[str, float]
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_info(self, termination_reason: str | None) -> dict[str, Any]:
        failed = sorted(name for name, value in self.components.items() if value < 1.0)
        return {
            "reward": self.reward,
            "components": dict(self.components),
            "failed_components": failed,
            "reason": self.reason,
            "termination_reason": termination_reason,
            **({"details": self.details} if self.details else {}),
        }


class TextEnv(gym.Env[str, str]):
    """Base class of trace-gym's Gymnasium text environments."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    observation_space = AnyText()
    action_space = AnyText()

    def __init__(self, *, max_steps: int = 50, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r}: this env renders {self.metadata['render_modes']} (or None)")
        self.max_steps = int(max_steps)
        self.render_mode = render_mode
        self.messages: list[Message] = []
        self._tools: list[ToolSchema] = []
        self._steps = 0
        self._done = True
        self._started = False
        self._termination_reason: str | None = None
        self._reward_info: dict[str, Any] | None = None
        self._task_id: str | None = None
        self._call_counter = 0
        self._reported = 0  # transcript messages already handed out in info["messages"]

    # --- hooks for subclasses -------------------------------------------------
    @property
    def tools(self) -> list[ToolSchema]:
        """The OpenAI function schemas the agent sees."""
        return self._tools

    def _start(self, seed: int | None, options: dict[str, Any]) -> Start:
        raise NotImplementedError

    def _call_tool(self, call: ToolCall, call_id: str) -> ToolResult:
        raise NotImplementedError

    def _call_tools(self, calls: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        """All calls of one agent turn, in order; override to see them together."""
        return [self._call_tool(call, call_id) for call, call_id in calls]

    def _reply(self, content: str) -> Reply:
        raise NotImplementedError

    def _score(self, termination_reason: str) -> Score:
        raise NotImplementedError

    def oracle_actions(self) -> list[str] | None:
        """Action texts that solve the current task, if the env knows them."""
        return None

    # --- Gymnasium API ----------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        start = self._start(seed, dict(options or {}))
        self._steps = 0
        self._done = False
        self._started = True
        self._termination_reason = None
        self._reward_info = None
        self._task_id = start.task_id
        self._call_counter = 0
        self._reported = 0
        self.messages = [Message(role="system", content=start.system_prompt), *start.prelude]
        self.messages.append(Message(role="user", content=start.observation))
        info = {
            "system_prompt": start.system_prompt,
            "tools": self.tools,
            "task_id": start.task_id,
            "max_steps": self.max_steps,
            **start.info,
            "messages": self._new_messages(),
        }
        return start.observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise EpisodeStateError("call reset() before step()")
        if self._done:
            info = {"reward_info": self._reward_info, "after_end": True, "messages": []}
            return "The episode is over; call reset() to start another.", 0.0, True, False, info
        self._steps += 1
        parsed = parse_action(action)
        info: dict[str, Any] = {"action_kind": parsed.kind}
        reply: Reply | None
        if parsed.kind == ActionKind.MALFORMED:
            observation = self._malformed_observation(parsed)
            self.messages.append(Message(role="assistant", content=action, raw=action, error=True))
            self.messages.append(Message(role="user", name=ENV_FEEDBACK, content=observation))
            reply = None
        elif parsed.kind == ActionKind.TOOL_CALLS:
            observation, results = self._run_tool_calls(parsed, action)
            info["tool_results"] = results
            ended = next((r for r in results if r["done"]), None)
            reply = (
                Reply(content=observation, done=True, reason=ended.get("reason") or "env_done", from_user=False)
                if ended
                else None
            )
        else:
            self.messages.append(Message(role="assistant", content=parsed.content, raw=action))
            reply = self._reply(parsed.content)
            if reply.from_user:
                self.messages.append(Message(role="user", content=reply.content))
            observation = reply.content

        ended_by = (reply.reason or "done") if reply and reply.done else None
        # "max_steps" is a time limit whoever counts it (here: agent actions; a target may count its own way)
        truncated = ended_by == "max_steps" or (ended_by is None and self._steps >= self.max_steps)
        terminated = ended_by is not None and not truncated
        reward = 0.0
        if terminated or truncated:
            reason = ended_by or "max_steps"
            reward = self._finish(reason)
            info["reward_info"] = self._reward_info
            info["termination_reason"] = reason
        info["messages"] = self._new_messages()
        return observation, reward, terminated, truncated, info

    def _new_messages(self) -> list[dict[str, Any]]:
        """What the agent's conversation gained since the last reset or step (OpenAI format)."""
        new = agent_conversation(self.messages[self._reported :])
        self._reported = len(self.messages)
        return new

    def conversation(self) -> list[dict[str, Any]]:
        """The transcript as the agent sees it: what a model is conditioned on."""
        return agent_conversation(self.messages)

    def render(self) -> str | None:
        """The transcript as text with ``render_mode="ansi"``; without a render mode,
        None and a warning, as Gymnasium asks."""
        if self.render_mode is None:
            gym.logger.warn(
                "render() called without a render mode: make the env with render_mode='ansi' "
                f"(e.g. gym.make({self.spec.id if self.spec else '...'!r}, render_mode='ansi'))"
            )
            return None
        return "\n".join(f"[{m.speaker}] {m.text()}" for m in self.messages)

    # --- shared mechanics -------------------------------------------------------
    @property
    def steps(self) -> int:
        return self._steps

    @property
    def termination_reason(self) -> str | None:
        return self._termination_reason

    @property
    def reward_info(self) -> dict[str, Any] | None:
        return self._reward_info

    @property
    def task_id(self) -> str | None:
        return self._task_id

    def end(self, reason: str = "agent_error") -> float:
        """End the episode before the env or its step limit did (an agent that gave
        up, a wall-time limit): the env scores what was done so far, as it scores an
        episode cut at its step limit, and says why in ``reward_info``. A target
        scores it by its own rules (τ² gives an ``AGENT_ERROR`` ending 0). Returns
        the reward; an episode already over keeps the reward it ended with."""
        if not self._started:
            raise EpisodeStateError("call reset() before end()")
        if self._done:
            return float((self._reward_info or {}).get("reward") or 0.0)
        return self._finish(reason)

    def _finish(self, reason: str) -> float:
        self._done = True
        self._termination_reason = reason
        score = self._score(reason)
        self._reward_info = score.as_info(reason)
        return float(score.reward)

    def _next_call_id(self) -> str:
        self._call_counter += 1
        return f"tg_call_{self._call_counter}"  # a prefix no benchmark's seeded history uses

    def _run_tool_calls(self, parsed: ParsedAction, raw: str) -> tuple[str, list[dict[str, Any]]]:
        records = [
            ToolCallRecord(id=self._next_call_id(), name=c.name, arguments=c.arguments) for c in parsed.tool_calls
        ]
        # The agent's own text around its calls stays in the transcript: a model is conditioned on it.
        self.messages.append(Message(role="assistant", content=parsed.thought or None, tool_calls=records, raw=raw))
        results = []
        outcomes = self._call_tools([(call, record.id) for call, record in zip(parsed.tool_calls, records)])
        for call, record, result in zip(parsed.tool_calls, records, outcomes):
            self.messages.append(
                Message(role="tool", tool_call_id=record.id, name=call.name, content=result.content, error=result.error)
            )
            results.append(
                {
                    "id": record.id,
                    "name": call.name,
                    "content": result.content,
                    "error": result.error,
                    "done": result.done,
                    **({"reason": result.reason} if result.reason else {}),
                }
            )
        return render_tool_results(results), results

    def _malformed_observation(self, parsed: ParsedAction) -> str:
        names = ", ".join(tool_name(t) for t in self.tools[:50])
        return (
            f"Error: {parsed.error}. A tool call is a JSON object "
            '{"name": "<tool>", "arguments": {...}}, alone or inside <tool_call>...</tool_call>; '
            f"any other text is a message to the user. Tools: {names}."
        )


def check_target_reset(core: Any, observation: Any, info: dict[str, Any]) -> None:
    """What a target that is not a trace-gym env hands the agent at reset, held to
    docs/targets.md: text, and its tools as OpenAI function schemas in ``info``."""
    if isinstance(core, TextEnv):
        return
    where = f"{type(core).__name__}.reset"
    if not isinstance(observation, str):
        raise TargetContractError(f"{where} returned a {type(observation).__name__}, not text (docs/targets.md)")
    problem = schemas_problem(info.get("tools"))
    if problem is not None:
        raise TargetContractError(f"{where}: info['tools']: {problem} (docs/targets.md)")


REWARD_SLACK = 1e-6  # a sum of float parts may land a rounding step outside [0, 1]


def check_target_reward(core: Any, reward: Any) -> float:
    """A target's reward at the end of an episode: a number in [0, 1] (docs/targets.md),
    rounding error of its float parts forgiven (and clipped)."""
    if isinstance(core, TextEnv):
        return float(reward)
    try:
        value = float("nan") if isinstance(reward, (str, bytes)) else float(reward)
    except (TypeError, ValueError):
        value = float("nan")
    if not -REWARD_SLACK <= value <= 1.0 + REWARD_SLACK:  # (NaN fails both)
        raise TargetContractError(
            f"{type(core).__name__}.step ended an episode with reward {reward!r}, not a number in [0, 1] "
            "(docs/targets.md)"
        )
    return min(max(value, 0.0), 1.0)


def opening_messages(observation: str, info: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent's conversation after ``reset``: ``info["messages"]`` (OpenAI format) when
    the env gives it, as every trace-gym env does; else the env's system prompt
    (``info["system_prompt"]``, if any) and the observation as the user's message."""
    if isinstance(info.get("messages"), list):
        return [dict(m) for m in info["messages"]]
    system = [{"role": "system", "content": info["system_prompt"]}] if info.get("system_prompt") else []
    return [*system, {"role": "user", "content": observation}]


def turn_messages(action: str, observation: str, info: dict[str, Any]) -> list[dict[str, Any]]:
    """What one ``step(action)`` added to the agent's conversation: ``info["messages"]``
    when the env gives it (the agent's turn, then tool results and replies, in the roles
    the env knows). Else the action read with trace-gym's parser: tool calls are the
    agent's calls and the observation their result (several calls: one answer, given as
    the last call's); anything else is the agent's text and the observation the user's."""
    if isinstance(info.get("messages"), list):
        return [dict(m) for m in info["messages"]]
    parsed = parse_action(action)
    if parsed.kind == ActionKind.TOOL_CALLS:
        stem = f"call_{zlib.crc32(action.encode()):08x}"
        records = [
            ToolCallRecord(id=f"{stem}_{n}", name=c.name, arguments=c.arguments)
            for n, c in enumerate(parsed.tool_calls)
        ]
        results = [
            {
                "role": "tool",
                "tool_call_id": r.id,
                "content": observation if n == len(records) - 1 else "(answered with the last call of this turn)",
            }
            for n, r in enumerate(records)
        ]
        return [
            {"role": "assistant", "content": parsed.thought or None, "tool_calls": [r.to_openai() for r in records]},
            *results,
        ]
    return [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]


def agent_conversation(messages: list[Message]) -> list[dict[str, Any]]:
    """Transcript messages as the agent sees them, in OpenAI chat format: one
    tool message per call, the agent's text kept on tool-call turns; the user's
    own tool traffic (τ²-telecom's user-side calls) is the user's, not shown."""
    return [m.to_openai() for m in messages if m.requestor != "user"]


def render_tool_results(results: list[dict[str, Any]]) -> str:
    """The observation for a turn of tool calls: the result itself for one call,
    one tagged block per call for several."""
    if len(results) == 1:
        return results[0]["content"]
    return "\n".join(
        f'<tool_response name="{r["name"]}" id="{r["id"]}">\n{r["content"]}\n</tool_response>' for r in results
    )
