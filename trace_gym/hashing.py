"""Content hashes of env folders, so that a validation report can go stale."""

from __future__ import annotations

import ast
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


def uses_world_kit(env_source: str) -> bool:
    """Whether env code imports the world kit (``import world``, ``from world import ...``)."""
    try:
        tree = ast.parse(env_source)
    except SyntaxError:
        return False
    return any(
        (isinstance(node, ast.Import) and any(a.name == "world" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.module == "world")
        for node in ast.walk(tree)
    )


def interface_hash(target_folder: Path, env_folder: Path) -> str:
    """What an env was judged against: its target's frozen interface (``code_hash`` of the
    target folder) and, for an env on the world kit, the kit's code, whose records and
    answers it plays. A validation report goes stale when this changes."""
    target = code_hash(target_folder)
    env = Path(env_folder) / "env.py"
    if not env.exists() or not uses_world_kit(env.read_text(encoding="utf-8")):
        return target
    from .sandbox import world  # local: keeps import trace_gym small

    kit = Path(world.__file__).read_bytes()
    return hashlib.sha256(target.encode() + b"\0world.py\0" + kit).hexdigest()
