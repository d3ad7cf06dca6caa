"""The figures of each evaluated method, from its trajectory files.

A *method* (``methods.py``) is a way to play the target; each is rolled out
into its own trajectory file and this module turns those files into figures:
pass^1 with a Wilson interval, pass^k, mean reward, per-task flips against the
base policy (solved by the method and failed by base, and the reverse), per
capability the LACKING rate of the method's own held-out episodes with an
interval (labelled by the run's analyst: gold, milestone or an LLM's) and
pass^1 on the tasks where base lacked it, specificity (the change on the
capabilities a method targets against the change on the others), routing
accuracy only where a truth exists to measure it against, and each method's
cost.

It reads trajectories and writes tables and plots; it never plays an episode
(evaluation does, through the same rollout loop as everything else) and never
types a figure by hand.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..artifacts import ArtifactError, SCHEMA_VERSION, check_version, from_row, read_json, write_json
from ..identification.gold import GoldActionAnalyst
from ..identification.stats import LACKING, NOT_APPLICABLE, wilson
from ..rollout import summarize
from ..trajectory import Trajectory

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
    """Routed methods: accuracy against the gold labels and the confusion counts; accuracy
    None where no truth exists (an analyst other than gold labels the base episodes)."""
    cost: dict[str, Any] = field(default_factory=dict)
    """Training rollouts, analyst calls and wall time spent to build the method."""
    lacking: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per capability, over this method's held-out episodes: episodes labelled, LACKING count,
    rate and its 95% Wilson interval."""
    flips: dict[str, list[str]] = field(default_factory=dict)
    """Against base, per task (pass^1 over its samples above or below base's): ``gained``, ``lost``."""
    specificity: dict[str, float | None] = field(default_factory=dict)
    """Mean change of the LACKING rate against base on the capabilities it targets and on the others."""
    note: str = ""
    """What a reader must know about the row (e.g. that another method's episodes stand for it)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> "MethodResult":
        result = from_row(cls, row, "results.json row")
        result.pass_1_ci = tuple(result.pass_1_ci)  # type: ignore[assignment]
        result.pass_k = {int(k): v for k, v in result.pass_k.items()}
        return result


RESULTS_FILE = "results.json"


def capability_groups(
    base: Iterable[Trajectory], capabilities: Iterable[str], analyst: Any = None
) -> dict[str, set[str]]:
    """Task ids where the base model's episode LACKS each capability (gold labels)."""
    analyst = analyst or GoldActionAnalyst()
    wanted = set(capabilities)
    groups: dict[str, set[str]] = {c: set() for c in wanted}
    for trajectory in base:
        for label in analyst.label(trajectory):
            if label.capability in wanted and label.label == LACKING and trajectory.task_id is not None:
                groups[label.capability].add(trajectory.task_id)
    return groups


def method_result(
    method: str,
    trajectories: list[Trajectory],
    *,
    groups: dict[str, set[str]] | None = None,
    routed_capabilities: list[str] | None = None,
    cost: dict[str, Any] | None = None,
) -> MethodResult:
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
        if groups and set(routed_capabilities) <= set(groups):
            result.routing = routing_accuracy(trajectories, groups, routed_capabilities)
        else:  # nothing says which route was right: count the routes, claim no accuracy
            routes = [
                ((t.agent_info or {}).get("route") or {}).get("capability") or NO_CAPABILITY for t in trajectories
            ]
            result.routing = {
                "accuracy": None,
                "episodes": 0,
                "routed": {c: routes.count(c) for c in sorted(set(routes))},
                "note": "no truth to measure routing against: base's episodes were not labelled for every "
                "routed capability by a rule-based analyst (gold, milestone, reference)",
            }
    return result


