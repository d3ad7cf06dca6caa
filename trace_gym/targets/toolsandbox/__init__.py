"""Apple's ToolSandbox as a trace-gym target: ``trace/toolsandbox-v0``.

``env.py``: the env (one task per scenario; ToolSandbox's own context, tools,
execution, user and evaluation); ``scenarios.py``: the catalogue of scenarios and
splits, and the agent-visible tool schemas; ``roles.py``: its process-global
execution context under one lock, and who speaks besides the agent;
``scoring.py``: its evaluation as a trace-gym score.
"""

from .env import ToolSandboxEnv
from .roles import LOCK, episode_context, role_classes
from .scenarios import SPLITS, VARIANTS, Catalogue, ScenarioEntry, catalogue, import_tool_sandbox
from .scoring import score_from_evaluation

__all__ = [
    "LOCK",
    "SPLITS",
    "VARIANTS",
    "Catalogue",
    "ScenarioEntry",
    "ToolSandboxEnv",
    "catalogue",
    "episode_context",
    "import_tool_sandbox",
    "role_classes",
    "score_from_evaluation",
]
