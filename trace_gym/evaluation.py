"""Evaluation: every method on the target's held-out split, in one table.

A *method* is a way to play the target: the base model, TRACE (routed
adapters), GRPO on the target, the merged adapter, the adapters' weights
summed, and the causal control (adapters of capabilities the contrast did not
select, routed the same way). Each is rolled out into its own trajectory file;
this module turns those files into figures: pass^1 with a Wilson interval,
pass^k, mean reward, a per-capability breakdown (tasks grouped by which
capability the gold analyst finds LACKING in the base model's episode),
routing accuracy against those gold labels, and each method's cost.

It reads trajectories and writes tables and plots; it never plays an episode
(the pipeline does, through the same rollout loop as everything else) and
never types a figure by hand.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .identification.stats import LACKING, wilson
from .trajectory import Trajectory

NO_CAPABILITY = "none"


@dataclass
class MethodResult:
    """The figures of one method over the held-out split."""

    method: str
    episodes: int
    tasks: int
    pass_1: float
    """Share of successful episodes (every sample counts)."""
    pass_1_ci: tuple[float, float]
    """95% Wilson interval of ``pass_1`` over episodes."""
    pass_k: dict[int, float]
    """τ²'s pass^k: the chance that k samples of a task all succeed."""
    mean_reward: float
    by_capability: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per capability: the tasks where the base model lacked it, and this method's pass^1 on them."""
    routing: dict[str, Any] | None = None
    """Routed methods: accuracy against the gold labels and the confusion counts."""
    cost: dict[str, Any] = field(default_factory=dict)
    """Training rollouts, analyst calls and wall time spent to build the method."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def capability_groups(base: Iterable[Trajectory], capabilities: Iterable[str], analyst: Any = None) -> dict[str, set[str]]:
    """Task ids where the base model's episode LACKS each capability (gold labels)."""
    from .identification.gold import GoldActionAnalyst

    analyst = analyst or GoldActionAnalyst()
    wanted = set(capabilities)
    groups: dict[str, set[str]] = {c: set() for c in wanted}
    for trajectory in base:
        for label in analyst.label(trajectory):
            if label.capability in wanted and label.label == LACKING and trajectory.task_id is not None:
                groups[label.capability].add(trajectory.task_id)
    return groups


def method_result(method: str, trajectories: list[Trajectory], *, groups: dict[str, set[str]] | None = None,
                  routed_capabilities: list[str] | None = None, cost: dict[str, Any] | None = None) -> MethodResult:
    from .rollout import summarize

    summary = summarize(trajectories, env_id=trajectories[0].env_id if trajectories else "", agent=method)
    successes = sum(t.success for t in trajectories)
    result = MethodResult(
        method=method,
        episodes=len(trajectories),
        tasks=len({t.task_id for t in trajectories}),
        pass_1=successes / len(trajectories) if trajectories else 0.0,
        pass_1_ci=wilson(successes, len(trajectories)) if trajectories else (0.0, 1.0),
        pass_k={int(k): v for k, v in summary.pass_hat_k.items()},
        mean_reward=summary.mean_reward,
        cost=dict(cost or {}),
    )
    for capability, tasks in sorted((groups or {}).items()):
        episodes = [t for t in trajectories if t.task_id in tasks]
        result.by_capability[capability] = {
            "tasks": len(tasks),
            "pass_1": (sum(t.success for t in episodes) / len(episodes)) if episodes else float("nan"),
        }
    if routed_capabilities is not None:
        result.routing = routing_accuracy(trajectories, groups or {}, routed_capabilities)
    return result


def gold_route(task_id: str | None, groups: dict[str, set[str]], routed_capabilities: list[str]) -> set[str]:
    """The routes that count as right for a task: the routable capabilities the base
    model lacked on it, or ``{"none"}`` when it lacked none of them."""
    lacking = {c for c in routed_capabilities if task_id in groups.get(c, set())}
    return lacking or {NO_CAPABILITY}


