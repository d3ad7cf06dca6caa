"""The milestone analyst: labels from which of ToolSandbox's milestones an
episode met and which of its minefields it hit. No LLM, so it is exact, free
and reproducible (the role the gold-action analyst plays on τ²).

It reads only the trajectory: ``trace/toolsandbox-v0`` records in
``reward_info["details"]`` each milestone's and minefield's similarity and what
it constrains (``tool_call:<tool>``, ``message_to_user``, ``state:<database>``),
plus the scenario's categories. It needs neither ToolSandbox nor its scenarios,
and it must not re-score anything: a milestone is met when ToolSandbox's own
similarity for it is 1.

Its dictionary of capabilities is fixed. Each is decided from the record alone:
"""

from __future__ import annotations

from typing import Any

from trace_gym.errors import TraceGymError
from trace_gym.trajectory import Trajectory

from .gold import valid_tool_arguments, well_formed_calls
from .stats import LACKING, NOT_APPLICABLE, PRESENT, Label

MET = 1.0 - 1e-9  # a milestone counts as met at ToolSandbox's perfect similarity only

MILESTONE_CAPABILITIES = {
    "right_tool_calls": "Call the tools the request needs with the arguments it implies (the scenario's tool-call milestones).",
    "reaches_required_state": "Leave the world (settings, contacts, messages, reminders) in the state the request asks for.",
    "reports_result_to_user": "Tell the user the outcome or the answer the request asked for, in a final message.",
    "avoids_unwarranted_actions": "When the information or tools needed are missing, neither guess nor act: no call the scenario forbids (its minefields).",
    "resolves_state_dependencies": "Notice and fix the device state a tool depends on (low battery mode, wifi, cellular) before using it.",
    "canonicalizes_arguments": "Turn the user's wording (relative dates, units, currencies, phone formats) into the canonical arguments tools take.",
    "disambiguates_requests": "Resolve which record an ambiguous request means before acting on it.",
    "valid_tool_arguments": "Write calls that ToolSandbox runs without an exception (right argument names and types).",
    "well_formed_calls": "Write tool calls that parse: valid JSON with a name and an arguments object.",
}

# Scenario categories whose difficulty a capability names; applicable where the category is.
CATEGORY_CAPABILITIES = {
    "STATE_DEPENDENCY": "resolves_state_dependencies",
    "CANONICALIZATION": "canonicalizes_arguments",
    "DISAMBIGUATION": "disambiguates_requests",
}


class MilestoneAnalyst:
    name = "milestone"

    def __init__(self):
        self.calls = 0
        self.tokens = 0

    def capabilities(self) -> dict[str, str]:
        return dict(MILESTONE_CAPABILITIES)

    def label(self, trajectory: Trajectory) -> list[Label]:
        details = (trajectory.reward_info or {}).get("details") or {}
        if "milestones" not in details:
            raise TraceGymError(
                f"the milestone analyst needs ToolSandbox episodes (trace/toolsandbox-v0); episode "
                f"{trajectory.episode_id} of {trajectory.env_id} records no milestones"
            )
        milestones, minefields = details["milestones"], details.get("minefields") or []
        categories = set(details.get("categories") or [])
        labels: dict[str, tuple[str, str]] = {}

        for capability, prefix in (
            ("right_tool_calls", "tool_call:"),
            ("reaches_required_state", "state:"),
            ("reports_result_to_user", "message_to_user"),
        ):
            labels[capability] = _milestones_of_kind(milestones, prefix)

        if not minefields:
            labels["avoids_unwarranted_actions"] = (NOT_APPLICABLE, "the scenario has no minefield")
        else:
            hit = [m for m in minefields if m["similarity"] > 0]
            labels["avoids_unwarranted_actions"] = (
                (
                    LACKING,
                    "hit " + "; ".join(f"minefield {m['index']} ({_kinds(m)}) at {m['similarity']:.2f}" for m in hit),
                )
                if hit
                else (PRESENT, f"no minefield of {len(minefields)} hit")
            )

        unmet = [m for m in milestones if m["similarity"] < MET]
        perfect = not unmet and not any(m["similarity"] > 0 for m in minefields)
        for category, capability in CATEGORY_CAPABILITIES.items():
            if category not in categories:
                labels[capability] = (NOT_APPLICABLE, f"the scenario is not tagged {category}")
            elif perfect:
                labels[capability] = (PRESENT, f"a {category} scenario solved: every milestone met")
            else:
                why = (
                    "; ".join(f"milestone {m['index']} ({_kinds(m)}) at {m['similarity']:.2f}" for m in unmet)
                    or "a minefield hit"
                )
                labels[capability] = (LACKING, f"a {category} scenario not solved: {why}")

        labels["valid_tool_arguments"] = valid_tool_arguments(trajectory)
        labels["well_formed_calls"] = well_formed_calls(trajectory)
        return [Label(trajectory.episode_id, cap, label, evidence) for cap, (label, evidence) in labels.items()]


def _milestones_of_kind(milestones: list[dict[str, Any]], prefix: str) -> tuple[str, str]:
    mine = [m for m in milestones if any(k.startswith(prefix) for k in m.get("constrains", []))]
    if not mine:
        return NOT_APPLICABLE, f"no milestone constrains {prefix.rstrip(':')}"
    unmet = [m for m in mine if m["similarity"] < MET]
    if unmet:
        return LACKING, "; ".join(f"milestone {m['index']} ({_kinds(m)}) at {m['similarity']:.2f}" for m in unmet)
    return PRESENT, f"{len(mine)} milestone(s) met"


def _kinds(milestone: dict[str, Any]) -> str:
    return ", ".join(milestone.get("constrains") or []) or "conversation"
