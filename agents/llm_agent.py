"""LLMAgent: a model behind any backend (local Hugging Face, the embedded
SmolLM2, an OpenAI-compatible server) as a trace-gym agent.

It keeps the conversation in OpenAI chat format, turns each observation into a
tool message (after its own tool calls) or a user message, and sends the
model's text to the env as it is: the env parses it with the same parser the
agent uses to understand its own turn. After ``max_malformed`` unparsable
outputs in a row the episode is given up with ``AgentGaveUp`` (recorded in
the trajectory, not a crash of the run).

For batched rollouts the turn is split in two: ``request()`` gives the
conversation to generate from, ``receive(completion)`` takes the answer.
"""

from __future__ import annotations

import re
from typing import Any

from trace_gym.actions import parse_action
from trace_gym.errors import TraceGymError

_RESPONSE_BLOCK = re.compile(r'<tool_response name="[^"]*" id="([^"]*)">\n(.*?)\n</tool_response>', re.DOTALL)


class AgentGaveUp(TraceGymError):
    """The model's output never parsed as an action; the episode is abandoned."""


class LLMAgent:
    name = "llm"

    def __init__(self, model: Any = None, adapter: str | None = None, temperature: float = 0.0, max_new_tokens: int = 256,
                 seed: int = 0, max_malformed: int = 5, **backend_kwargs: Any):
        from trace_gym.llm import EMBEDDED_DEFAULT, make_backend

        if model is None or isinstance(model, str):
            self.backend = make_backend(model or EMBEDDED_DEFAULT, **backend_kwargs)
        else:
            self.backend = model
        self.model = self.backend.name
        self.adapter = adapter
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.max_malformed = max_malformed
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self._pending_calls: list[str] = []
        self._malformed = 0
        self._calls = 0
        self._usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._turn = 0
        self._episode_seed = 0

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        self.tools = list(info.get("tools") or [])
        self.messages = [{"role": "system", "content": info.get("system_prompt", "")}, {"role": "user", "content": observation}]
        self._pending_calls = []
        self._malformed = 0
        self._usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._turn = 0
        self._episode_seed = int(info.get("episode_seed") or 0)

    def act(self, observation: str) -> str:
        self.observe(observation)
        [completion] = self.backend.generate([self.messages], **self.generation_kwargs())
        return self.receive(completion)

    # --- the two halves of a turn, for batched rollouts ------------------------------
    def observe(self, observation: str) -> None:
        """Add what the env said since the last action (nothing right after reset)."""
        if self._turn == 0:
            return
        if self._pending_calls:
            self.messages += tool_messages(self._pending_calls, observation)
            self._pending_calls = []
        else:
            self.messages.append({"role": "user", "content": observation})

    def request(self) -> list[dict[str, Any]]:
        return self.messages

    def generation_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools, "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "seed": self.seed + self._episode_seed * 1000 + self._turn, "adapter": self.adapter}

    def receive(self, completion: Any) -> str:
        self._turn += 1
        for key in self._usage:
            self._usage[key] += getattr(completion, key, None) or 0
        text = completion.text
        parsed = parse_action(text)
        if parsed.kind == "malformed":
            self._malformed += 1
            if self._malformed >= self.max_malformed:
                raise AgentGaveUp(f"the model's output did not parse as an action {self._malformed} times in a row (last: {text[:120]!r})")
            self.messages.append({"role": "assistant", "content": text})
            return text
        self._malformed = 0
        if parsed.kind == "tool_calls":
            ids = [c.get("id") for c in completion.tool_calls] if len(completion.tool_calls) == len(parsed.tool_calls) else []
            calls = []
            for i, call in enumerate(parsed.tool_calls):
                self._calls += 1
                call_id = ids[i] if i < len(ids) and ids[i] else f"call_{self._calls}"
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": call.name, "arguments": _json(call.arguments)}})
            self.messages.append({"role": "assistant", "content": parsed.thought or None, "tool_calls": calls})
            self._pending_calls = [c["id"] for c in calls]
        else:
            self.messages.append({"role": "assistant", "content": parsed.content})
        return text

    def usage(self) -> dict[str, int | None]:
        return dict(self._usage)


def tool_messages(call_ids: list[str], observation: str) -> list[dict[str, Any]]:
    """One tool message per call: the env renders several results as tagged blocks."""
    if len(call_ids) == 1:
        return [{"role": "tool", "tool_call_id": call_ids[0], "content": observation}]
    blocks = _RESPONSE_BLOCK.findall(observation)
    if len(blocks) == len(call_ids):
        return [{"role": "tool", "tool_call_id": cid, "content": content} for cid, (_, content) in zip(call_ids, blocks)]
    return [{"role": "tool", "tool_call_id": cid, "content": observation if i == 0 else "(see the previous result)"}
            for i, cid in enumerate(call_ids)]


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)
