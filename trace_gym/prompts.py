"""Versioned prompt templates: ``<folder>/<name>_<version>.md``, filled with ``string.Template``.

Identification's analyst and synthesis's analyst each keep their templates in a
``prompts/`` folder beside their code; a new version is a new file, so a run's
provenance can name the exact text it was asked.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any


def prompt_text(folder: Path, name: str, version: str) -> str:
    """Template ``name`` of ``version``, as written."""
    return (folder / f"{name}_{version}.md").read_text(encoding="utf-8")


def render_prompt(folder: Path, name: str, version: str, /, **values: Any) -> str:
    """Template ``name`` of ``version`` with its ``$placeholders`` filled (a missing one raises KeyError)."""
    return string.Template(prompt_text(folder, name, version)).substitute(**values)
