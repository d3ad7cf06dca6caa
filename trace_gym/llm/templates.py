"""Chat templates the token-level episode loop can play with.

The loop never re-renders a conversation: each turn it appends the ids of the
new messages to the ids it already holds (``LocalHF.encode_continuation``), so
what GRPO trains on is exactly what the model read. That needs a template that
renders earlier turns the same whatever follows (prefix-preserving). Several
stock templates are not: Qwen3's drops the reasoning of earlier assistant turns,
so every second turn would fail. ``choose`` keeps a template that appends turn
for turn and otherwise takes TRL's training template for the family
(``trl.chat_template_utils.get_training_chat_template``), which is.

``template_kwargs`` are what the loop passes to a template: Llama 3.x's puts the
tool schemas in the first *user* turn unless told ``tools_in_user_message=False``,
which would leave no system prefix for episodes to share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .base import LLMError
from .embedded import OWN_TEMPLATES

CHOICES = ("auto", "stock")
"""``auto``: the tokenizer's template if it appends turn for turn, else TRL's training
template for its family; ``stock``: the tokenizer's, as is. Anything else is the name of
one of ours (``chatml_tools``, the embedded model's; ``chatml_compact_tools``, the same turns
in fewer tokens), of a template TRL ships (``qwen3_training``) or a path to a ``.jinja`` file."""

_CALL = {"type": "function", "function": {"name": "get_order", "arguments": {"order_id": "#W1"}}}
PROBE = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Where is my order #W1?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", **_CALL}]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "It has shipped."},
    {"role": "user", "content": "Thanks."},
]
"""A conversation with the turns an episode has: a tool call, its result, a message, a user reply."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "An order's details.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
]


def template_kwargs(template: str | None) -> dict[str, Any]:
    """Keyword arguments the loop passes when it renders with ``template``."""
    return {"tools_in_user_message": False} if template and "tools_in_user_message" in template else {}


def appends_turns(render: Callable[[list[dict[str, Any]], bool], str]) -> bool:
    """Whether every assistant turn of ``PROBE``, once rendered, stays as it was when the
    next messages follow (what ``encode_continuation`` relies on). ``render(messages,
    generation_prompt)`` renders with the template under test."""
    try:
        whole = render(PROBE, True)
        for i, message in enumerate(PROBE):
            if message["role"] != "assistant":
                continue
            # the turn as sampled after the generation prompt, and as kept once more messages follow
            if not render(PROBE[: i + 1], False).startswith(render(PROBE[:i], True)):
                return False
            if not whole.startswith(render(PROBE[: i + 1], False)):
                return False
    except Exception:  # a template that cannot render the probe cannot play an episode either
        return False
    return True


def named_template(name: str) -> str:
    """A template by name: one of ours (``embedded.OWN_TEMPLATES``), else one TRL ships
    (``trl/chat_templates/<name>.jinja``)."""
    if name in OWN_TEMPLATES:
        return OWN_TEMPLATES[name]
    try:
        import trl
    except ImportError:
        raise LLMError(f"chat template '{name}': TRL's templates need trl (make setup)") from None
    folder = Path(trl.__file__).parent / "chat_templates"
    path = folder / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.jinja"))
        ours = ", ".join(OWN_TEMPLATES)
        raise LLMError(
            f"chat template '{name}': neither a file, one of ours ({ours}) nor one of TRL's ({', '.join(known[:8])}, ...)"
        )
    return path.read_text(encoding="utf-8")


def check_choice(choice: str) -> None:
    """Refuses, in one line, a choice that names no template (before any model loads)."""
    if choice in CHOICES:
        return
    path = Path(choice).expanduser()
    if path.suffix == ".jinja":
        if not path.is_file():
            raise LLMError(f"chat template '{choice}': no such file")
        return
    named_template(choice)


def choose(tokenizer: Any, choice: str = "auto") -> tuple[str | None, str]:
    """(the template to use, why). ``choice`` is one of ``CHOICES``, a template's
    name (``named_template``) or a ``.jinja`` path; a template that cannot play is kept only with ``stock``."""
    stock = tokenizer.chat_template
    if isinstance(stock, dict):
        stock = stock.get("default")
    if choice == "stock":
        if stock and not appends_turns(_renderer(tokenizer, stock)):
            return stock, "the tokenizer's own (stock), " + CANNOT_APPEND
        return stock, "the tokenizer's own (stock)"
    if choice != "auto":
        path = Path(choice).expanduser()
        template = (
            path.read_text(encoding="utf-8") if path.suffix == ".jinja" and path.is_file() else named_template(choice)
        )
        if not appends_turns(_renderer(tokenizer, template)):
            raise LLMError(
                f"chat template '{choice}' re-renders earlier turns, so the episode loop cannot append a "
                "turn token for token; use a prefix-preserving one (TRL's *_training templates are)"
            )
        return template, f"'{choice}'"
    if not stock:
        return stock, "none (the tokenizer has no chat template)"
    if appends_turns(_renderer(tokenizer, stock)):
        return stock, "the tokenizer's own (it appends turn for turn)"
    try:
        from trl.chat_template_utils import get_training_chat_template

        training = get_training_chat_template(tokenizer)
    except (ImportError, ValueError, TypeError):  # no TRL, or no training template for this family
        training = None
    if training and appends_turns(_renderer(tokenizer, training)):
        return training, "TRL's training template for this family (the tokenizer's re-renders earlier turns)"
    return stock, "the tokenizer's own, " + CANNOT_APPEND


CANNOT_APPEND = (
    "although it re-renders earlier turns: every episode ends at its second turn (choose a prefix-preserving template)"
)


def _renderer(tokenizer: Any, template: str) -> Callable[[list[dict[str, Any]], bool], str]:
    extra = template_kwargs(template)

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages,
            tools=TOOLS,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **extra,
        )

    return render
