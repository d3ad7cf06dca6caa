"""The training log of a run: ``train_log.jsonl`` (one line per iteration) and its
reward curve (``reward_curve.png``).

Each line is written and fsynced as soon as its iteration's optimizer step is
done, so a run killed at any moment keeps every finished iteration. On
``--resume`` the log is cut back to the iterations the checkpoint holds, so a
replayed iteration never appears twice. Nothing here trains or plays episodes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class TrainLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> list[dict[str, Any]]:
        """The complete lines (a line cut short by a kill is dropped)."""
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("iteration"), int):
                rows.append(row)
        return rows

    def truncate_to(self, iteration: int) -> list[dict[str, Any]]:
        """Keep the lines of iterations 1..``iteration`` (once each); returns them."""
        kept: dict[int, dict[str, Any]] = {}
        for row in self.read():
            if row["iteration"] <= iteration:
                kept[row["iteration"]] = row
        rows = [kept[i] for i in sorted(kept)]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, self.path)
        return rows

    def append(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def plot_reward_curve(rows: list[dict[str, Any]], out: str | Path, title: str = "") -> Path | None:
    """Mean reward per iteration against rollouts so far; None when there is nothing to plot."""
    points = [(r["rollouts"], r["mean_reward"]) for r in rows if r.get("mean_reward") is not None]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs, ys = zip(*points)
    ax.plot(xs, ys, marker="o", linewidth=1.5)
    ax.set_xlabel("rollouts")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
