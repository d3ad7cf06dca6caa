"""Parse an agent's raw text into tool calls or a message.

The one parser used by every environment and every agent, so that what an
agent means and what an env hears never differ. Accepted tool-call forms:

- a bare JSON object ``{"name": ..., "arguments": {...}}`` (``"parameters"``
  is accepted for ``"arguments"``, as Llama 3.x emits it; ``arguments`` may be
  a JSON-encoded string, as the OpenAI API returns it), or a JSON list of them;
- one or more ``<tool_call>...</tool_call>`` blocks (text around them is kept
  as the agent's thought but not sent to anyone);
- the same JSON inside a single fenced code block.

Anything else is a message to the user. Text that clearly tries to be a tool
call but is not valid becomes ``ActionKind.MALFORMED`` with an explanation that
the env returns as the observation: never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"^```(?:json|tool_call)?\s*\n?(.*?)\n?```$", re.DOTALL)


class ActionKind(StrEnum):
    """What an agent's text is; equal to its string."""

    TOOL_CALLS = "tool_calls"
    MESSAGE = "message"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedAction:
    kind: ActionKind
    tool_calls: tuple[ToolCall, ...] = ()
    content: str = ""
    error: str | None = None
    thought: str = field(default="", compare=False)

    @property
    def is_tool_call(self) -> bool:
        return self.kind == ActionKind.TOOL_CALLS


class _Malformed(ValueError):
    pass


def parse_action(text: str) -> ParsedAction:
    """Parse one agent turn. Never raises for any string input."""
    if not isinstance(text, str):
        return ParsedAction(kind=ActionKind.MALFORMED, error=f"an action must be text, got {type(text).__name__}")
    stripped = text.strip()
    if "<tool_call>" in stripped:
        blocks = _TOOL_CALL_BLOCK.findall(stripped)
        thought = _TOOL_CALL_BLOCK.sub("", stripped).replace("</tool_call>", "").strip()
        try:
            calls = [call for block in blocks for call in _calls_from_json_text(_cut_close(block.strip()))]
        except _Malformed as exc:
            return ParsedAction(kind=ActionKind.MALFORMED, error=f"invalid <tool_call> block: {exc}", thought=thought)
        if not calls:
            return ParsedAction(kind=ActionKind.MALFORMED, error="empty <tool_call> block", thought=thought)
        return ParsedAction(kind=ActionKind.TOOL_CALLS, tool_calls=tuple(calls), thought=thought)

    candidate = stripped
    fenced = _FENCED.match(stripped)
    if fenced:
        candidate = fenced.group(1).strip()
    if candidate.startswith(("{", "[")) and _looks_like_call(candidate):
        try:
            calls = _calls_from_json_text(candidate)
        except _Malformed as exc:
            return ParsedAction(kind=ActionKind.MALFORMED, error=f"invalid tool call: {exc}")
        if calls:
            return ParsedAction(kind=ActionKind.TOOL_CALLS, tool_calls=tuple(calls))
    if not stripped:
        return ParsedAction(kind=ActionKind.MALFORMED, error="empty action: send a message or a tool call")
    return ParsedAction(kind=ActionKind.MESSAGE, content=stripped)


_CLOSE = "</tool_call>"


def _cut_close(block: str) -> str:
    """A block without the start of a closing tag that the token limit cut short (the call
    before it is whole: ``{...}</tool``); anything else after the JSON stays, and is malformed."""
    for size in range(len(_CLOSE) - 1, 1, -1):
        if block.endswith(_CLOSE[:size]):
            return block[:-size].rstrip()
    return block


def _looks_like_call(candidate: str) -> bool:
    # JSON that mentions a "name" key is meant as a call; other JSON (a user
    # asked for a JSON answer, say) is a message.
    return re.search(r'"name"\s*:', candidate) is not None


def _calls_from_json_text(text: str) -> list[ToolCall]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Malformed(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    items = value if isinstance(value, list) else [value]
    return [_call_from_object(item) for item in items]


def _call_from_object(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise _Malformed(f"expected a JSON object with 'name' and 'arguments', got {type(obj).__name__}")
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI's tool_calls entry
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Malformed("the call has no 'name' string")
    extra = set(obj) - {"name", "arguments", "parameters", "id", "type"}
    if extra:
        raise _Malformed(f'unexpected keys {sorted(extra)}; a call is {{"name": ..., "arguments": {{...}}}}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise _Malformed(f"'arguments' of {name} is a string that is not JSON ({exc.msg})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _Malformed(f"'arguments' of {name} must be an object, got {type(arguments).__name__}")
    return ToolCall(name=name.strip(), arguments=arguments)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of a tool call, as agents are asked to write it."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"
