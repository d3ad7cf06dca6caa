"""Wall time of `trace-gym validate` for one env over 100 seeds, per backend.

Target (issue #4): under 20 s on the 2-core CI machine.
With --hostile: wall time to judge hostile envs (a spinning reset, a spinning
step, an absurd max_steps that never ends) on bwrap; target (issue #10): any
env within 2 minutes.
Usage: python benchmarks/validation_time.py [ENV_ID | --hostile]
"""

from __future__ import annotations

import argparse

from trace_gym.sandbox import SandboxUnavailable, select_backend
from trace_gym.validation import ValidationConfig, validate


def main(env_id: str = "trace/structured-data-v0") -> None:
    for name in ("bwrap", "docker"):
        try:
            backend = select_backend(name)
        except SandboxUnavailable as exc:
            print(f"{name}: not available here ({exc})")
            continue
        report = validate(env_id, backend=backend, config=ValidationConfig(seeds=100), write=False)
        slowest = sorted(report.checks, key=lambda c: c.seconds, reverse=True)[:3]
        print(
            f"{env_id} on {name}: {report.wall_s:.1f} s for 100 seeds, {'passed' if report.passed else 'FAILED'}; "
            "slowest checks: " + ", ".join(f"{c.name} {c.seconds:.1f}s" for c in slowest)
        )


HOSTILE = {
    "spinning reset": {"rng = random.Random(seed)": "rng = random.Random(seed)\n        while True:\n            pass"},
    "spinning step": {
        '        if action["type"] == "tool_call":': '        while True:\n            pass\n        if action["type"] == "tool_call":'
    },
    "absurd max_steps, never ends": {
        "max_steps = 6": "max_steps = 10**9",
        'return {"observation": "Thanks!", "done": True}': 'return {"observation": "Thanks!", "done": False}',
    },
}


def hostile() -> None:
    import shutil
    import tempfile
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "envs" / "order-lookup"
    for name, replace in HOSTILE.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "hostile"
            shutil.copytree(fixture, folder)
            source = (folder / "env.py").read_text()
            for old, new in replace.items():
                source = source.replace(old, new)
            (folder / "env.py").write_text(source)
            report = validate(folder, backend="bwrap", write=False)
            print(
                f"{name}: judged in {report.wall_s:.1f} s on bwrap (target < 120 s), "
                f"{'passed' if report.passed else 'FAILED ' + ', '.join(report.failed())}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id", nargs="?", help="the env to validate (default: trace/structured-data-v0)")
    parser.add_argument(
        "--hostile",
        action="store_true",
        help="time the hostile envs (a spinning reset, a spinning step, an absurd max_steps) instead",
    )
    args = parser.parse_args()
    if args.hostile and args.env_id:
        parser.error("--hostile times its own envs: give it no env id")
    hostile() if args.hostile else main(args.env_id or "trace/structured-data-v0")
