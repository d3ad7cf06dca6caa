"""Sandbox start-up time and step round-trip latency per backend, against an
in-process call of the same env code.

Targets (issue #3): bwrap start-up < 150 ms and step p50 < 1 ms; docker
start-up < 1.5 s and step p50 < 2 ms. The in-process row executes the
trusted test fixture directly, which trace-gym itself never does with
synthesized code. Usage: python benchmarks/sandbox_latency.py [STEPS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from trace_gym.sandbox import SandboxUnavailable, SandboxWorker, select_backend

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "envs" / "order-lookup" / "env.py"
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
    for name in ("bwrap", "docker"):
        try:
            backend = select_backend(name)
        except SandboxUnavailable as exc:
            print(f"{name:<12}not available here: {exc}")
            continue
        start_times, step_times = sandboxed(backend, source, starts, steps)
        print(
            f"{name:<12}{statistics.median(start_times) * 1e3:>12.0f}ms"
            f"{statistics.median(step_times) * 1e3:>10.3f}ms{percentile(step_times, 0.99) * 1e3:>10.3f}ms"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
