"""How a τ² episode ends and what it scores, in tau2's own terms: our termination
reason as tau2's enum, tau2's stuck-in-a-loop judge, and tau2's RewardInfo as our Score."""

from __future__ import annotations

import os
from typing import Any

from ...env import Score


def to_tau2_termination(reason: str | None):
    """Our termination reason (tau2's own value for τ² episodes) as tau2's enum;
    anything tau2 has no name for (an agent that crashed, ``done``) is ``AGENT_ERROR``."""
    from tau2.data_model.simulation import TerminationReason

    try:
        return TerminationReason(reason)
    except ValueError:
        return TerminationReason.AGENT_ERROR


class StuckJudge:
    """tau2's stuck-in-a-loop judge (``Orchestrator._is_agent_stuck``: its prompt,
    its window, its yes/no rule, and its choice to treat a judge failure as "not
    stuck"), run on our episode's tau2 messages through an OpenAI-compatible
    endpoint. tau2's own method is called, not re-implemented, so the decision is
    tau2's; it reads only the five attributes set here."""

    def __init__(self, model: str, base_url: str | None, api_key: str | None, window_size: int = 30):
        self.judge_llm = f"openai/{model}"
        self.judge_llm_args = {
            "api_base": base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1",
            "api_key": api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            "num_retries": 1,
            "timeout": 120,
        }
        self.judge_window_size = int(window_size)
        self.judge_system_prompt = None
        self.trajectory: list[Any] = []

    def is_stuck(self, messages: list[Any]) -> bool:
        from tau2.orchestrator.orchestrator import Orchestrator

        self.trajectory = messages
        return bool(Orchestrator._is_agent_stuck(self))


def score_from_reward_info(reward_info, termination_reason: str) -> Score:
    """tau2's RewardInfo as our Score: components are tau2's reward breakdown
    (DB, COMMUNICATE, ACTION, ENV_ASSERTION), plus ``termination`` when tau2
    scored the episode 0 for ending early."""
    breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (reward_info.reward_breakdown or {}).items()}
    details: dict[str, Any] = {}
    if reward_info.db_check is not None:
        details["db_match"] = reward_info.db_check.db_match
    if reward_info.communicate_checks:
        details["communicate"] = [{"info": c.info, "met": c.met} for c in reward_info.communicate_checks]
    if reward_info.action_checks:
        details["actions"] = [
            {"name": c.action.name, "arguments": c.action.arguments, "met": c.action_match}
            for c in reward_info.action_checks
        ]
    if reward_info.env_assertions:
        details["env_assertions"] = [
            {"func_name": c.env_assertion.func_name, "met": c.met} for c in reward_info.env_assertions
        ]
    note = (reward_info.info or {}).get("note") if isinstance(reward_info.info, dict) else None
    if termination_reason not in ("agent_stop", "user_stop"):
        breakdown["termination"] = 0.0
    failed = [name for name, value in breakdown.items() if value < 1.0]
    reason = note or ("all checks passed" if not failed else "failed: " + ", ".join(failed))
    return Score(reward=float(reward_info.reward), components=breakdown, reason=reason, details=details)
