"""What a policy does on a τ² target, by behaviour: how far a warm start gets before it fails.

Reads trajectory files that `trace-gym rollout` wrote (one column each, to compare two
policies on the same tasks) and prints, per file:
- tasks solved, with a 95% Wilson interval;
- episodes where the user was found (a `find_user_id_*` call answered without an error:
  retail's tools; airline has none (its users give their id), so it reads 0 there);
- tool calls, and those the target answered with an error;
- calls that repeat one made earlier in the episode (same tool, same arguments): a
  policy stuck in a loop of reads;
- writes (state-changing calls) and those answered with an error (which changed nothing);
  of the writes that went through, the episodes with one and those with a tool the task's
  gold actions use;
- episodes the agent gave up (unparsable turns, or past its context), and how all ended;
- the gold analyst's LACKING share per capability (of the episodes where it applies).

The figures of `trace_gym/llm/warm_starts/*/README.md` are these, on the quickstart's
rollout settings (greedy, the train split's first 16 tasks, 16 steps, 128 tokens a turn):

    trace-gym rollout --env trace/tau2-retail-v0 --agent llm --model smollm2-135m-tau2-retail-sft \\
        --split train --tasks 16 --max-steps 16 --max-new-tokens 128 --batch 8 --out runs/play/new.jsonl
    python benchmarks/warm_start_play.py runs/play/old.jsonl runs/play/new.jsonl

(`--adapter FOLDER` plays an SFT checkpoint before it is shipped.) Reading takes seconds;
playing 16 such episodes about 8 minutes here.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.errors import TraceGymError  # noqa: E402
from trace_gym.identification.gold import GoldActionAnalyst  # noqa: E402
from trace_gym.identification.stats import LACKING, NOT_APPLICABLE, wilson  # noqa: E402
from trace_gym.store import read_trajectories  # noqa: E402
from trace_gym.tools import changes_state  # noqa: E402
from trace_gym.trajectory import Trajectory  # noqa: E402


def behaviour(trajectories: list[Trajectory], gold: GoldActionAnalyst) -> dict[str, str]:
    n = len(trajectories)
    solved = sum(t.success for t in trajectories)
    low, high = wilson(solved, n)
    found = calls = errors = repeats = writes = failed_writes = with_write = right_tool = 0
    ends: collections.Counter[str] = collections.Counter()
    lacking: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in trajectories:
        failed_calls = {m.tool_call_id for m in t.messages if m.role == "tool" and m.error}
        gold_tools = {a.name for a in (gold.task(t).evaluation_criteria.actions or []) if a.requestor == "assistant"}
        episode_writes = 0  # that went through
        user_found = False
        made: set[tuple[str, str]] = set()
        for m in t.messages:
            if m.role != "assistant" or not m.tool_calls:
                continue
            for call in m.tool_calls:
                calls += 1
                failed = call.id in failed_calls
                errors += failed
                call_key = (call.name, json.dumps(call.arguments, sort_keys=True, default=str))
                repeats += call_key in made
                made.add(call_key)
                user_found |= call.name.startswith("find_user_id") and not failed
                if changes_state(call.name):
                    writes += 1
                    failed_writes += failed
                    episode_writes += not failed
                    right_tool += not failed and call.name in gold_tools
        found += user_found
        with_write += episode_writes > 0
        ends[t.termination_reason or "?"] += 1
        for label in gold.label(t):
            if label.label != NOT_APPLICABLE:
                lacking[label.capability][0] += label.label == LACKING
                lacking[label.capability][1] += 1
    rows = {
        "episodes": str(n),
        "tasks solved": f"{solved} ({solved / max(n, 1):.2f} [{low:.2f}, {high:.2f}])",
        "user found (a find_user_id_* call answered)": str(found),
        "tool calls / answered with an error": f"{calls} / {errors}",
        "calls repeating an earlier call of the episode": str(repeats),
        "writes / answered with an error": f"{writes} / {failed_writes}",
        "episodes with a write that went through": str(with_write),
        "writes through with a gold action's tool": str(right_tool),
        "given up (agent_error: unparsable turns, or past the context)": str(ends["agent_error"]),
        "ended by": ", ".join(f"{r} {c}" for r, c in sorted(ends.items())),
    }
    for capability, (bad, applies) in sorted(lacking.items()):
        rows[f"LACKING {capability}"] = f"{bad} / {applies}"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trajectories", nargs="+", help="trajectory files of a τ² target (trace-gym rollout --out)")
    args = parser.parse_args()
    gold = GoldActionAnalyst()
    try:
        columns = {path: behaviour(read_trajectories(path), gold) for path in args.trajectories}
    except (OSError, TraceGymError) as exc:  # no such file, not a trajectory file, not a τ² target's episodes
        raise SystemExit(f"warm_start_play.py: {str(exc).splitlines()[0]}") from None
    names = list(dict.fromkeys(row for rows in columns.values() for row in rows))
    width = max(map(len, names))
    print(f"{'':{width}}  " + "  |  ".join(Path(p).name for p in args.trajectories))
    for name in names:
        print(f"{name:{width}}  " + "  |  ".join(rows.get(name, "-") for rows in columns.values()))


if __name__ == "__main__":
    main()
