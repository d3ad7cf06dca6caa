"""The project's one seed formula: a 31-bit seed from the parts that name what it is for.

Every seed trace-gym derives (an episode's, a GRPO group's env seed, a redraw,
calibration's stream, a sampling seed per turn) is ``derive_seed`` of the run
seed and the parts that identify its use, so it depends on what is played, never
on the order things run in: a resumed or re-batched run draws the same seeds.
"""

from __future__ import annotations

import zlib

SEED_BITS = 31


def derive_seed(*parts: object) -> int:
    """``crc32`` of the parts joined by ``|``, to 31 bits (a seed every RNG we use takes)."""
    return zlib.crc32("|".join(map(str, parts)).encode()) & (2**SEED_BITS - 1)
