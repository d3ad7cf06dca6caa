"""The score of a ToolSandbox episode: its own ``Evaluation`` result as a trace-gym score,
with each milestone described."""

from __future__ import annotations

import json
from typing import Any

from ...env import Score

from .scenarios import ScenarioEntry


def called_name(code: str) -> str:
    """The function a user-side code message calls."""
    for line in code.splitlines():
        if "_response = " in line:
            return line.split("_response = ", 1)[1].split("(", 1)[0].strip()
    return code.split("(", 1)[0].strip()


def score_from_evaluation(result: Any, scenario: Any, entry: ScenarioEntry, termination_reason: str) -> Score:
    """ToolSandbox's EvaluationResult as our Score: the reward is its similarity;
    components are each milestone's similarity and whether every minefield was
    avoided; details keep what each milestone constrains (for the milestone analyst)."""
    milestones = describe(scenario.evaluation.milestone_matcher.milestones, result.milestone_mapping)
    minefields = describe(scenario.evaluation.minefield_matcher.milestones, result.minefield_mapping)
    components = {f"milestone_{m['index']}": m["similarity"] for m in milestones}
    if minefields:
        components["minefields_avoided"] = 1.0 if result.minefield_similarity == 0 else 0.0
    unmet = [
        f"milestone {m['index']} ({', '.join(m['constrains']) or 'conversation'}) at {m['similarity']:.2f}"
        for m in milestones
        if m["similarity"] < 1.0
    ]
    hit = [f"minefield {m['index']} ({', '.join(m['constrains'])})" for m in minefields if m["similarity"] > 0]
    reason = (
        "every milestone met, no minefield hit"
        if not unmet and not hit
        else "; ".join(unmet + (["hit " + ", ".join(hit)] if hit else []))
    )
    details = {
        "scenario": entry.name,
        "variant": entry.variant,
        "categories": list(entry.categories),
        "similarity": float(result.similarity),
        "milestone_similarity": float(result.milestone_similarity),
        "minefield_similarity": float(result.minefield_similarity),
        "turn_count": int(result.turn_count),
        "milestones": milestones,
        "minefields": minefields,
    }
    return Score(reward=float(result.similarity), components=components, reason=reason, details=details)


def describe(milestones: list[Any], mapping: dict[int, tuple[int, float]]) -> list[dict[str, Any]]:
    """Each milestone (or minefield) with its matched similarity and what it constrains."""
    out = []
    for index, milestone in enumerate(milestones):
        snapshot, similarity = mapping.get(index, (None, 0.0))
        out.append(
            {
                "index": index,
                "similarity": float(similarity),
                "snapshot_index": snapshot,
                "constrains": constraint_kinds(milestone),
            }
        )
    return out


def constraint_kinds(milestone: Any) -> list[str]:
    """``tool_call:<name>``, ``message_to_user``, ``user_message`` or ``state:<database>``
    per constraint of a milestone (its guardrails left out)."""
    kinds = []
    for constraint in milestone.snapshot_constraints:
        if getattr(constraint.snapshot_constraint, "__name__", "") == "guardrail_similarity":
            continue
        namespace = str(constraint.database_namespace)
        target = constraint.target_dataframe
        rows = target.to_dicts() if target is not None else [{}]
        for row in rows:
            if namespace != "SANDBOX":
                kind = f"state:{namespace.lower()}"
            elif row.get("tool_trace"):
                kind = "tool_call:" + "|".join(traced_tool_names(row["tool_trace"]))
            elif str(row.get("sender")) == "AGENT" and str(row.get("recipient")) == "EXECUTION_ENVIRONMENT":
                kind = f"tool_call:{row.get('content') or '?'}"  # the agent's call, by the tool it names
            elif str(row.get("sender")) == "AGENT" and str(row.get("recipient")) == "USER":
                kind = "message_to_user"
            else:
                kind = "conversation"
            if kind not in kinds:
                kinds.append(kind)
    return kinds


def traced_tool_names(tool_trace: str) -> list[str]:
    """The tool(s) a milestone's expected trace names; a list of traces holds alternatives."""
    try:
        trace = json.loads(tool_trace)
    except (TypeError, ValueError):
        return ["?"]
    names = []
    for item in trace if isinstance(trace, list) else [trace]:
        name = item.get("tool_name", "?") if isinstance(item, dict) else "?"
        if name not in names:
            names.append(name)
    return names or ["?"]
