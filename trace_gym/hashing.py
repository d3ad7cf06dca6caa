"""Content hashes of env folders, so that a validation report can go stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

HASHED_FILES = ("env.py", "manifest.toml", "tools.json", "results.json")  # results.json: a target's frozen result shapes


UNHASHED_KEYS = (b"code_hash", b"agent =", b"agent=")


def code_hash(folder: Path) -> str:
    """sha256 over the files that define an env's behaviour (not its README or report).

    ``manifest.toml``'s own ``code_hash`` line is excluded so that writing the
    hash into the manifest does not change it, and so is its ``agent`` line
    (words for prompts: what the target's agent is), which no behaviour reads.
    """
    digest = hashlib.sha256()
    for name in HASHED_FILES:
        path = Path(folder) / name
        if not path.exists():
            continue
        data = path.read_bytes()
        if name == "manifest.toml":
            data = b"\n".join(line for line in data.splitlines() if not line.strip().startswith(UNHASHED_KEYS))
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
