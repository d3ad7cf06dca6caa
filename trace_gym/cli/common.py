"""What several verbs share: argparse types, option lists, progress, help text, the model spec, the table printer."""

from __future__ import annotations

import argparse
import sys

from ..errors import TraceGymError


def count(text: str) -> int:
    """An argparse type: a whole number of at least 1 (episodes, workers, runs...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count: {text!r} (a whole number, at least 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def names(text: str | None, option: str) -> list[str] | None:
    """A comma-separated option (``--methods a,b``, ``--task-ids``) as its non-empty items;
    None (not given) stays None, and one that names nothing (``--methods ,``) is refused."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise TraceGymError(f"{option}: names nothing (give comma-separated names, or leave it out)")
    return items


def say(message: str) -> None:
    """Progress of a long verb, on stderr (stdout keeps its result)."""
    print(message, file=sys.stderr, flush=True)


TEMPLATE_HELP = (
    "chat template of a local or vllm: model: auto (default: the model's own if it appends turn "
    "for turn, else TRL's training template for its family), stock, a template's name "
    "(ours: chatml_compact_tools; TRL's: qwen3_training) or a .jinja path"
)


def model_spec(model: str | None, template: str | None) -> str | None:
    """The spec --model and --chat-template name together (None: the command's default model)."""
    if not template:
        return model
    from ..llm.registry import EMBEDDED_DEFAULT, with_template

    return with_template(model or EMBEDDED_DEFAULT, template)


def format_table(rows: list[dict[str, str]], columns: list[str]) -> str:
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    line = lambda values: "  ".join(str(v).ljust(widths[c]) for c, v in zip(columns, values))  # noqa: E731
    out = [line(columns), line(["-" * widths[c] for c in columns])]
    out += [line([r.get(c, "") for c in columns]) for r in rows]
    return "\n".join(out)
