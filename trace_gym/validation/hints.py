"""Does a hint give the answer away? Values an oracle would state, and whether the hinted prompt states them."""

from __future__ import annotations

import re
from typing import Any

_VALUE_TOKEN = re.compile(r"[#A-Za-z0-9_.\-]*\d[#A-Za-z0-9_.\-]*")
_WORD = re.compile(r"[A-Za-z][A-Za-z\-]+")


_NUMBER = re.compile(r"(?<![\w.#])[-+]?\$?\d[\d,]*(?:\.\d+)?(?![\w#])")


def stated_numbers(text: str) -> set[str]:
    """The numbers a text states, normalised ($1,234.50 and 1234.5 are one number);
    digits inside ids (#W0012, user_12) are not numbers here."""
    out = set()
    for token in _NUMBER.findall(text):
        try:
            value = float(token.replace("$", "").replace(",", ""))
        except ValueError:
            continue
        out.add(f"{value:.6f}".rstrip("0").rstrip("."))
    return out


def hinted_reset(worker: Any, seed: int) -> tuple[dict, dict, list, str, str]:
    """A seed reset without and with its hint, and its oracle: (plain, hinted, oracle,
    what the hint adds, what the agent is told anyway)."""
    plain = worker.call("reset", seed=seed, hint=False)
    oracle = worker.call("oracle") or []
    hinted = worker.call("reset", seed=seed, hint=True)
    hint_text = hinted["system_prompt"].replace(plain["system_prompt"], " ")
    return plain, hinted, oracle, hint_text, plain["system_prompt"] + " " + plain["user_message"]


def hint_leaks(worker: Any, seed: int, other: int) -> list[str]:
    """What ``seed``'s hint gives away, judged one seed at a time (training's spot
    check; ``check_hints`` judges many): an oracle value or a number of the oracle's
    messages that the hint states and nothing else the agent is told does. A value
    that ``other``'s hint states too is generic advice, not this seed's answer."""
    _, _, oracle, hint, known = hinted_reset(worker, seed)
    hint, known = hint.lower(), known.lower()
    elsewhere = worker.call("reset", seed=other, hint=True)["system_prompt"].lower()
    leaks = [
        f"the hint spells out '{value}'"
        for value in sorted({v.lower() for v in oracle_values(oracle)})
        if value in hint and value not in known and value not in elsewhere
    ]
    numbers = stated_numbers(hint) & stated_numbers(" ".join(oracle_messages(oracle))) - stated_numbers(
        known
    ) - stated_numbers(elsewhere)
    return leaks + [f"the hint states {n}, a number the oracle's messages give as the answer" for n in sorted(numbers)]


def oracle_messages(actions: list[Any]) -> list[str]:
    return [str(a.get("content", "")) for a in actions if isinstance(a, dict) and a.get("type") == "message"]


def oracle_values(actions: list[Any]) -> set[str]:
    """Argument values of the oracle's calls and number-like tokens of its messages."""
    values: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value)
            if len(text) >= 3:
                values.add(text)

    for action in actions:
        if not isinstance(action, dict):
            continue
        if action.get("type") == "tool_call":
            walk(action.get("arguments"))
        elif action.get("type") == "message":
            content = str(action.get("content", ""))
            values.update(t for t in _VALUE_TOKEN.findall(content) if len(t) >= 3)
            values.update(w.lower() for w in _WORD.findall(content) if len(w) >= 4)
    return values