def routing_accuracy(trajectories: list[Trajectory], groups: dict[str, set[str]],
                     routed_capabilities: list[str]) -> dict[str, Any]:
    """Share of episodes whose routed capability is one the base model lacked on that
    task (or none when it lacked none), and a confusion matrix keyed by the first gold
    route (in ``routed_capabilities`` order) against the chosen one."""
    order = [*routed_capabilities, NO_CAPABILITY]
    confusion = {g: {r: 0 for r in order} for g in order}
    right = counted = 0
    for t in trajectories:
        route = (t.agent_info or {}).get("route")
        if not route:
            continue
        chosen = route.get("capability") or NO_CAPABILITY
        gold = gold_route(t.task_id, groups, routed_capabilities)
        first = next(c for c in order if c in gold)
        confusion[first][chosen if chosen in confusion[first] else NO_CAPABILITY] += 1
        right += chosen in gold
        counted += 1
    return {"accuracy": right / counted if counted else None, "episodes": counted, "labels": order, "confusion": confusion}


def results_table(results: list[MethodResult]) -> str:
    """The evaluation table as markdown."""
    ks = sorted({k for r in results for k in r.pass_k if k > 1})
    capabilities = sorted({c for r in results for c in r.by_capability})
    head = ["method", "episodes", "pass^1", "95% CI", *[f"pass^{k}" for k in ks], "mean reward",
            *[f"{c} (n={_group_size(results, c)})" for c in capabilities], "routing acc.", "train rollouts", "analyst calls", "wall s"]
    rows = [head, ["---"] * len(head)]
    for r in results:
        acc = r.routing.get("accuracy") if r.routing else None
        rows.append([
            r.method, str(r.episodes), f"{r.pass_1:.3f}", f"[{r.pass_1_ci[0]:.2f}, {r.pass_1_ci[1]:.2f}]",
            *[f"{r.pass_k[k]:.3f}" if k in r.pass_k else "-" for k in ks], f"{r.mean_reward:.3f}",
            *[_fmt(r.by_capability.get(c, {}).get("pass_1")) for c in capabilities],
            _fmt(acc), str(r.cost.get("train_rollouts", "-")), str(r.cost.get("analyst_calls", "-")),
            f"{r.cost['wall_s']:.0f}" if isinstance(r.cost.get("wall_s"), (int, float)) else "-",
        ])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"


def _group_size(results: list[MethodResult], capability: str) -> int:
    return next((int(r.by_capability[capability]["tasks"]) for r in results if capability in r.by_capability), 0)


def _fmt(value: float | None) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:.3f}"


def write_results(results: list[MethodResult], out_dir: str | Path, *, reward_curves: dict[str, Path] | None = None) -> list[Path]:
    """``results.json``, ``results.md`` and the plots, in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(results_table(results), encoding="utf-8")
    paths += plot_results(results, out, reward_curves or {})
    return paths


def plot_results(results: list[MethodResult], out: Path, reward_curves: dict[str, Path]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if results:
        fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(results)), 3.2))
        xs = range(len(results))
        ys = [r.pass_1 for r in results]
        err = [[r.pass_1 - r.pass_1_ci[0] for r in results], [r.pass_1_ci[1] - r.pass_1 for r in results]]
        ax.bar(xs, ys, yerr=err, capsize=4, color="#4c72b0")
        ax.set_xticks(list(xs), [r.method for r in results], rotation=20, ha="right")
        ax.set_ylim(0, 1)
        ax.set_ylabel("pass^1 (95% Wilson)")
        ax.set_title("Held-out pass rate per method")
        fig.tight_layout()
        paths.append(out / "pass_rate.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    curves = {name: _read_curve(path) for name, path in sorted(reward_curves.items())}
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for name, points in curves.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
        ax.set_xlabel("rollouts")
        ax.set_ylabel("mean reward")
        ax.set_title("Training reward per adapter")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "reward_curves.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    routed = next((r for r in results if r.routing and r.routing.get("episodes")), None)
    if routed:
        labels = routed.routing["labels"]
        matrix = [[routed.routing["confusion"][g][c] for c in labels] for g in labels]
        fig, ax = plt.subplots(figsize=(1 + 0.8 * len(labels), 1 + 0.8 * len(labels)))
        ax.imshow(matrix, cmap="Blues")
        for i, row in enumerate(matrix):
            for j, n in enumerate(row):
                ax.text(j, i, str(n), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("routed to")
        ax.set_ylabel("gold (lacking in the base model)")
        ax.set_title(f"Routing ({routed.method})")
        fig.tight_layout()
        paths.append(out / "routing_confusion.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _read_curve(train_log: Path) -> list[tuple[float, float]]:
    """(rollouts so far, mean reward) per iteration from a ``train_log.jsonl``."""
    points = []
    try:
        lines = Path(train_log).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "mean_reward" in row and "rollouts" in row:
            points.append((float(row["rollouts"]), float(row["mean_reward"])))
    return points