def lacking_rates(labels: Iterable[Any], capabilities: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per capability, the share of the episodes where it applies (PRESENT or LACKING, as
    identification counts) that lack it, with a 95% Wilson interval; ``not_applicable``
    counts the others (a method that stops attempting writes is not credited for it)."""
    out = {}
    labels = list(labels)
    for capability in capabilities:
        mine = [x for x in labels if x.capability == capability]
        applicable = [x for x in mine if x.label != NOT_APPLICABLE]
        lacking = sum(x.label == LACKING for x in applicable)
        out[capability] = {
            "episodes": len(applicable),
            "lacking": lacking,
            "not_applicable": len(mine) - len(applicable),
            "rate": lacking / len(applicable) if applicable else None,
            "ci": list(wilson(lacking, len(applicable))) if applicable else None,
        }
    return out


def task_flips(base: list[Trajectory], method: list[Trajectory]) -> dict[str, list[str]]:
    """Tasks the method solves more often than base (``gained``) and less often (``lost``)."""

    def rates(trajectories: list[Trajectory]) -> dict[str, float]:
        by_task: dict[str, list[bool]] = {}
        for t in trajectories:
            by_task.setdefault(str(t.task_id), []).append(bool(t.success))
        return {k: sum(v) / len(v) for k, v in by_task.items()}

    before, after = rates(base), rates(method)
    common = sorted(set(before) & set(after))
    return {"gained": [k for k in common if after[k] > before[k]], "lost": [k for k in common if after[k] < before[k]]}


def specificity(base: MethodResult, method: MethodResult, targeted: Iterable[str]) -> dict[str, float | None]:
    """Mean change (method - base) of the LACKING rate on the targeted capabilities and on
    the others: a capability adapter should lower the first more than the second."""
    targeted = set(targeted)

    def mean_change(names: list[str]) -> float | None:
        changes = [
            method.lacking[c]["rate"] - base.lacking[c]["rate"]
            for c in names
            if c in base.lacking
            and c in method.lacking
            and base.lacking[c]["rate"] is not None
            and method.lacking[c]["rate"] is not None
        ]
        return sum(changes) / len(changes) if changes else None

    names = sorted(method.lacking)
    return {
        "targeted": mean_change([c for c in names if c in targeted]),
        "untargeted": mean_change([c for c in names if c not in targeted]),
    }


def load_results(path: str | Path) -> list[MethodResult]:
    """``results.json`` of an evaluation (a folder holding it, or the file)."""
    path = Path(path)
    path = path / RESULTS_FILE if path.is_dir() else path
    payload = read_json(path, "trace-gym evaluate")
    if isinstance(payload, list):  # written before versioning: the rows alone
        payload = {"results": payload}
    if not isinstance(payload, dict):
        raise ArtifactError(f"{path}: expected evaluation's object, got a {type(payload).__name__}")
    check_version(payload, path)
    return [MethodResult.from_dict(row) for row in payload.get("results") or []]


def gold_route(task_id: str | None, groups: dict[str, set[str]], routed_capabilities: list[str]) -> set[str]:
    """The routes that count as right for a task: the routable capabilities the base
    model lacked on it, or ``{"none"}`` when it lacked none of them."""
    lacking = {c for c in routed_capabilities if task_id in groups.get(c, set())}
    return lacking or {NO_CAPABILITY}


def routing_accuracy(
    trajectories: list[Trajectory], groups: dict[str, set[str]], routed_capabilities: list[str]
) -> dict[str, Any]:
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
    return {
        "accuracy": right / counted if counted else None,
        "episodes": counted,
        "labels": order,
        "confusion": confusion,
    }


def results_table(results: list[MethodResult]) -> str:
    """The evaluation tables as markdown: one row per method, then, where capabilities
    were measured, their LACKING rates and pass^1 on the tasks base lacked them on."""
    ks = sorted({k for r in results for k in r.pass_k if k > 1})
    has_flips = any(r.flips for r in results)
    head = [
        "method",
        "episodes",
        "pass^1",
        "95% CI",
        *[f"pass^{k}" for k in ks],
        "mean reward",
        *(["tasks +/- vs base"] if has_flips else []),
        "routing acc.",
        "train rollouts",
        "analyst calls",
        "wall s",
    ]
    rows = [head, ["---"] * len(head)]
    for r in results:
        acc = r.routing.get("accuracy") if r.routing else None
        routing = "-" if r.routing is None else _fmt(acc) if acc is not None else "n/a"
        rows.append(
            [
                r.method,
                str(r.episodes),
                f"{r.pass_1:.3f}",
                f"[{r.pass_1_ci[0]:.2f}, {r.pass_1_ci[1]:.2f}]",
                *[f"{r.pass_k[k]:.3f}" if k in r.pass_k else "-" for k in ks],
                f"{r.mean_reward:.3f}",
                *(
                    [f"+{len(r.flips.get('gained', []))} / -{len(r.flips.get('lost', []))}" if r.flips else "-"]
                    if has_flips
                    else []
                ),
                routing,
                str(r.cost.get("train_rollouts", "-")),
                str(r.cost.get("analyst_calls", "-")),
                f"{r.cost['wall_s']:.0f}" if isinstance(r.cost.get("wall_s"), (int, float)) else "-",
            ]
        )
    text = _markdown(rows)
    notes = [f"- {r.method}: {r.note}" for r in results if r.note]
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    capabilities = sorted({c for r in results for c in (*r.lacking, *r.by_capability)})
    if capabilities:
        head = [
            "method",
            *[f"{c}: LACKING (95% CI)" for c in capabilities if any(c in r.lacking for r in results)],
            *[
                f"{c}: pass^1 where base lacked it (n={_group_size(results, c)})"
                for c in capabilities
                if any(c in r.by_capability for r in results)
            ],
            *(["LACKING change: targeted / other"] if any(r.specificity for r in results) else []),
        ]
        rows = [head, ["---"] * len(head)]
        for r in results:
            rows.append(
                [
                    r.method,
                    *[_rate(r.lacking.get(c)) for c in capabilities if any(c in x.lacking for x in results)],
                    *[
                        _fmt(r.by_capability.get(c, {}).get("pass_1"))
                        for c in capabilities
                        if any(c in x.by_capability for x in results)
                    ],
                    *(
                        [
                            f"{_signed(r.specificity.get('targeted'))} / {_signed(r.specificity.get('untargeted'))}"
                            if r.specificity
                            else "-"
                        ]
                        if any(x.specificity for x in results)
                        else []
                    ),
                ]
            )
        text += "\n" + _markdown(rows)
    return text


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"


def _rate(figures: dict[str, Any] | None) -> str:
    if not figures or figures.get("rate") is None:
        return "-"
    low, high = figures["ci"]
    return f"{figures['rate']:.2f} [{low:.2f}, {high:.2f}] (n={figures['episodes']})"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _group_size(results: list[MethodResult], capability: str) -> int:
    return next((int(r.by_capability[capability]["tasks"]) for r in results if capability in r.by_capability), 0)


def _fmt(value: float | None) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:.3f}"


def write_results(
    results: list[MethodResult], out_dir: str | Path, *, reward_curves: dict[str, Path] | None = None
) -> list[Path]:
    """``results.json``, ``results.md`` and the plots, in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    paths = [out / RESULTS_FILE, out / "results.md"]
    write_json(paths[0], {"version": SCHEMA_VERSION, "results": [r.as_dict() for r in results]})
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
