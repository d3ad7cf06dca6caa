"""The ``report`` verb: pass rate and mean reward per trajectory file."""

from __future__ import annotations

import argparse

from .common import format_table


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the ``report`` verb to ``sub``, the top parser's subcommands."""
    report = sub.add_parser("report", help="a table of pass rate and mean reward per trajectory file")
    report.add_argument("files", nargs="+")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ..rollout import summarize
    from ..store import read_trajectories

    rows = []
    for path in args.files:
        trajectories = read_trajectories(path)
        groups: dict[tuple[str, str], list] = {}
        for t in trajectories:
            groups.setdefault((t.agent, t.env_id), []).append(t)
        for (agent, env_id), group in sorted(groups.items()):
            s = summarize(group, env_id=env_id, agent=agent)
            rows.append(
                {
                    "agent": agent,
                    "env": env_id,
                    "episodes": str(s.episodes),
                    "pass rate": f"{s.successes / max(s.episodes, 1):.3f}",
                    "mean reward": f"{s.mean_reward:.3f}",
                    "file": path,
                }
            )
    print(format_table(rows, ["agent", "env", "episodes", "pass rate", "mean reward", "file"]))
    return 0
