"""PlantedDeficitAgent: the oracle with known, seeded capability deficits.

Later stages (capability identification above all) are checked against this
known truth: which deficit fired in which episode is recorded in the
trajectory (``agent_info["deficits"]``). Deficits, each with a probability:

- ``corrupt_ids``: one id argument of a state-changing call is off by a digit
  (precise tool calls; the id names no record, so the tool answers with an
  error: valid tool arguments too);
- ``end_early``: the last state-changing call is never made (completing every
  requested action);
- ``omit_info``: the closing message leaves out what the user had to be told
  (communicating required information);
- ``skip_reads``: read calls before the first write are skipped. In τ² the
  write still succeeds, so this deficit does not cause failures: a negative
  control that a contrastive analysis must *not* select.

And one that is not a deficit of the outcome: ``fixes_error``, one call is
first made wrong (an id off by a digit, or an argument the tool does not take,
borrowed from another call of the script), answered with the tool's error, then
made right. The episode still succeeds. These are error-recovery demonstrations
for the warm start (``trace-gym sft`` learns nothing from a call the tool
refused, only what follows it); it rolls on a stream of its own, so adding it
changes no other deficit's draws.
"""

from __future__ import annotations

import random
import re
from typing import Any

from trace_gym.actions import ActionKind, format_tool_call, parse_action
from trace_gym.errors import TraceGymError
from trace_gym.tools import changes_state, is_read

from .oracle import OracleAgent

DEFICITS = ("corrupt_ids", "end_early", "omit_info", "skip_reads")
RECOVERY = "fixes_error"


class PlantedDeficitAgent(OracleAgent):
    name = "planted"

    def __init__(self, seed: int = 0, deficits: dict[str, float] | None = None, **_: Any):
        super().__init__()
        default = {"corrupt_ids": 0.3, "end_early": 0.3, "omit_info": 0.3}
        self.probabilities = dict(default if deficits is None else deficits)
        unknown = set(self.probabilities) - {*DEFICITS, RECOVERY}
        if unknown:
            raise TraceGymError(f"unknown deficits {sorted(unknown)}; known: {', '.join((*DEFICITS, RECOVERY))}")
        self._seed = seed
        self.fired: list[str] = []

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        super().reset(observation, info, env)
        # Seeded by string, not seeding.derive_seed: the identification tests' planted fixtures
        # (their selections over a few dozen episodes) were built on these draws.
        rng = random.Random(f"planted|{self._seed}|{info.get('task_id')}|{info.get('episode_seed')}")
        rolls = {name: rng.random() for name in DEFICITS}  # every deficit rolls, so switching one off changes no other
        drawn = [name for name in DEFICITS if rolls[name] < self.probabilities.get(name, 0.0)]
        criteria = (
            getattr(getattr(env.unwrapped, "_task", None), "evaluation_criteria", None) if env is not None else None
        )
        info_strings = list(getattr(criteria, "communicate_info", None) or [])
        self._script, self.fired = apply_deficits(self._script, drawn, info_strings, rng)
        recovery = random.Random(f"planted|{RECOVERY}|{self._seed}|{info.get('task_id')}|{info.get('episode_seed')}")
        if recovery.random() < self.probabilities.get(RECOVERY, 0.0):
            accepts = {
                t["function"]["name"]: set((t["function"].get("parameters") or {}).get("properties") or {})
                for t in info.get("tools") or []
                if "function" in t
            }
            self._script, fixed = insert_refused_call(self._script, recovery, accepts)
            self.fired += [RECOVERY] if fixed else []

    def info(self) -> dict[str, Any]:
        return {"deficits": list(self.fired), "probabilities": dict(self.probabilities)}


def apply_deficits(
    script: list[str], drawn: list[str], info_strings: list[str], rng: random.Random
) -> tuple[list[str], list[str]]:
    """The script with the drawn deficits applied, and those that took effect (a
    deficit needs something to act on: a write that is still made to corrupt,
    information to omit); only those are recorded as fired."""
    parsed = [parse_action(a) for a in script]
    writes = [i for i, p in enumerate(parsed) if p.is_tool_call and changes_state(p.tool_calls[0].name)]
    out = list(script)
    applied = []
    ends_early = "end_early" in drawn and bool(writes)
    # Only a write that is still made can carry a corrupted id: corrupting the
    # write that end_early drops would record a deficit that never acted.
    made = writes[:-1] if ends_early else writes
    if "corrupt_ids" in drawn and made:
        i = rng.choice(made)
        call = parsed[i].tool_calls[0]
        corrupted = corrupt_one_id(call.arguments, rng)
        if corrupted != call.arguments:
            out[i] = format_tool_call(call.name, corrupted)
            applied.append("corrupt_ids")
    if ends_early:
        out[writes[-1]] = None
        applied.append("end_early")
    reads_before = (
        [i for i in range(writes[0]) if parsed[i].is_tool_call and is_read(parsed[i].tool_calls[0].name)]
        if writes
        else []
    )
    if "skip_reads" in drawn and reads_before:
        for i in reads_before:
            out[i] = None
        applied.append("skip_reads")
    if "omit_info" in drawn and info_strings:
        for i, p in enumerate(parsed):
            if p.kind == ActionKind.MESSAGE and all(s in p.content for s in info_strings):
                content = p.content
                for s in info_strings:
                    content = content.replace(s, "(details on request)")
                out[i] = content
                applied.append("omit_info")
                break
    return [a for a in out if a is not None], applied


def insert_refused_call(
    script: list[str], rng: random.Random, accepts: dict[str, set[str]] | None = None
) -> tuple[list[str], bool]:
    """The script with one of its tool calls first made wrong, just before it is
    made right, and whether there was a call to do it to. Wrong means one id off by
    a digit or one argument the tool does not take (a name another call of the
    script uses, with its value; never one ``accepts``, tool name -> its parameters,
    says the tool takes): the mistakes a small policy makes."""
    accepts = accepts or {}
    parsed = [parse_action(a) for a in script]
    calls = [(i, p.tool_calls[0]) for i, p in enumerate(parsed) if p.is_tool_call and p.tool_calls]
    options = []
    for i, call in calls:
        corrupted = corrupt_one_id(call.arguments, rng)
        if corrupted != call.arguments:
            options.append((i, call.name, corrupted))
        taken = set(call.arguments) | accepts.get(call.name, set())
        borrowed = [(k, v) for _, other in calls for k, v in other.arguments.items() if k not in taken]
        if borrowed:
            key, value = rng.choice(borrowed)
            options.append((i, call.name, {**call.arguments, key: value}))
    if not options:
        return list(script), False
    i, name, wrong = rng.choice(options)
    return [*script[:i], format_tool_call(name, wrong), *script[i:]], True


def corrupt_one_id(arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Change one digit of one id-like argument (a string, or list of strings, with digits)."""
    candidates = [(k, None) for k, v in arguments.items() if isinstance(v, str) and re.search(r"\d", v)]
    candidates += [
        (k, j)
        for k, v in arguments.items()
        if isinstance(v, list)
        for j, x in enumerate(v)
        if isinstance(x, str) and re.search(r"\d", x)
    ]
    if not candidates:
        return arguments
    key, index = rng.choice(candidates)
    new = dict(arguments)
    if index is None:
        new[key] = _bump_digit(new[key])
    else:
        new[key] = list(new[key])
        new[key][index] = _bump_digit(new[key][index])
    return new


def _bump_digit(text: str) -> str:
    positions = [i for i, ch in enumerate(text) if ch.isdigit()]
    i = positions[-1]
    return text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :]
