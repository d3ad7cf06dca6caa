"""The ``trace-gym`` command line: parse, call the library, print.

A mistake of the user's (an unknown id, a bad path, an unreachable endpoint)
prints one line, ``trace-gym: error: ...``, and exits 2; never a traceback.

One module per group of verbs, each with the parsers it adds (``add_commands``) and its
``cmd_*`` functions: envs.py (envs, targets), loop.py (rollout, validate, identify,
synthesize, run, evaluate, route), serve.py, training.py (train, sft, baseline gepa),
report.py; common.py holds what several of them share.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Sequence

from ..errors import TraceGymError
from . import envs, loop, report, serve, training
from .common import count, format_table


__all__ = ["build_parser", "count", "format_table", "main"]


_WARNED: set[str] = set()


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """``warnings.showwarning`` for the command line: a warning the filters let through is
    one line without its source line, and each text is said once a command (a registry
    read by several callers warned of one broken folder three times)."""
    from ..text import printable

    kind = "" if category is UserWarning else f"{category.__name__}: "
    text = f"trace-gym: warning: {kind}{printable(str(message)).removeprefix('trace-gym: ')}"
    if text not in _WARNED:
        _WARNED.add(text)
        print(text, file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    previous, warnings.showwarning = warnings.showwarning, _one_line_warning
    _WARNED.clear()
    try:
        return _run(argv)
    finally:
        warnings.showwarning = previous  # (a program that calls main() keeps its own hook)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TraceGymError as exc:
        from ..text import printable  # env code's text can reach an error: no control characters

        print(f"trace-gym: error: {printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trace-gym: interrupted; finished episodes are saved, rerun with --resume to continue", file=sys.stderr)
        return 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line too (subcommand parsers inherit the class)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"trace-gym: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="trace-gym",
        description="TRACE: capability-targeted training environments for tool-using agents.",
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    # One module a group of verbs; called in the order `trace-gym --help` lists them.
    envs.add_commands(sub)  # envs, targets
    loop.add_commands(sub)  # rollout, validate, identify, synthesize, run, evaluate, route
    serve.add_commands(sub)  # serve
    training.add_commands(sub)  # train, sft, baseline
    report.add_commands(sub)  # report
    return parser
