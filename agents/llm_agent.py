"""LLMAgent: a model behind any backend (local Hugging Face, the embedded
SmolLM2, an OpenAI-compatible server) as a trace-gym agent.

The agent plays through the Gymnasium API alone, so any env with text
observations can be played, wrapped or remote: its conversation is what the
env hands out in ``info["messages"]`` at ``reset`` and after each ``step``
(OpenAI format; every trace-gym env gives them, with the agent's text kept on
tool-call turns and one tool message per call), never a copy rebuilt from
observation strings. An env that gives no messages is read plainly: its system
prompt (``info["system_prompt"]``), then each action as the agent's turn and
each observation as the user's (``trace_gym.env.turn_messages``). The loop
that steps the env tells the agent with ``observe(observation, info)``. The
model's text goes to the env as it is; the env parses it with the same parser
the agent uses to count malformed turns. After
``max_malformed`` unparsable outputs in a row the episode is given up with
``AgentGaveUp`` (recorded in the trajectory, not a crash of the run).

With a token-level backend (``LocalHF``) the agent keeps the episode as tokens
(``self.tokens``, a ``TokenEpisode``): each turn's prompt is the previous
prompt + the sampled completion + the new environment messages rendered on
their own, never a re-tokenization of decoded text.

``instructions`` (a prompt-optimization baseline's candidate, e.g. GEPA's)
are added to the end of the env's system prompt in what the model sees, as
text and as tokens; the env's transcript keeps the target's own prompt.

For batched rollouts the turn is split in two: ``request()`` gives the
``GenerationRequest`` (with this episode's own seed, temperature and
adapter), ``receive(completion)`` takes the answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from trace_gym.actions import ActionKind, parse_action
from trace_gym.env import opening_messages, turn_messages
from trace_gym.errors import AgentGaveUp, TraceGymError
from trace_gym.llm import EMBEDDED_DEFAULT, GenerationRequest, TokenEpisode, make_backend
from trace_gym.llm.base import KeepsSessions, LLMError
from trace_gym.seeding import derive_seed

__all__ = ["AgentGaveUp", "LLMAgent"]


class LLMAgent:
    name = "llm"

    def __init__(
        self,
        model: Any = None,
        adapter: str | None = None,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        seed: int = 0,
        max_malformed: int = 5,
        instructions: str | None = None,
        **backend_kwargs: Any,
    ):
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
        self.instructions = instructions or None
        """Text added to the end of the env's system prompt (a prompt-optimization baseline's
        candidate, e.g. GEPA's); the env's own prompt and transcript are left as they are."""
        self.tools: list[dict[str, Any]] = []
        self.tokens: Any = None  # the episode's TokenEpisode, with a token-level backend
        self.session: str | None = None
        self._conversation: list[dict[str, Any]] = []  # what the model is conditioned on (OpenAI format)
        self._last_action = ""
        self._seen = 0  # conversation messages already in the token sequence
        self._prefix_len = 0
        self._malformed = 0
        self._usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._turn = 0
        self._episode_seed = 0
        self._episode_sample = 0

    @property
    def token_level(self) -> bool:
        return bool(self.backend.token_level)

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        self.end_episode()
        self._conversation = opening_messages(observation, info)
        self._last_action = ""
        self.tools = list(info.get("tools") or [])
        self.tokens = TokenEpisode() if self.token_level else None
        self.session = uuid.uuid4().hex
        self._seen = 0
        self._prefix_len = 0
        self._malformed = 0
        self._usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._turn = 0
        self._episode_seed = int(info.get("episode_seed") or 0)
        self._episode_sample = int(info.get("episode_sample") or 0)

    def observe(self, observation: str, info: dict[str, Any]) -> None:
        """What the env answered to the last action (``step``'s observation and info)."""
        self._conversation.extend(turn_messages(self._last_action, observation, info))

    def end_episode(self) -> None:
        """Let the backend forget this episode's cache."""
        if self.session is not None and isinstance(self.backend, KeepsSessions):
            self.backend.release(self.session)
        self.session = None

    def act(self, observation: str) -> str:
        [completion] = self.backend.complete([self.request()])
        return self.receive(completion)

    # --- the two halves of a turn, for batched rollouts ------------------------------
    def request(self) -> Any:
        messages = self._conditioned(self._conversation)
        request = GenerationRequest(
            messages=messages,
            tools=self.tools,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self._sampling_seed(),
            adapter=self.adapter,
            session=self.session,
        )
        if self.token_level:
            try:
                request.prompt_ids, request.prefix_len = self._prompt_ids(), self._prefix_len
            except LLMError as exc:  # the template refuses this conversation: this episode ends, not the run
                raise AgentGaveUp(f"{exc}; the episode ends here, truncated") from None
            context = getattr(self.backend, "context_size", None)
            if context and len(request.prompt_ids) + self.max_new_tokens > context:
                raise AgentGaveUp(
                    f"the prompt is {len(request.prompt_ids)} tokens: with max_new_tokens "
                    f"{self.max_new_tokens} it would pass the model's context of {context} tokens; "
                    "the episode ends here, truncated"
                )
        return request

    def _conditioned(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation the model sees: the env's, with ``instructions`` after its system prompt."""
        if not self.instructions:
            return messages
        if not messages or messages[0].get("role") != "system":
            return [{"role": "system", "content": self.instructions}, *messages]
        system = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{self.instructions}"}
        return [system, *messages[1:]]

    def _sampling_seed(self) -> int:
        """Per run seed, episode (env seed and sample) and turn: samples of one task differ."""
        return derive_seed(self.seed, self._episode_seed, self._episode_sample, self._turn)

    def _prompt_ids(self) -> list[int]:
        if not self.tokens.turns:
            ids, self._prefix_len = self.backend.encode_conversation(self._conditioned(self._conversation), self.tools)
            return ids
        fresh = self._conversation[self._seen :]
        if not fresh or fresh[0].get("role") != "assistant":
            raise TraceGymError(
                "the env's messages did not start with the agent's last turn where expected "
                "(was observe() called after step()?)"
            )
        last = self.tokens.turns[-1]
        continuation = self.backend.encode_continuation(fresh[0], fresh[1:], last.completion_ids)
        return [*last.prompt_ids, *last.completion_ids, *continuation]

    def receive(self, completion: Any) -> str:
        self._turn += 1
        for key in self._usage:
            self._usage[key] += getattr(completion, key, None) or 0
        if self.tokens is not None and completion.tokens is not None:
            self.tokens.turns.append(completion.tokens)
        self._seen = len(self._conversation)  # the env's messages for this action come next, its own turn first
        text = completion.text
        self._last_action = text
        if parse_action(text).kind == ActionKind.MALFORMED:
            self._malformed += 1
            if self._malformed >= self.max_malformed:
                raise AgentGaveUp(
                    f"the model's output did not parse as an action {self._malformed} times in a row (last: {text[:120]!r})"
                )
        else:
            self._malformed = 0
        return text

    def usage(self) -> dict[str, int | None]:
        return dict(self._usage)
