"""report.md with PNG plots: ER+ and ER- with Wilson intervals, coverage, stability across runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .stats import SelectionConfig, wilson


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
    for offset, key, colour, label in ((-0.2, "plus", "tab:green", "ER+ (successes)"), (0.2, "minus", "tab:red", "ER- (failures)")):
        values = [pooled[n][key][0] for n in names]
        # The Wilson interval is not centred on the rate; a rate at 0 can sit just outside it.
        lows = [max(0.0, pooled[n][key][0] - pooled[n][key][1][0]) for n in names]
        highs = [max(0.0, pooled[n][key][1][1] - pooled[n][key][0]) for n in names]
        ax.bar([x + offset for x in xs], values, width=0.4, color=colour, label=label, yerr=[lows, highs], capsize=3)
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel("share LACKING where applicable")
    ax.set_title("Error rates averaged over runs, 95% Wilson intervals")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "error_rates.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 3.5))
    ax.bar(list(xs), [c.coverage_mean for c in caps], yerr=[c.coverage_std for c in caps], color="tab:blue", capsize=3)
    ax.axhline(config.rho, color="black", linestyle="--", label=f"rho = {config.rho}")
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel("coverage E- / |D-|")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "coverage.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 3.5))
    gaps = [[s.gap for run in result.runs for s in run if s.capability == n] for n in names]
    ax.boxplot(gaps)
    ax.set_xticks([x + 1 for x in xs], names, rotation=30, ha="right")
    ax.axhline(config.delta, color="black", linestyle="--", label=f"delta = {config.delta}")
    ax.set_ylabel("gap ER- - ER+ per run")
    ax.set_title(f"Stability over {len(result.runs)} runs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "stability.png", dpi=110)
    plt.close(fig)

    info = result.analyst
    lines = [
        "# Capability identification", "",
        f"Analyst **{info['analyst']}** on {info['trajectories']} trajectories ({info['successes']} successes, "
        f"{info['failures']} failures); {len(result.runs)} bootstrap runs; keep a capability when gap >= {config.delta} "
        f"and coverage >= {config.rho} in at least {config.min_runs} of {config.runs} runs. "
        f"Analyst calls: {info['calls']}, tokens: {info['tokens']}.", "",
        "## Selected", "",
    ]
    selected = [c for c in caps if c.selected]
    lines += [f"- **{c.name}**: {c.description}" for c in selected] or ["- none"]
    lines += ["", "## All candidates", "",
              "| capability | ER+ | ER- | gap (mean ± std) | coverage | runs passed | selected |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in caps:
        lines.append(f"| {c.name} | {c.er_plus_mean:.2f} | {c.er_minus_mean:.2f} | {c.gap_mean:.2f} ± {c.gap_std:.2f} | "
                     f"{c.coverage_mean:.2f} | {c.runs_passed}/{c.runs} | {'yes' if c.selected else 'no'} |")
    if result.agreement:
        lines += ["", "## Agreement with the gold-action analyst (Cohen's κ)", "", "| capability | κ |", "| --- | --- |"]
        lines += [f"| {k} | {'n/a' if v is None else f'{v:.2f}'} |" for k, v in result.agreement.items()]
    lines += ["", "![error rates](error_rates.png)", "", "![coverage](coverage.png)", "", "![stability](stability.png)", ""]
    (out / "report.md").write_text("\n".join(lines))


def _pooled(result: Any) -> dict[str, dict[str, tuple[float, tuple[float, float]]]]:
    """ER+ and ER- averaged over the runs, with Wilson intervals at one run's sample size."""
    out = {}
    for c in result.capabilities:
        rows = [s for run in result.runs for s in run if s.capability == c.name]
        runs = max(len(rows), 1)
        n_plus, e_plus = sum(r.n_plus for r in rows), sum(r.e_plus for r in rows)
        n_minus, e_minus = sum(r.n_minus for r in rows), sum(r.e_minus for r in rows)
        plus = (e_plus / n_plus if n_plus else 0.0, wilson(round(e_plus / runs), round(n_plus / runs)))
        minus = (e_minus / n_minus if n_minus else 0.0, wilson(round(e_minus / runs), round(n_minus / runs)))
        out[c.name] = {"plus": plus, "minus": minus}
    return out
