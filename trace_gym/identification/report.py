"""report.md with PNG plots: ER+ and ER- with Wilson intervals, coverage, stability across runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .stats import SelectionConfig, wilson


def _finish(plt: Any, fig: Any, ax: Any, xs: Any, names: list[str], ylabel: str, path: Path) -> None:
    """One capability per tick, the axis label and legend, saved and closed."""
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = SelectionConfig(**{k: v for k, v in result.analyst["config"].items()})
    caps = result.capabilities
    names = [c.name for c in caps]
    pooled = _pooled(result)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 4))
    xs = range(len(names))
    for offset, key, colour, label in (
        (-0.2, "plus", "tab:green", "ER+ (successes)"),
        (0.2, "minus", "tab:red", "ER- (failures)"),
    ):
        # An unknown rate (never applicable in that group) is drawn as no bar and marked "?".
        values = [pooled[n][key][0] or 0.0 for n in names]
        # The Wilson interval is not centred on the rate; a rate at 0 can sit just outside it.
        lows = [
            max(0.0, v - pooled[n][key][1][0]) if pooled[n][key][0] is not None else 0.0 for v, n in zip(values, names)
        ]
        highs = [
            max(0.0, pooled[n][key][1][1] - v) if pooled[n][key][0] is not None else 0.0 for v, n in zip(values, names)
        ]
        ax.bar([x + offset for x in xs], values, width=0.4, color=colour, label=label, yerr=[lows, highs], capsize=3)
        for x, n in zip(xs, names):
            if pooled[n][key][0] is None:
                ax.text(x + offset, 0.02, "?", ha="center", color=colour)
    ax.set_title("Error rates averaged over runs, 95% Wilson intervals")
    _finish(plt, fig, ax, xs, names, "share LACKING where applicable", out / "error_rates.png")

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 3.5))
    ax.bar(list(xs), [c.coverage_mean for c in caps], yerr=[c.coverage_std for c in caps], color="tab:blue", capsize=3)
    ax.axhline(config.rho, color="black", linestyle="--", label=f"rho = {config.rho}")
    _finish(plt, fig, ax, xs, names, "coverage E- / |D-|", out / "coverage.png")

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 3.5))
    gaps = [[s.gap for run in result.runs for s in run if s.capability == n and s.gap is not None] for n in names]
    ax.boxplot(gaps)
    ax.axhline(config.delta, color="black", linestyle="--", label=f"delta = {config.delta}")
    ax.set_title(f"Stability over {len(result.runs)} runs")
    _finish(plt, fig, ax, [x + 1 for x in xs], names, "gap ER- - ER+ per run", out / "stability.png")

    info = result.analyst
    made = len(result.runs)
    required = min(config.min_runs, made)
    lines = [
        "# Capability identification",
        "",
        f"Analyst **{info['analyst']}** on {info['trajectories']} trajectories of {info.get('tasks', '?')} tasks "
        f"({info['successes']} successes, {info['failures']} failures). "
        f"{made} of {config.runs} bootstrap runs made (each draws tasks with replacement and keeps all their episodes)"
        + (f"; {config.runs - made} drew no successes or no failures and were skipped" if made < config.runs else "")
        + f". A capability is kept when gap >= {config.delta} and coverage >= {config.rho} in at least "
        f"{required} of the {made} runs made"
        + (f" (K = {config.min_runs} asked)" if required < config.min_runs else "")
        + (
            f"; at most {config.max_selected} are selected, the largest mean gaps first"
            if config.max_selected is not None
            else ""
        )
        + f". Analyst calls: {info['calls']}, tokens: {info['tokens']}.",
        "",
        "## Selected",
        "",
    ]
    selected = [c for c in caps if c.selected]
    lines += [f"- **{c.name}**: {c.description}" for c in selected] or ["- none"]
    lines += [
        "",
        "## All candidates",
        "",
        "| capability | ER+ | ER- | gap (mean ± std) | coverage | runs passed | selected |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    unknown = []
    for c in caps:
        gap = "unknown" if c.gap_mean is None else f"{c.gap_mean:.2f} ± {c.gap_std:.2f}"
        lines.append(
            f"| {c.name} | {_rate(c.er_plus_mean)} | {_rate(c.er_minus_mean)} | {gap} | "
            f"{c.coverage_mean:.2f} | {c.runs_passed}/{c.runs} | {c.verdict} |"
        )
        if c.runs_gap_unknown:
            unknown.append(
                f"- **{c.name}**: ER+ or ER- unknown in {c.runs_gap_unknown} of {c.runs} runs (it never applied in "
                "a success, or in a failure, of that sample), so the gap was unknown and those runs could not keep it."
            )
    if unknown:
        lines += ["", "## Unknown rates", "", *unknown]
    if result.agreement:
        lines += [
            "",
            "## Agreement with the gold-action analyst (Cohen's κ)",
            "",
            "| capability | κ |",
            "| --- | --- |",
        ]
        lines += [f"| {k} | {'n/a' if v is None else f'{v:.2f}'} |" for k, v in result.agreement.items()]
    lines += [
        "",
        "![error rates](error_rates.png)",
        "",
        "![coverage](coverage.png)",
        "",
        "![stability](stability.png)",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))


def _rate(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def _pooled(result: Any) -> dict[str, dict[str, tuple[float | None, tuple[float, float]]]]:
    """ER+ and ER- averaged over the runs, with Wilson intervals at one run's sample size."""
    out = {}
    for c in result.capabilities:
        rows = [s for run in result.runs for s in run if s.capability == c.name]
        runs = max(len(rows), 1)
        n_plus, e_plus = sum(r.n_plus for r in rows), sum(r.e_plus for r in rows)
        n_minus, e_minus = sum(r.n_minus for r in rows), sum(r.e_minus for r in rows)
        plus = (e_plus / n_plus if n_plus else None, wilson(round(e_plus / runs), round(n_plus / runs)))
        minus = (e_minus / n_minus if n_minus else None, wilson(round(e_minus / runs), round(n_minus / runs)))
        out[c.name] = {"plus": plus, "minus": minus}
    return out
