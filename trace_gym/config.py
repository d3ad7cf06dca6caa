"""Settings from TOML onto documented dataclasses, with one-line errors that name the field.

Each stage of the pipeline keeps its settings in one dataclass, defined beside
the stage (``ValidationConfig``, ``SelectionConfig``, ...), each field
documented once where it is defined. A TOML table maps onto such a dataclass
field by field: an unknown key, a value of the wrong type or a missing
required value is a :class:`ConfigError` naming ``[section] key``, raised
before any work starts. This module knows nothing of the stages themselves.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from .errors import TraceGymError

T = TypeVar("T")


class ConfigError(TraceGymError):
    """A pipeline config that cannot be used: its message names the file and the field."""


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder, not a config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def from_table(cls: type[T], table: Any, section: str) -> T:
    """Build dataclass ``cls`` from a TOML table, checking every key and type."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"[{section}] {unknown[0]}: unknown setting; known: {', '.join(sorted(fields))}")
    values = {}
    for name, value in table.items():
        values[name] = _coerce(value, hints[name], f"[{section}] {name}")
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"[{section}] {missing[0]}: required")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{section}]: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a table, got {value!r}")
        inner = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, inner, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return from_table(hint, value, where.strip("[]").replace("] ", "."))  # "[train] lora" -> [train.lora]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be a whole number, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a path string, got {value!r}")
        return Path(value)
    return value


def to_table(obj: Any) -> dict[str, Any]:
    """A dataclass as a plain, TOML/JSON-friendly dict (for stage hashes and reports)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            value = to_table(value)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
