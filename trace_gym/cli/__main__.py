"""``python -m trace_gym.cli``: the ``trace-gym`` command (.ci/validate-envs runs it so)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
