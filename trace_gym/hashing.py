"""Content hashes of env folders, so that a validation report can go stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

HASHED_FILES = (
    "env.py",
    "manifest.toml",
    "tools.json",
    "results.json",
)  # results.json: a target's frozen result shapes


def _hashed_manifest_lines(lines: list[bytes]) -> list[bytes]:
    """The manifest's lines but its ``code_hash`` line (under ``[provenance]``) and its
    top-level ``agent`` line (words for prompts); an ``agent`` key in a table such as
    ``[kwargs]``, which an env's constructor reads, stays hashed."""
    kept, top = [], True
    for line in lines:
        stripped = line.strip()
        top = top and not stripped.startswith(b"[")
        if stripped.startswith(b"code_hash") or (top and stripped.split(b"=", 1)[0].strip() == b"agent"):
            continue
        kept.append(line)
    return kept


def code_hash(folder: Path) -> str:
    """sha256 over the files that define an env's behaviour (not its README or report).

    ``manifest.toml``'s own ``code_hash`` line is excluded so that writing the
    hash into the manifest does not change it, and so is its top-level ``agent``
    line (words for prompts: what the target's agent is), which no behaviour reads.
    """
    digest = hashlib.sha256()
    for name in HASHED_FILES:
        path = Path(folder) / name
        if not path.exists():
            continue
        data = path.read_bytes()
        if name == "manifest.toml":
            data = b"\n".join(_hashed_manifest_lines(data.splitlines()))
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
