"""ToolSandbox's scenarios as tasks: the catalogue (splits, variants, scenarios left out for
reaching the live web) and the agent-visible tool schemas."""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Any

from ...errors import TargetUnavailableError
from .roles import LOCK, agent_side, episode_context, quiet

INSTALL_HINT = (
    "pip install 'trace-gym[toolsandbox]' and then, without its pinned dependencies, "
    "pip install --no-deps 'tool_sandbox @ git+https://github.com/apple/ToolSandbox@165848b'"
)
LIVE_API_MODULE = "tool_sandbox.tools.rapid_api_search_tools"  # RapidAPI: the live web
SHUFFLE_SEED = 0  # named_scenarios shuffles tool allow lists with the global `random`
VARIANTS = (
    "base",
    "3_distraction_tools",
    "10_distraction_tools",
    "all_tools",
    "tool_description_scrambled",
    "arg_description_scrambled",
    "arg_type_scrambled",
    "tool_name_scrambled",
)
SPLITS = (*VARIANTS, "all")


class ScenarioExclusionWarning(UserWarning):
    """Scenarios of the requested split that this env will not play, and why."""


def import_tool_sandbox():
    """Import ToolSandbox, or say how to install it."""
    try:
        import langchain_core  # noqa: F401  (first: on import it re-enables its deprecation warnings)

        with quiet():
            import tool_sandbox.common.tool_conversion  # noqa: F401
            import tool_sandbox.roles.execution_environment  # noqa: F401
            import tool_sandbox.scenarios  # noqa: F401
    except ImportError as exc:
        raise TargetUnavailableError(
            f"the ToolSandbox target needs the tool_sandbox package ({exc}); {INSTALL_HINT}"
        ) from None
    import tool_sandbox

    return tool_sandbox


@dataclass(frozen=True)
class ScenarioEntry:
    """What the env knows of one scenario before playing it."""

    name: str
    variant: str
    multi_turn: bool
    live_tools: tuple[str, ...]
    categories: tuple[str, ...]


@dataclass
class Catalogue:
    scenarios: dict[str, Any]
    entries: dict[str, ScenarioEntry]
    all_agent_tools: list[dict[str, Any]] = field(default_factory=list)


_CATALOGUE: Catalogue | None = None


def catalogue() -> Catalogue:
    """ToolSandbox's scenarios, built once per process (about 10-20 s).

    ``named_scenarios`` shuffles each allow list with the global ``random``; it
    runs under a fixed seed (the caller's random state is restored) so that
    the order of an episode's tools does not change from one process to the next.
    Its scenarios take some timestamps from the clock: they are as of this call.
    """
    global _CATALOGUE
    with LOCK:
        if _CATALOGUE is None:
            import_tool_sandbox()
            from tool_sandbox.common.execution_context import ScenarioCategories
            from tool_sandbox.common.tool_discovery import ToolBackend
            from tool_sandbox.scenarios import named_scenarios

            state = random.getstate()
            random.seed(SHUFFLE_SEED)
            try:
                with quiet():
                    scenarios = named_scenarios(preferred_tool_backend=ToolBackend.DEFAULT)
            finally:
                random.setstate(state)
            live = live_api_tools()
            entries = {}
            for name, scenario in scenarios.items():
                context = scenario.starting_context
                entries[name] = ScenarioEntry(
                    name=name,
                    variant=variant_of(scenario),
                    multi_turn=ScenarioCategories.MULTIPLE_USER_TURN in scenario.categories,
                    live_tools=tuple(sorted(set(context.tool_allow_list or live) & live)),
                    categories=tuple(str(c) for c in scenario.categories),
                )
            _CATALOGUE = Catalogue(scenarios, entries, agent_tools_of_package(live))
        return _CATALOGUE


def live_api_tools() -> set[str]:
    """Names of the tools that call RapidAPI (defined in its module, not imported there)."""
    from tool_sandbox.common.tool_discovery import ToolBackend, find_tools_by_module

    module = importlib.import_module(LIVE_API_MODULE)
    return {
        name
        for name, tool in find_tools_by_module(module, ToolBackend.DEFAULT).items()
        if tool.__module__ == LIVE_API_MODULE
    }


def variant_of(scenario: Any) -> str:
    """base, a distraction level, or the tool augmentation a scenario adds."""
    from tool_sandbox.common.execution_context import ScenarioCategories as C

    augmentations = scenario.starting_context.tool_augmentation_list
    if augmentations:
        return str(augmentations[0]).lower()
    for category, name in (
        (C.ALL_TOOLS_AVAILABLE, "all_tools"),
        (C.TEN_DISTRACTION_TOOLS, "10_distraction_tools"),
        (C.THREE_DISTRACTION_TOOLS, "3_distraction_tools"),
    ):
        if category in scenario.categories:
            return name
    return "base"


def agent_tools_of_package(live: set[str]) -> list[dict[str, Any]]:
    """Every agent-visible tool's schema as ToolSandbox writes it, unscrambled;
    the live-web tools left out (no playable scenario offers them)."""
    from tool_sandbox.common.execution_context import ExecutionContext

    with episode_context(ExecutionContext()):
        tools = agent_side().get_available_tools()
        return schemas_of({name: tool for name, tool in tools.items() if name not in live})


def schemas_of(name_to_tool: dict[str, Any]) -> list[dict[str, Any]]:
    from tool_sandbox.common.tool_conversion import convert_to_openai_tools

    with quiet():
        return convert_to_openai_tools(name_to_tool)


def catalogue_tools() -> dict[str, Any]:
    """Every tool function ToolSandbox registers, by name."""
    from tool_sandbox.common.tool_discovery import ToolBackend, get_all_tools

    return get_all_tools(ToolBackend.DEFAULT)
