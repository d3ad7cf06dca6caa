"""The tokenizer side of a token-level backend: a chat template that appends turn
for turn, and the ids of a conversation, of what follows a turn, and of a reply.

``LocalHF`` generates with these ids on a model it holds; ``VLLMTokens`` sends
them to a vLLM (or ``trace-gym serve``) server's token-id completions. Both
condition on exactly the same ids for the same conversation, so an episode
played through either is the same token sequence.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from .base import Completion, LLMError, TokenTurn, control_pattern, plain_messages
from .registry import with_pad_token
from .templates import CANNOT_APPEND, choose, template_kwargs

_SENTINEL = "\u2063TRACE-GYM-SENTINEL\u2063"


class TokenTemplate:
    """Needs ``self.tokenizer`` and ``self.name``; ``_set_template`` sets the rest."""

    tokenizer: Any
    name: str

    def _set_template(self, chat_template: str | None, template: str, generation_eos: Any) -> None:
        """Choose the template to play with (``templates.choose``) and derive the control
        patterns, the turn close and the stop ids from it; ``generation_eos``: the
        model's ``generation_config.eos_token_id`` (an id, a list of them, or None)."""
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template

        stock = self.tokenizer.chat_template
        self.tokenizer.chat_template, self.template_note = choose(self.tokenizer, template)
        self._template_kwargs = template_kwargs(self.tokenizer.chat_template)
        if self.tokenizer.chat_template != stock or self.template_note.endswith(CANNOT_APPEND):
            print(f"trace-gym: {self.name} plays under {self.template_note}", file=sys.stderr)
        with_pad_token(self.tokenizer)  # whichever way the tokenizer came in (a folder, or an object handed in)
        # every added token of this tokenizer (<|im_end|>, Qwen's <tool_call>, ...) is what the encoder parses as one
        # control id: text from an env, a user or a tool that spells one is rendered split, and stays text
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        special = getattr(self.tokenizer, "all_special_tokens", [])
        self._control = control_pattern([*(t.content for t in added.values()), *special])
        # in assistant turns (the model's, or an oracle's or a log's taught by SFT) only the special ones: the turn
        # boundaries, not tool-call markup such as Qwen's <tool_call>, an added token the model itself writes
        self._turns = control_pattern([*(t.content for t in added.values() if getattr(t, "special", True)), *special])
        self._close = self._turn_close()
        self.stop_ids = self._stop_ids(generation_eos)
        self._prefix_ids: dict[str, list[int]] = {}

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                plain_messages(messages, self._control, self._turns),
                tools=plain_messages(tools, self._control) if tools else None,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **self._template_kwargs,
            )
        except Exception as exc:  # jinja errors: the template refuses this conversation
            raise LLMError(f"the chat template of {self.name} cannot render this conversation ({exc})") from None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _turn_close(self) -> str:
        """What the template writes after an assistant message's text (e.g. ``<|im_end|>\\n``)."""
        head = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        try:
            text = self._render([*head, {"role": "assistant", "content": _SENTINEL}], None, False)
        except LLMError:
            return self.tokenizer.eos_token or ""
        return (
            text[text.rindex(_SENTINEL) + len(_SENTINEL) :] if _SENTINEL in text else (self.tokenizer.eos_token or "")
        )

    def _stop_ids(self, generation_eos: Any = None) -> set[int]:
        ids: set[int] = set()
        for source in (generation_eos, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        close = self._encode(self._close) if self._close else []
        if close and close[0] in set(self.tokenizer.all_special_ids):
            ids.add(close[0])  # the template's end-of-turn token (<|im_end|>, <|eot_id|>, ...)
        return ids

    def encode_conversation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], int]:
        """A conversation's first prompt as ids, and how many leading ids are its
        shareable prefix (the system turn with the tool schemas)."""
        full = self._render(messages, tools, True)
        if not messages or messages[0].get("role") != "system":
            return self._encode(full), 0
        try:
            system = self._render(messages[:1], tools, False)
        except LLMError:
            return self._encode(full), 0
        if not full.startswith(system):
            return self._encode(full), 0
        key = hashlib.sha256(system.encode()).hexdigest()
        prefix = self._prefix_ids.get(key)
        if prefix is None:
            prefix = self._prefix_ids[key] = self._encode(system)
            if len(self._prefix_ids) > 64:
                self._prefix_ids.pop(next(iter(self._prefix_ids)))
        return [*prefix, *self._encode(full[len(system) :])], len(prefix)

    def encode_continuation(
        self, last_assistant: dict[str, Any], new_messages: list[dict[str, Any]], completion_ids: list[int]
    ) -> list[int]:
        """The ids to append after ``completion_ids`` (the model's last turn, recorded
        as ``last_assistant``) for ``new_messages``, ending with the generation
        prompt: the rest of the template's turn close (the part the model did not
        sample) and the new messages, rendered on their own."""
        head = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, last_assistant]
        if len(last_assistant.get("tool_calls") or []) > 1:
            # only what follows the turn is rendered here (the turn itself is the model's own ids), and templates
            # that take one call per turn (Llama 3.x) would refuse the whole conversation for a second call
            head[-1] = {**last_assistant, "tool_calls": last_assistant["tool_calls"][:1]}
        before = self._render(head, None, False)
        after = self._render([*head, *new_messages], None, True)
        if not after.startswith(before):
            raise LLMError(
                f"the chat template of {self.name} re-renders earlier turns, so a turn cannot be appended "
                "token for token"
            )
        close = self._close
        if completion_ids and completion_ids[-1] in self.stop_ids:
            sampled = self.tokenizer.decode([completion_ids[-1]])
            if close.startswith(sampled):
                close = close[len(sampled) :]
        elif not before.endswith(close):
            close = ""
        return self._encode(close + after[len(before) :])

    def encode_reply(self, message: dict[str, Any]) -> list[int]:
        """The ids the model would sample to write ``message`` (an assistant turn,
        OpenAI format) after a generation prompt: the template's rendering of it, up
        to and including the end-of-turn token the model stops on. A demonstration
        turn taught with these ids is what a rollout's own turn looks like."""
        head = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        before = self._render(head, None, True)
        after = self._render([*head, message], None, False)
        if not after.startswith(before):
            raise LLMError(
                f"the chat template of {self.name} renders an assistant turn differently after a generation "
                "prompt, so a demonstration cannot be written as sampled tokens"
            )
        text = after[len(before) :]
        close = self._close
        if close and text.endswith(close):
            text = text[: -len(close)]
        ids = self._encode(text)
        stop = self._encode(close)[:1] if close else []
        if stop and stop[0] in self.stop_ids:
            return [*ids, stop[0]]
        eos = self.tokenizer.eos_token_id
        return [*ids, eos] if isinstance(eos, int) else ids

    def _completion(self, prompt: list[int], sampled: list[int], logprobs: list[float]) -> Completion:
        stopped = bool(sampled) and sampled[-1] in self.stop_ids
        text_ids = sampled[:-1] if stopped else sampled
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True).strip()
        return Completion(
            text=text,
            prompt_tokens=len(prompt),
            completion_tokens=len(sampled),
            finish_reason="stop" if stopped else "length",
            tokens=TokenTurn(prompt_ids=list(prompt), completion_ids=list(sampled), logprobs=list(logprobs)),
        )
