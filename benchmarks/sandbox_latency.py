"""Sandbox start-up time and step round-trip latency per backend, against an
in-process call of the same env code.

Targets (issue #3, kept by issue #9): bwrap start-up < 150 ms and step p50
< 1 ms; docker start-up < 1.5 s and step p50 < 2 ms; the script says whether
each is met and prints the load average (timings on a loaded machine are
inflated). Start-up includes the host's static gate and RestrictedPython
compile of the env, which are cached per source after the first worker. The in-process row executes the
trusted test fixture directly, which trace-gym itself never does with
synthesized code. Usage: python benchmarks/sandbox_latency.py [STEPS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from trace_gym.sandbox import SandboxUnavailable, SandboxWorker, select_backend
from trace_gym.cli import count

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "envs" / "order-lookup" / "env.py"
TARGETS = {"bwrap": (0.150, 0.001), "docker": (1.5, 0.002)}  # start-up p50, step p50 (seconds)
ACTION = {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": "#W0000000"}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process(source: str, steps: int) -> list[float]:
    namespace: dict = {}
    exec(compile(source, "env.py", "exec"), namespace)  # trusted fixture, benchmark baseline only
    env = namespace["Environment"]()
    env.reset(0, False)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        env.step(ACTION)
        times.append(time.perf_counter() - t0)
    return times


def sandboxed(backend, source: str, starts: int, steps: int) -> tuple[list[float], list[float]]:
    SandboxWorker(source, backend=backend).close()  # warm: rootfs, image, page cache
    start_times = []
    for _ in range(starts):
        t0 = time.perf_counter()
        worker = SandboxWorker(source, backend=backend)
        start_times.append(time.perf_counter() - t0)
        worker.close()
    worker = SandboxWorker(source, backend=backend)
    worker.call("reset", seed=0, hint=False)
    step_times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        worker.call("step", action=ACTION)
        step_times.append(time.perf_counter() - t0)
    worker.close()
    return start_times, step_times


def main(steps: int = 2000, starts: int = 10) -> None:
    source = FIXTURE.read_text()
    base = in_process(source, steps)
    print(f"{'backend':<12}{'start-up p50':>14}{'step p50':>12}{'step p99':>12}")
    print(f"{'in-process':<12}{'-':>14}{statistics.median(base) * 1e3:>10.3f}ms{percentile(base, 0.99) * 1e3:>10.3f}ms")
    verdicts = []
    for name in ("bwrap", "docker"):
        try:
            backend = select_backend(name)
        except SandboxUnavailable as exc:
            print(f"{name:<12}not available here: {exc}")
            continue
        start_times, step_times = sandboxed(backend, source, starts, steps)
        start_p50, step_p50 = statistics.median(start_times), statistics.median(step_times)
        print(
            f"{name:<12}{start_p50 * 1e3:>12.0f}ms{step_p50 * 1e3:>10.3f}ms{percentile(step_times, 0.99) * 1e3:>10.3f}ms"
        )
        verdicts.append(
            f"{backend.describe()}: start-up p50 {start_p50 * 1e3:.0f} ms "
            f"({'meets' if start_p50 < TARGETS[name][0] else 'MISSES'} < {TARGETS[name][0] * 1e3:.0f} ms), "
            f"step p50 {step_p50 * 1e3:.3f} ms ({'meets' if step_p50 < TARGETS[name][1] else 'MISSES'} < {TARGETS[name][1] * 1e3:.0f} ms)"
        )
    load = os.getloadavg()[0]
    for line in verdicts:
        print(line)
    print(
        f"load average {load:.1f} on {os.cpu_count()} CPUs"
        + (
            "  (a loaded machine: figures are inflated; re-take on an idle one)"
            if load > 0.5 * (os.cpu_count() or 1)
            else ""
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=count, default=2000, help="steps per measurement (default: %(default)s)"
    )
    args = parser.parse_args()
    main(args.steps)
