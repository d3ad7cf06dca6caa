"""The gold-action analyst: labels from the differences between the agent's
tool calls and the task's gold actions. No LLM, so it is exact, free and
reproducible; it needs a target whose tasks carry gold actions (τ²-bench).

Its dictionary of capabilities is fixed, each decided from the record alone:
"""

from __future__ import annotations

import json
from typing import Any

from trace_gym.errors import TraceGymError
from trace_gym.registry import get_entry
from trace_gym.targets.tau2 import import_tau2
from trace_gym.tools import changes_state, is_read
from trace_gym.trajectory import Trajectory

from .stats import LACKING, NOT_APPLICABLE, PRESENT, Label

GOLD_CAPABILITIES = {
    "precise_arguments": "Call state-changing tools with exactly the right argument values (ids with their prefixes, item lists, payment method ids).",
    "complete_actions": "Carry out every state-changing action the request needs before the conversation ends.",
    "communicates_required_info": "Tell the user the information the task requires (amounts, counts, statuses) in a message.",
    "read_before_write": "Read the records a state-changing action depends on before making it.",
    "well_formed_calls": "Write tool calls that parse: valid JSON with a name and an arguments object.",
    "valid_tool_arguments": "Call tools with arguments they accept (the names their schema takes, values they can "
    "use), so that no call is answered with an error.",
    "no_unrequested_writes": "Make no state-changing call that the request does not need.",
}


class GoldActionAnalyst:
    name = "gold"

    def __init__(self):
        self._tasks: dict[str, dict[str, Any]] = {}
        self.calls = 0
        self.tokens = 0

    def capabilities(self) -> dict[str, str]:
        return dict(GOLD_CAPABILITIES)

    def task(self, trajectory: Trajectory):
        domain = get_entry(trajectory.env_id).kwargs.get("domain")
        if domain is None:
            raise TraceGymError(f"the gold analyst needs a τ²-bench target; {trajectory.env_id} has no gold actions")
        if domain not in self._tasks:
            import_tau2()
            from tau2.registry import registry

            self._tasks[domain] = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
        task = self._tasks[domain].get(trajectory.task_id)
        if task is None:
            raise TraceGymError(
                f"{trajectory.env_id} has no task '{trajectory.task_id}' (episode {trajectory.episode_id})"
            )
        return task

    def label(self, trajectory: Trajectory) -> list[Label]:
        criteria = self.task(trajectory).evaluation_criteria
        gold = [(a.name, a.arguments) for a in (criteria.actions or []) if a.requestor == "assistant"]
        return label_against(trajectory, gold, list(criteria.communicate_info or []))


def label_against(trajectory: Trajectory, gold: list[tuple[str, dict[str, Any]]], info: list[str]) -> list[Label]:
    """The dictionary's labels of one episode against a reference solution: its tool calls
    (name, arguments), in order, and what it must tell the user (``info``)."""
    gold_writes = [g for g in gold if changes_state(g[0])]
    calls = [
        (i, c)
        for i, m in enumerate(trajectory.messages)
        if m.role == "assistant" and m.tool_calls and m.requestor == "assistant"
        for c in m.tool_calls
    ]
    writes = [(i, c) for i, c in calls if changes_state(c.name)]
    said = (
        " ".join((m.content or "") for m in trajectory.messages if m.role == "assistant" and not m.tool_calls)
        .lower()
        .replace(",", "")
    )
    labels: dict[str, tuple[str, str]] = {}

    if not gold_writes:
        labels["precise_arguments"] = (NOT_APPLICABLE, "the task needs no state-changing call")
        labels["complete_actions"] = (NOT_APPLICABLE, "the task needs no state-changing call")
    else:
        matched = [(g, [(i, c) for i, c in writes if c.name == g[0]]) for g in gold_writes]
        attempted = [(g, cands) for g, cands in matched if cands]
        wrong = [(g, cands) for g, cands in attempted if not any(_same(c.arguments, g[1]) for _, c in cands)]
        if not attempted:
            labels["precise_arguments"] = (NOT_APPLICABLE, "no gold write was attempted")
        elif wrong:
            g, cands = wrong[0]
            labels["precise_arguments"] = (
                LACKING,
                f"message {cands[0][0]}: {g[0]} called with {_short(cands[0][1].arguments)}, gold {_short(g[1])}",
            )
        else:
            labels["precise_arguments"] = (PRESENT, "every attempted gold write has the gold arguments")
        missing = [g[0] for g, cands in matched if not cands]
        labels["complete_actions"] = (
            (LACKING, f"never called: {', '.join(missing)}") if missing else (PRESENT, "every gold write was made")
        )

    if not info:
        labels["communicates_required_info"] = (NOT_APPLICABLE, "nothing must be communicated")
    else:
        unsaid = [s for s in info if s.lower() not in said]
        labels["communicates_required_info"] = (
            (LACKING, f"never said: {', '.join(unsaid)}") if unsaid else (PRESENT, "all required information was said")
        )

    if not writes:
        labels["read_before_write"] = (NOT_APPLICABLE, "the agent made no state-changing call")
    else:
        first_write = writes[0][0]
        read_first = any(is_read(c.name) for i, c in calls if i < first_write)
        labels["read_before_write"] = (
            (PRESENT, "a read precedes the first write")
            if read_first
            else (LACKING, f"message {first_write}: {writes[0][1].name} with no read before it")
        )

    labels["well_formed_calls"] = well_formed_calls(trajectory)
    labels["valid_tool_arguments"] = valid_tool_arguments(trajectory)

    gold_names = {g[0] for g in gold_writes}
    extra = [(i, c) for i, c in writes if c.name not in gold_names]
    labels["no_unrequested_writes"] = (
        (LACKING, f"message {extra[0][0]}: {extra[0][1].name} is not needed")
        if extra
        else (PRESENT, "no unneeded write")
    )
    return [Label(trajectory.episode_id, cap, label, evidence) for cap, (label, evidence) in labels.items()]


def well_formed_calls(trajectory: Trajectory) -> tuple[str, str]:
    """``well_formed_calls``, every analyst's one rule: LACKING at the first agent turn
    that did not parse (the env marked it an error), PRESENT otherwise."""
    malformed = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.error]
    if malformed:
        return LACKING, f"message {malformed[0]}: {(trajectory.messages[malformed[0]].raw or '')[:80]!r}"
    return PRESENT, "every action parsed"


def valid_tool_arguments(trajectory: Trajectory) -> tuple[str, str]:
    """``valid_tool_arguments``, the gold, reference and milestone analysts' one rule:
    LACKING at the first of the agent's calls that the tool answered with an error (an
    argument its schema does not take, a value it cannot use), PRESENT when every call
    ran, NOT_APPLICABLE without one."""
    answered = [(i, m) for i, m in enumerate(trajectory.messages) if m.role == "tool" and m.requestor == "assistant"]
    if not answered:
        return NOT_APPLICABLE, "the agent made no tool call"
    failed = [(i, m) for i, m in answered if m.error]
    if failed:
        return LACKING, f"message {failed[0][0]}: {(failed[0][1].content or '')[:100]!r}"
    return PRESENT, f"all {len(answered)} calls ran"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal arguments, the order of list items aside (item ids, airline's passengers and payments)."""
    return _canonical(a) == _canonical(b)


def _canonical(value: Any) -> Any:
    # Lists are compared as multisets; their items may be dicts (airline), which
    # do not sort, so each item is ordered by its canonical JSON text.
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_canonical(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    return value


def _short(value: Any) -> str:
    return json.dumps(value)[:120]
