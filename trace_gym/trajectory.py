"""The trajectory record: one episode of one agent in one environment.

Messages follow the OpenAI chat format (system, user, assistant with
``tool_calls``, tool with ``tool_call_id``) so that a trajectory can be fed to
any chat model or trainer as it is. What the agent literally wrote is kept in
``raw`` beside the parsed form, so that parsing can be audited later.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SUCCESS_THRESHOLD = 1.0 - 1e-6


class ToolCallRecord(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCallRecord] | None = None
    tool_call_id: str | None = None
    name: str | None = Field(default=None, description="Tool name, on tool messages.")
    raw: str | None = Field(default=None, description="The agent's raw text, on assistant turns.")
    error: bool = Field(default=False, description="On tool messages: the tool reported an error.")
    requestor: Literal["assistant", "user"] = Field(
        default="assistant", description="Who made a tool call: user-side tools exist in τ²-telecom."
    )

    @property
    def speaker(self) -> str:
        """Who speaks: the role, and a tool result's tool (``tool get_order``)."""
        return f"tool {self.name}" if self.role == "tool" and self.name else self.role

    def text(self, *, one_line: bool = False) -> str:
        """What the message says as a reader sees it: its content, then ``-> name(args)``
        for its tool calls; ``one_line`` folds newlines into spaces."""
        body = self.content or ""
        if one_line:
            body = body.replace("\n", " ")
        if self.tool_calls:
            calls = "; ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in self.tool_calls)
            body = f"{body} -> {calls}" if body else f"-> {calls}"
        return body

    def to_openai(self) -> dict[str, Any]:
        """This message as an OpenAI chat API message (our own fields dropped)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
        return out

    @classmethod
    def from_openai(cls, message: dict[str, Any]) -> "Message":
        """An OpenAI chat message as a transcript message (what an env that keeps no
        transcript of its own hands out in ``info["messages"]``)."""
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"a message of role {role!r} (need system, user, assistant or tool)")
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = []
        for n, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    arguments = {"_raw": arguments}
            calls.append(
                ToolCallRecord(
                    id=str(call.get("id") or f"call_{n}"),
                    name=str(function.get("name") or ""),
                    arguments=arguments if isinstance(arguments, dict) else {"_raw": arguments},
                )
            )
        return cls(
            role=role,
            content=None if content is None else str(content),
            tool_calls=calls or None,
            tool_call_id=message.get("tool_call_id"),
            name=message.get("name"),
            raw=str(content) if role == "assistant" and content is not None else None,
        )


class Trajectory(BaseModel):
    """One finished episode. ``episode_id`` is unique within a trajectory file."""

    schema_version: Literal[1] = 1
    episode_id: str
    env_id: str
    task_id: str | None = None
    seed: int | None = None
    sample: int = 0
    agent: str
    model: str | None = None
    adapter: str | None = None
    messages: list[Message]
    reward: float
    reward_info: dict[str, Any] = Field(default_factory=dict)
    terminated: bool
    truncated: bool
    termination_reason: str | None = None
    steps: int
    started_at: str
    wall_s: float
    agent_s: float = 0.0
    env_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = Field(default=None, description="Why the episode was aborted, if it was.")
    agent_info: dict[str, Any] = Field(
        default_factory=dict, description="What the agent reports of itself (e.g. planted deficits)."
    )

    @property
    def success(self) -> bool:
        return self.reward >= SUCCESS_THRESHOLD

    def first_user_message(self) -> str:
        """What the user opened with (the task as the agent first hears it); "" if nothing."""
        return next((m.content for m in self.messages if m.role == "user" and m.content), "")

    def transcript(self, limit: int, *, per_message: int = 400, keep: Literal["start", "end"] = "start") -> str:
        """The episode as a model reads it (an analyst, GEPA's reflection): one line per
        message after the system prompt, ``[index] role: text -> calls`` (a tool's result
        names its tool), each cut to ``per_message`` characters. Past ``limit`` characters
        the start is kept, or the end (where an episode goes wrong)."""
        lines = []
        for i, m in enumerate(self.messages):
            if m.role == "system":
                continue
            body = m.text(one_line=True)
            if len(body) > per_message:
                body = body[:per_message] + "..."
            lines.append(f"[{i}] {m.speaker}: {body}")
        text = "\n".join(lines)
        if len(text) <= limit:
            return text
        cut = "[... truncated]"
        room = limit - len(cut) - 1
        if room <= 0:  # no room for any of the text beside the marker
            return cut[: max(limit, 0)]
        return f"{text[:room]}\n{cut}" if keep == "start" else f"{cut}\n{text[len(text) - room :]}"

    def agent_tool_calls(self) -> list[ToolCallRecord]:
        return [
            call
            for m in self.messages
            if m.role == "assistant" and m.tool_calls and m.requestor == "assistant"
            for call in m.tool_calls
        ]


def episode_id(env_id: str, task_id: str | None, sample: int, seed: int | None = None) -> str:
    """The key that identifies an episode in a run, and lets a run resume."""
    task = task_id if task_id is not None else f"seed={seed}"
    return f"{env_id}|{task}|{sample}"
