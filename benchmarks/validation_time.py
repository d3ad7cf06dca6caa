"""Wall time of `trace-gym validate` for one env over 100 seeds, per backend.

Target (issue #4): under 20 s on the 2-core CI machine.
Usage: python benchmarks/validation_time.py [ENV_ID]
"""

from __future__ import annotations

import sys

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
        print(f"{env_id} on {name}: {report.wall_s:.1f} s for 100 seeds, {'passed' if report.passed else 'FAILED'}; "
              "slowest checks: " + ", ".join(f"{c.name} {c.seconds:.1f}s" for c in slowest))


if __name__ == "__main__":
    main(*sys.argv[1:])
