"""Per-step overhead of trace-gym's text env against tau2's native get_response.

Replays the gold tool calls of τ²-retail tasks twice: once straight into
``tau2.environment.Environment.get_response`` and once as action text through
``gym.make("trace/tau2-retail-v0").step``. Scoring is excluded from both (it is
tau2's own code, run once per episode). Also prints what ``import trace_gym``
costs in a fresh interpreter. Usage: python benchmarks/step_overhead.py [TASKS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)


def main(n_tasks: int = 40, repeats: int = 3) -> None:
    import gymnasium as gym

    import trace_gym  # noqa: F401
    from trace_gym.actions import format_tool_call
    from trace_gym.targets.tau2 import import_tau2

    import_tau2()
    from tau2.data_model.message import ToolCall
    from tau2.registry import registry

    env = gym.make("trace/tau2-retail-v0", split="test")
    task_ids = env.unwrapped.task_ids[:n_tasks]
    tasks = {t.id: t for t in registry.get_tasks_loader("retail")(None)}
    native_times, ours_times = [], []
    steps = 0
    for _ in range(repeats):
        for tid in task_ids:
            gold = [a for a in tasks[tid].evaluation_criteria.actions if a.requestor == "assistant"]
            native = registry.get_env_constructor("retail")(solo_mode=False)
            t0 = time.perf_counter()
            for i, a in enumerate(gold):
                native.get_response(ToolCall(id=f"c{i}", name=a.name, arguments=a.arguments))
            native_times.append(time.perf_counter() - t0)
            env.reset(options={"task_id": tid})
            texts = [format_tool_call(a.name, a.arguments) for a in gold]
            t0 = time.perf_counter()
            for text in texts:
                env.step(text)
            ours_times.append(time.perf_counter() - t0)
            steps += len(gold)
    env.close()
    native_us = sum(native_times) / steps * 1e6
    ours_us = sum(ours_times) / steps * 1e6
    print(f"tool-call steps replayed: {steps} ({len(task_ids)} retail tasks x {repeats})")
    print(f"tau2 get_response:       {native_us:8.1f} us/step")
    print(f"trace-gym env.step(str): {ours_us:8.1f} us/step")
    print(f"overhead ratio:          {ours_us / native_us:8.2f}x  (+{ours_us - native_us:.1f} us/step)")

    code = "import time; t=time.perf_counter(); import trace_gym; print(time.perf_counter()-t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(5)
    ]
    print(f"import trace_gym (fresh interpreter, median of 5): {statistics.median(runs) * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "tasks", nargs="?", type=count, default=40, help="τ² tasks to step through (default: %(default)s)"
    )
    args = parser.parse_args()
    main(args.tasks)
