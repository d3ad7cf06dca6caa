"""Tool calls that keep to their schemas while they are decoded ("strict" tool calls).

A small policy often writes a call no tool accepts: a tool name that does not
exist (``get_orderdetails``), an argument the tool does not take (``item_ids``
on ``get_order_details``), a required one left out, or JSON that never closes.
Servers offer the remedy as strict function calling (OpenAI's ``strict``, vLLM's
structured outputs); this is ours for local models. Once a reply opens a call
(``<tool_call>`` or a bare ``{``), every token must keep the text a prefix of a
call that its tool's schema accepts:

- ``{"name": <a tool's name>, "arguments": {...}}``, name first;
- the arguments are keys of the tool's ``properties``, each at most once, with
  values of the property's type (string, number, integer, boolean, null, array
  with its ``items``, object with its ``properties``; a string ``enum`` is kept
  to its values; a property without a ``type`` takes any JSON value);
- the arguments close only once every ``required`` key is there;
- after the call only its closing tag, whitespace and the end of the turn.

A reply that opens with other text is a message and is left free (a call it
opens later with ``<tool_call>`` is held to the schema from there). What is
constrained is the form of a call, not its content: an id is any string of the
right type, so a wrong id still reaches the tool and its error.

Grounded ids (``TRACE_GYM_STRICT_TOOLS=ids``) go one step further, into content:
a string argument named ``id``, ``*_id`` or ``*_ids`` must be copied whole from
the conversation, one of the id-like words (``ground``) of its user and tool
messages, so a policy cannot invent ``sara_doe_496`` or drop the ``#`` of
``#W2378156``. Where the conversation holds no such word yet, ids are free.

``CallGrammar`` is built once per set of tools; ``CallGrammar.start()`` gives a
row's ``Progress``, which ``accepts(piece)`` checks a token's text against and
``advance(piece)`` moves on. A state is an immutable tuple, so checking a
candidate copies nothing.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

from ..base import LLMError

STRICT_ENV = "TRACE_GYM_STRICT_TOOLS"
STRICT_VALUES: dict[bool | str, str] = {False: "0", True: "1", "ids": "ids"}
"""Each way of holding calls (``strict_from_env``), as ``TRACE_GYM_STRICT_TOOLS`` sets it."""

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
_NUMBER_CHARS = set("-+.eE0123456789")
# What a number may be on its way to a whole one: a character that leaves none of these
# is refused at once, so a held row never writes itself into a number it cannot end.
_NUMBER_PREFIX = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:(?:\.[0-9]+)?(?:[eE][+-]?[0-9]*)?|\.)?)?")
_INTEGER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?")
# The longest run of whitespace between a call's tokens: enough for JSON indented a
# few levels, and a held row cannot spend its budget on blanks.
WS_RUN = 24
_HEX = set("0123456789abcdefABCDEF")
_ESCAPES = set('"\\/bfnrtu')

# Modes of a reply: before its first visible character; inside "<tool_call>" as it is
# written; a message (free text, watched for a "<tool_call>" it may open); inside a call's
# JSON; after the call's JSON (its closing tag); done (only whitespace and the end of the turn).
_START, _TAG, _FREE, _JSON, _AFTER, _DONE = range(6)

ANY: dict[str, Any] = {}
"""The schema of a value of any JSON type."""

ID_KEY = re.compile(r"(?:^|_)ids?$")
"""The argument names grounded ids hold to the conversation."""
_ID_WORD = re.compile(r"#?[^\W_][\w\-]*")


class Choices:
    """The strings a string value may be (a tool's name, an enum, grounded ids), and
    their prefixes, so that a character is checked in one look-up."""

    __slots__ = ("full", "prefixes")

    def __init__(self, strings):
        self.full = frozenset(strings)
        self.prefixes = frozenset(s[:i] for s in self.full for i in range(len(s) + 1))


def _id_like(word: str) -> bool:
    """At least three characters with a digit (``#W2378156``, ``sara_doe_496``), or
    five capitals or more (τ² airline's reservation ids, such as ``VAAOXJ``)."""
    if len(word) >= 3 and any(c.isdigit() for c in word):
        return True
    return len(word) >= 5 and word.isalpha() and word.isupper()


def _texts(value: Any) -> Iterator[str]:
    """The strings a message's content holds: a JSON result's string values, keys
    and integers (so that its escapes are never read as text), else the text."""
    if isinstance(value, str):
        if value.lstrip()[:1] in ("{", "[", '"'):
            try:
                value = json.loads(value)
            except ValueError:
                yield value
                return
            yield from _texts(value)
            return
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield str(value)


def ground(messages: list[dict[str, Any]]) -> tuple[str, ...]:
    """The id-like words (``_id_like``) of ``messages``' user and tool turns."""
    words: dict[str, None] = {}
    for message in messages:
        if message.get("role") in ("user", "tool"):
            for text in _texts(message.get("content")):
                for word in _ID_WORD.findall(text):
                    if _id_like(word):
                        words[word] = None
    return tuple(words)


def _is_string(schema: Any) -> bool:
    """A schema whose values are strings (or strings or null)."""
    types = schema.get("type") if isinstance(schema, dict) else None
    return types == "string" or isinstance(types, list) and "string" in types


def _grounded(parameters: dict[str, Any], ids: Choices) -> dict[str, Any]:
    """``parameters`` with their id strings (and arrays of them) held to ``ids``."""
    properties = {}
    for key, schema in (parameters.get("properties") or {}).items():
        if ID_KEY.search(key) and isinstance(schema, dict) and "enum" not in schema:
            items = schema.get("items")
            if _is_string(schema):
                schema = {**schema, "x-choices": ids}
            elif schema.get("type") == "array" and _is_string(items) and "enum" not in items:
                schema = {**schema, "items": {**items, "x-choices": ids}}
        properties[key] = schema
    return {**parameters, "properties": properties}


class CallGrammar:
    """The calls ``tools`` (OpenAI tool schemas) accept, as a grammar over their text."""

    def __init__(self, tools: list[dict[str, Any]]):
        self.parameters: dict[str, dict[str, Any]] = {}
        for tool in tools:
            function = tool.get("function", tool)
            name = function.get("name")
            if isinstance(name, str) and name:
                parameters = function.get("parameters") or {}
                self.parameters[name] = {**parameters, "type": "object"}
        self.names = tuple(sorted(self.parameters))
        self.call = {
            "type": "object",
            "x-call": True,
            "properties": {"name": {"type": "string", "x-choices": Choices(self.names)}, "arguments": ANY},
            "required": ["name", "arguments"],
        }

    def start(self, messages: list[dict[str, Any]] | None = None) -> "Progress":
        """A reply's progress; with ``messages`` (the conversation it continues),
        its id arguments are grounded in them."""
        ids = ground(messages) if messages is not None else ()
        call = {**self.call, "x-ids": Choices(ids)} if ids else self.call
        return Progress(self, (_START, 0, ()), call)

    def arguments(self, tool: str, ids: Choices | None) -> dict[str, Any]:
        """The schema of ``tool``'s arguments, its ids held to ``ids`` where given."""
        return self.parameters[tool] if ids is None else _grounded(self.parameters[tool], ids)


class Progress:
    """One reply's place in the grammar."""

    __slots__ = ("grammar", "state", "blank", "call")

    def __init__(self, grammar: CallGrammar, state: tuple, call: dict[str, Any]):
        self.grammar, self.state, self.call = grammar, state, call
        self.blank = 0  # the whitespace run the reply's call ends with

    @property
    def in_call(self) -> bool:
        """Inside a call's JSON, where the turn may not end."""
        return self.state[0] == _JSON

    @property
    def constrained(self) -> bool:
        """Whether tokens are checked at all: not while the reply is a message."""
        return self.state[0] != _FREE

    def accepts(self, piece: str) -> bool:
        return _feed(self.grammar, self.call, self.state, self.blank, piece) is not None

    def advance(self, piece: str) -> None:
        """Move on by a token's text; text the grammar refuses (a token chosen without
        it) leaves the reply free from here on."""
        fed = _feed(self.grammar, self.call, self.state, self.blank, piece)
        self.state, self.blank = fed if fed is not None else ((_FREE, 0, ()), 0)


def _feed(grammar: CallGrammar, call: dict, state: tuple, blank: int, text: str) -> tuple[tuple, int] | None:
    """The state after ``text`` and the whitespace run it ends with, or None
    (``call``: the schema of the reply's call)."""
    for ch in text:
        state = _char(grammar, call, state, ch)
        if state is None:
            return None
        mode, _, stack = state
        if ch in _WS and mode in (_JSON, _AFTER, _DONE) and not (stack and stack[-1][0] == "str"):
            blank += 1
            if blank > WS_RUN:
                return None
        else:
            blank = 0
    return state, blank


def _char(grammar: CallGrammar, call: dict, state: tuple, ch: str) -> tuple | None:
    mode, matched, stack = state
    if mode == _START:
        if ch in _WS:
            return state
        if ch == "{":
            return _json(grammar, (_JSON, 0, (("value", call),)), ch, tagged=False)
        if ch == "<":
            return (_TAG, 1, ())
        return (_FREE, 0, ())
    if mode == _TAG:
        if ch == OPEN[matched]:
            return (_JSON, 1, (("value", call),)) if matched + 1 == len(OPEN) else (_TAG, matched + 1, ())
        return (_FREE, 1 if ch == "<" else 0, ())
    if mode == _FREE:  # a message: only a "<tool_call>" it opens is held to the schema
        if ch == OPEN[matched]:
            return (_JSON, 1, (("value", call),)) if matched + 1 == len(OPEN) else (_FREE, matched + 1, ())
        return (_FREE, 1 if ch == "<" else 0, ())
    if mode == _JSON:
        return _json(grammar, state, ch, tagged=bool(matched))
    if mode == _AFTER:  # the closing tag, after optional whitespace
        if matched == 0 and ch in _WS:
            return state
        if ch == CLOSE[matched]:
            return (_DONE, 0, ()) if matched + 1 == len(CLOSE) else (_AFTER, matched + 1, ())
        return None
    return state if ch in _WS else None  # _DONE


def _json(grammar: CallGrammar, state: tuple, ch: str, *, tagged: bool) -> tuple | None:
    """One character of a call's JSON. ``stack`` holds frames, innermost last:
    ("value", schema) a value to start; ("str", choices, text, escape) a string
    (``choices``: the strings it may be, else None); ("num", schema, text); ("lit", rest);
    ("obj", schema, keys seen, phase, key, tool) (``tool``: the call's tool, once named);
    ("arr", schema, phase)."""
    _, _, stack = state
    frames = list(stack)
    result = _step(grammar, frames, ch)
    if result is None:
        return None
    if not frames:  # the call's object closed
        return (_AFTER, 0, ()) if tagged else (_DONE, 0, ())
    return (_JSON, 1 if tagged else 0, tuple(frames))


def _step(grammar: CallGrammar, frames: list, ch: str) -> bool | None:
    """Apply ``ch`` to ``frames`` in place; None if it is refused."""
    top = frames[-1]
    kind = top[0]
    if kind == "value":
        schema = top[1]
        if ch in _WS:
            return True
        frames.pop()
        return _begin(grammar, frames, schema, ch)
    if kind == "str":
        _, choices, text, escape = top
        if escape == 1:
            if ch not in _ESCAPES or choices is not None:
                return None
            frames[-1] = ("str", choices, text, 2 if ch == "u" else 0)
            return True
        if escape >= 2:  # the four hex digits after \u
            if ch not in _HEX:
                return None
            frames[-1] = ("str", choices, text, 0 if escape == 5 else escape + 1)
            return True
        if ch == '"':
            if choices is not None and text not in choices.full:
                return None
            frames.pop()
            return _close_value(grammar, frames, text)
        if ch == "\\":
            if choices is not None:  # (a name, an enum value or an id is written plain)
                return None
            frames[-1] = ("str", choices, text, 1)
            return True
        if ord(ch) < 0x20:
            return None
        if choices is not None:
            text += ch
            if text not in choices.prefixes:
                return None
        frames[-1] = ("str", choices, text, 0)
        return True
    if kind == "num":
        _, schema, text = top
        integer = schema.get("type") == "integer"
        if ch in _NUMBER_CHARS:
            if not (_INTEGER_PREFIX if integer else _NUMBER_PREFIX).fullmatch(text + ch):
                return None
            frames[-1] = ("num", schema, text + ch)
            return True
        pattern = _INTEGER if integer else _NUMBER
        if not pattern.fullmatch(text):
            return None
        frames.pop()
        if _close_value(grammar, frames, None) is None:
            return None
        return _step(grammar, frames, ch) if frames else (True if ch in _WS else None)
    if kind == "lit":
        rest = top[1]
        if ch != rest[0]:
            return None
        if len(rest) > 1:
            frames[-1] = ("lit", rest[1:])
            return True
        frames.pop()
        return _close_value(grammar, frames, None)
    if kind == "obj":
        return _object(grammar, frames, ch)
    if kind == "arr":
        _, schema, phase = top
        if ch in _WS:
            return True
        if phase == "after" or (phase == "first" and ch == "]"):
            if ch == ",":
                frames[-1] = ("arr", schema, "next")
                return True
            if ch == "]":
                frames.pop()
                return _close_value(grammar, frames, None)
            return None
        frames[-1] = ("arr", schema, "after")
        return _begin(grammar, frames, schema.get("items") or ANY, ch)
    return None


def _begin(grammar: CallGrammar, frames: list, schema: dict[str, Any], ch: str) -> bool | None:
    """Start a value of ``schema`` with its first character."""
    types = schema.get("type")
    allowed = set(types) if isinstance(types, list) else {types} if types else None
    choices = schema.get("x-choices")
    if choices is None and "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        choices = Choices(schema["enum"])
    if choices is not None:
        if ch == '"':
            frames.append(("str", choices, "", 0))
            return True
        if "x-choices" not in schema or allowed is None:
            return None
        allowed -= {"string"}  # a grounded id that may also be null

    def may(name: str) -> bool:
        return allowed is None or name in allowed or (name == "number" and "integer" in allowed)

    if ch == '"' and may("string"):
        frames.append(("str", None, "", 0))
        return True
    if ch == "{" and may("object"):
        frames.append(("obj", schema, (), "first", None, None))
        return True
    if ch == "[" and may("array"):
        frames.append(("arr", schema, "first"))
        return True
    if (ch == "-" or ch.isdigit()) and may("number"):
        frames.append(("num", schema if allowed is not None else {"type": "number"}, ch))
        return True
    for word, name in (("true", "boolean"), ("false", "boolean"), ("null", "null")):
        if ch == word[0] and may(name):
            frames.append(("lit", word[1:]))
            return True
    return None


def _close_value(grammar: CallGrammar, frames: list, text: str | None) -> bool | None:
    """A value (or an object's key, ``text``) has ended; tell the frame that holds it."""
    if not frames:
        return True
    top = frames[-1]
    if top[0] == "obj":
        _, schema, seen, phase, key, tool = top
        if phase == "key":  # the string that ended was a key
            frames[-1] = ("obj", schema, (*seen, text), "colon", text, tool)
        else:
            if schema.get("x-call") and key == "name":
                tool = text
            frames[-1] = ("obj", schema, seen, "after", None, tool)
        return True
    return True  # an array's item: its phase is already "after"


def _keys(grammar: CallGrammar, schema: dict[str, Any], seen: tuple) -> tuple[str, ...] | None:
    """The keys an object may take next (None: any key)."""
    if schema.get("x-call"):
        return ("name",) if not seen else ("arguments",) if seen == ("name",) else ()
    properties = schema.get("properties")
    if properties is None:
        return None
    return tuple(k for k in properties if k not in seen)


def _complete(schema: dict[str, Any], seen: tuple) -> bool:
    return all(k in seen for k in schema.get("required") or ())


def _object(grammar: CallGrammar, frames: list, ch: str) -> bool | None:
    _, schema, seen, phase, key, tool = frames[-1]
    if ch in _WS:
        return True
    if phase in ("first", "next"):
        if ch == "}" and phase == "first" and _complete(schema, seen):
            frames.pop()
            return _close_value(grammar, frames, None)
        if ch != '"':
            return None
        keys = _keys(grammar, schema, seen)
        if keys is not None and not keys:
            return None
        frames[-1] = ("obj", schema, seen, "key", None, tool)
        frames.append(("str", Choices(keys) if keys is not None else None, "", 0))
        return True
    if phase == "colon":
        if ch != ":":
            return None
        if schema.get("x-call") and key == "arguments":
            value = grammar.arguments(tool, schema.get("x-ids"))
        else:
            value = (schema.get("properties") or {}).get(key, ANY)
        frames[-1] = ("obj", schema, seen, "value", key, tool)
        frames.append(("value", value))
        return True
    if phase == "after":
        if ch == ",":
            if _keys(grammar, schema, seen) == ():
                return None
            frames[-1] = ("obj", schema, seen, "next", None, tool)
            return True
        if ch == "}" and _complete(schema, seen):
            frames.pop()
            return _close_value(grammar, frames, None)
        return None
    return None


def strict_from_env() -> bool | str:
    """How ``TRACE_GYM_STRICT_TOOLS`` holds tool calls: False (``0``, unset: free),
    True (``1``: to their schemas) or ``"ids"`` (to their schemas, ids grounded)."""
    value = os.environ.get(STRICT_ENV, "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    if value == "ids":
        return "ids"
    raise LLMError(f"{STRICT_ENV} must be 1, ids or 0, got {value!r}")
