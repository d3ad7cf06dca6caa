"""Apple's ToolSandbox as a trace-gym target: ``trace/toolsandbox-v0``.

One task per ToolSandbox scenario. Everything that decides what an episode
means is ToolSandbox's own: the scenario's starting ``ExecutionContext`` (its
databases, its system messages, its tool allow list and augmentations), the
agent-visible tool schemas (``convert_to_openai_tools`` over the tools the
context makes available to the agent role), the conversion of a tool call to
the code its ``ExecutionEnvironment`` runs (``openai_tool_call_to_python_code``),
the execution itself, its user simulator for multi-turn scenarios
(``OpenAIAPIUser``), and the score (the scenario's ``Evaluation.evaluate``:
similarity in [0, 1], zeroed by any minefield). What this module adds is the
turn-taking of ``Scenario.play`` in the Gymnasium shape, and a scripted user
that ends single-turn scenarios once the agent has answered.

It must not change what ToolSandbox computes (no reward shaping, no schema
edits) and must never call a tool that reaches the live web: scenarios whose
tools use RapidAPI are reported and left out of every split.

ToolSandbox keeps its world in one process-global execution context, so every
use of it here happens under one lock with the episode's own context set.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..actions import ToolCall
from ..env import Reply, Score, Start, TextEnv, ToolResult
from ..errors import TargetUnavailableError, UnknownTaskError, UserSimulatorError
from ..trajectory import Message, ToolCallRecord

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

LOCK = threading.RLock()  # ToolSandbox's execution context is a process global


class ScenarioExclusionWarning(UserWarning):
    """Scenarios of the requested split that this env will not play, and why."""


def import_tool_sandbox():
    """Import ToolSandbox, or say how to install it."""
    try:
        import langchain_core  # noqa: F401  (first: on import it re-enables its deprecation warnings)

        with _quiet():
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
                with _quiet():
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
    import importlib

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
        return _schemas({name: tool for name, tool in tools.items() if name not in live})


def _schemas(name_to_tool: dict[str, Any]) -> list[dict[str, Any]]:
    from tool_sandbox.common.tool_conversion import convert_to_openai_tools

    with _quiet():
        return convert_to_openai_tools(name_to_tool)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # langchain_core warns that ToolSandbox imports its pydantic_v1 shim; polars
    # and attrs warn about ToolSandbox's older idioms. Not ours to fix, not news.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@dataclass
class _Holder:
    context: Any


@contextlib.contextmanager
def episode_context(context: Any) -> Iterator[_Holder]:
    """Hold the lock with ``context`` as ToolSandbox's current context.

    ToolSandbox may replace the current context while it works (parallel calls
    are replayed in every order on copies); the one current at the end is the
    episode's from then on, handed back in ``holder.context``.
    """
    from tool_sandbox.common.execution_context import get_current_context, set_current_context

    with LOCK:
        previous = get_current_context()
        set_current_context(context)
        holder = _Holder(context)
        try:
            yield holder
        finally:
            if holder.context is not None:
                holder.context = get_current_context()
            set_current_context(previous)


@functools.cache
def _role_classes():
    """The roles this env drives, defined on ToolSandbox's own base class."""
    from tool_sandbox.common.execution_context import RoleType
    from tool_sandbox.roles.base_role import BaseRole

    class AgentSide(BaseRole):
        """The agent's seat: its messages come from Gymnasium steps, not from respond()."""

        role_type = RoleType.AGENT

    class ScriptedUser(BaseRole):
        """The user of a single-turn scenario: its request is already in the
        scenario, so once the agent has answered it ends the conversation, with
        the ``end_conversation`` call ToolSandbox's LLM user would make."""

        role_type = RoleType.USER

        def respond(self, ending_index: int | None = None) -> None:
            from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function
            from tool_sandbox.common.message_conversion import Message as TSMessage
            from tool_sandbox.common.message_conversion import openai_tool_call_to_python_code

            messages = self.get_messages(ending_index=ending_index)
            self.messages_validation(messages=messages)
            if self.filter_messages(messages=messages)[-1].sender == RoleType.SYSTEM:
                return
            tools = self.get_available_tools()
            call = ChatCompletionMessageToolCall(
                id="scripted_user_end", type="function", function=Function(name="end_conversation", arguments="{}")
            )
            code = openai_tool_call_to_python_code(call, set(tools), execution_facing_tool_name=None)
            self.add_messages(
                [TSMessage(sender=self.role_type, recipient=RoleType.EXECUTION_ENVIRONMENT, content=code)]
            )

    return AgentSide, ScriptedUser


def agent_side():
    return _role_classes()[0]


def llm_user(model: str | None, base_url: str | None, api_key: str | None):
    """ToolSandbox's own ``OpenAIAPIUser`` (its prompts, its end_conversation
    tool) talking to any OpenAI-compatible endpoint instead of api.openai.com."""
    from openai import OpenAI
    from tool_sandbox.roles.openai_api_user import OpenAIAPIUser

    model = model or os.environ.get("TRACE_GYM_USER_MODEL")
    base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    if not model or not base_url:
        raise UserSimulatorError(
            "ToolSandbox's multi-turn scenarios need its LLM user: pass user='llm' with user_model and "
            "user_base_url (or set TRACE_GYM_USER_MODEL and OPENAI_BASE_URL) naming an OpenAI-compatible endpoint"
        )

    class EndpointUser(OpenAIAPIUser):
        def __init__(self) -> None:  # OpenAIAPIUser pins api.openai.com; this one is configurable
            self.model_name = model
            self.openai_client = OpenAI(
                base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY", max_retries=0
            )

    return EndpointUser()


class ToolSandboxEnv(TextEnv):
    """ToolSandbox's scenarios as a Gymnasium text environment.

    Args:
        split: ``base`` (the 129 base scenarios), a variant (``3_distraction_tools``,
            ``10_distraction_tools``, ``all_tools``, ``tool_description_scrambled``,
            ``arg_description_scrambled``, ``arg_type_scrambled``, ``tool_name_scrambled``)
            or ``all``. Scenarios with RapidAPI tools are never in a split; with the
            scripted user, neither are multi-turn ones. ``options={"task_id": ...}``
            names any playable scenario.
        user: ``scripted`` (offline, single-turn scenarios) or ``llm`` (ToolSandbox's
            ``OpenAIAPIUser`` through an OpenAI-compatible endpoint, every scenario).
        user_model, user_base_url, user_api_key: for ``user="llm"``; default to
            ``TRACE_GYM_USER_MODEL``, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.
        max_steps: agent actions per episode (the scenario's own message budget,
            30 messages of every role, usually ends it first).
    """

    def __init__(
        self,
        split: str | None = "base",
        user: str = "scripted",
        user_model: str | None = None,
        user_base_url: str | None = None,
        user_api_key: str | None = None,
        max_steps: int = 30,
        render_mode: str | None = None,
    ):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        split = split or "base"
        if split not in SPLITS:
            raise UnknownTaskError(f"ToolSandbox has no split '{split}'; splits: {', '.join(SPLITS)}")
        if user not in ("scripted", "llm"):
            raise ValueError(f"user must be 'scripted' or 'llm', got {user!r}")
        self.split = split
        self.user_kind = user
        self._user_config = {"model": user_model, "base_url": user_base_url, "api_key": user_api_key}
        if user == "llm":
            llm_user(user_model, user_base_url, user_api_key)  # a missing endpoint fails here, not mid-run
        self._catalogue = catalogue()
        in_split = [e for e in self._catalogue.entries.values() if split == "all" or e.variant == split]
        self.excluded = {e.name: self.exclusion_reason(e) for e in in_split if self.exclusion_reason(e)}
        self._split_ids = [e.name for e in in_split if e.name not in self.excluded]
        self._tools = list(self._catalogue.all_agent_tools)
        self._report_exclusions()
        self._scenario = None
        self._entry: ScenarioEntry | None = None
        self._context = None
        self._roles: dict[Any, Any] = {}
        self._message_limit = 0
        self._end_reason: str | None = None
        self._last_action = ""

    # --- tasks ------------------------------------------------------------------
    def exclusion_reason(self, entry: ScenarioEntry) -> str | None:
        if entry.live_tools:
            return f"live web API (RapidAPI): {', '.join(entry.live_tools)}"
        if entry.multi_turn and self.user_kind == "scripted":
            return "multi-turn: needs ToolSandbox's LLM user (user='llm' with user_base_url and user_model)"
        return None

    def _report_exclusions(self) -> None:
        if not self.excluded:
            return
        live = sum(1 for r in self.excluded.values() if r.startswith("live"))
        multi = len(self.excluded) - live
        parts = [f"{live} use live web APIs (RapidAPI) and are never called"] if live else []
        if multi:
            parts.append(
                f"{multi} are multi-turn and need ToolSandbox's LLM user (user='llm', user_base_url, user_model)"
            )
        warnings.warn(
            f"trace/toolsandbox-v0 split '{self.split}': playing {len(self._split_ids)} scenarios; left out "
            + "; ".join(parts)
            + " (env.excluded lists them)",
            ScenarioExclusionWarning,
            stacklevel=3,
        )

    @property
    def task_ids(self) -> list[str]:
        """Playable scenario names of the split, in ToolSandbox's order."""
        return list(self._split_ids)

    def get_task(self, task_id: str) -> Any:
        """The ToolSandbox ``Scenario`` (a playable one) named ``task_id``."""
        entry = self._catalogue.entries.get(task_id)
        if entry is None:
            sample = ", ".join(self._split_ids[:4])
            raise UnknownTaskError(
                f"ToolSandbox has no scenario '{task_id}' ({len(self._catalogue.entries)} scenarios, e.g. {sample})"
            )
        reason = self.exclusion_reason(entry)
        if reason:
            raise UnknownTaskError(f"ToolSandbox scenario '{task_id}' is not playable here: {reason}")
        return self._catalogue.scenarios[task_id]

    def scenario_entry(self, task_id: str) -> ScenarioEntry:
        return self._catalogue.entries[task_id]

    # --- TextEnv hooks ------------------------------------------------------------
    def _start(self, seed: int | None, options: dict[str, Any]) -> Start:
        import copy

        from tool_sandbox.common.execution_context import DatabaseNamespace, RoleType
        from tool_sandbox.roles.execution_environment import ExecutionEnvironment

        if options.get("task_id") is not None:
            name = str(options["task_id"])
        else:
            if not self._split_ids:
                raise UnknownTaskError(
                    f"ToolSandbox split '{self.split}' has no playable scenario with user='{self.user_kind}'"
                )
            name = self._split_ids[int(self.np_random.integers(len(self._split_ids)))]
        scenario = self.get_task(name)
        self._scenario, self._entry = scenario, self._catalogue.entries[name]
        self._end_reason = None
        _, scripted_user = _role_classes()
        user = llm_user(**self._user_config) if self.user_kind == "llm" else scripted_user()
        self._roles = {RoleType.USER: user, RoleType.EXECUTION_ENVIRONMENT: ExecutionEnvironment()}
        with episode_context(copy.deepcopy(scenario.starting_context)) as holder:
            context = holder.context
            # As Scenario.play: the system's set-up code runs first, unanswered.
            first = context.max_sandbox_message_index
            history = context.get_database(
                DatabaseNamespace.SANDBOX, drop_sandbox_message_index=False, get_all_history_snapshots=True
            )
            for index in range(first + 1):
                if (
                    history["recipient"][index] == RoleType.EXECUTION_ENVIRONMENT
                    and history["sender"][index] == RoleType.SYSTEM
                ):
                    self._roles[RoleType.EXECUTION_ENVIRONMENT].respond(ending_index=index)
            self._message_limit = scenario.max_messages + first
            ended = self._advance()
            agent = agent_side().filter_messages(agent_side().get_messages())
            self._tools = _schemas(agent_side().get_available_tools())
        self._context = holder.context
        if ended:
            raise UnknownTaskError(f"ToolSandbox scenario '{name}' ended before the agent's first turn ({ended})")
        system = "\n\n".join(m.content for m in agent if m.sender == RoleType.SYSTEM)
        opening = [m for m in agent if m.sender != RoleType.SYSTEM]
        if not opening or opening[-1].sender != RoleType.USER:
            raise UnknownTaskError(f"ToolSandbox scenario '{name}' does not open with a user message")
        prelude = [
            Message(role="user" if m.sender == RoleType.USER else "assistant", content=m.content) for m in opening[:-1]
        ]
        return Start(
            observation=opening[-1].content,
            system_prompt=system,
            task_id=name,
            prelude=prelude,
            info={
                "variant": self._entry.variant,
                "categories": list(self._entry.categories),
                "multi_turn": self._entry.multi_turn,
                "user": self.user_kind,
            },
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._last_action = action  # for answering a malformed call in ToolSandbox's words
        return super().step(action)

    def _call_tools(self, calls: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function
        from tool_sandbox.common.execution_context import RoleType
        from tool_sandbox.common.message_conversion import Message as TSMessage
        from tool_sandbox.common.message_conversion import openai_tool_call_to_python_code

        results: dict[str, ToolResult] = {}
        with episode_context(self._context) as holder:
            context = holder.context
            names = set(agent_side().get_available_tools())
            outgoing = []
            for call, call_id in calls:
                tool_call = ChatCompletionMessageToolCall(
                    id=call_id,
                    type="function",
                    function=Function(name=call.name, arguments=json.dumps(call.arguments, ensure_ascii=False)),
                )
                try:  # as ToolSandbox's OpenAI agent turns a call into the code its environment runs
                    facing = context.get_execution_facing_tool_name(call.name) if call.name in names else None
                    code = openai_tool_call_to_python_code(tool_call, names, execution_facing_tool_name=facing)
                except KeyError as exc:  # ToolSandbox's words for a tool the agent was not given
                    results[call_id] = ToolResult(content=str(exc.args[0]), error=True)
                    continue
                outgoing.append(
                    TSMessage(
                        sender=RoleType.AGENT,
                        recipient=RoleType.EXECUTION_ENVIRONMENT,
                        content=code,
                        openai_tool_call_id=call_id,
                        openai_function_name=call.name,
                    )
                )
            if outgoing:
                before = len(agent_side().get_messages())
                agent_side().add_messages(outgoing)
                self._end_reason = self._advance()
                for m in agent_side().get_messages()[before:]:
                    if m.sender == RoleType.EXECUTION_ENVIRONMENT and m.recipient == RoleType.AGENT:
                        results[m.openai_tool_call_id] = ToolResult(
                            content=m.content, error=m.tool_call_exception is not None
                        )
        self._context = holder.context
        out = [results.get(call_id) or ToolResult(content="", error=True) for _, call_id in calls]
        if self._end_reason and out:
            out[-1].done = True
        return out

    def _reply(self, content: str) -> Reply:
        from tool_sandbox.common.execution_context import RoleType
        from tool_sandbox.common.message_conversion import Message as TSMessage

        with episode_context(self._context) as holder:
            before = len(agent_side().get_messages())
            agent_side().add_messages([TSMessage(sender=RoleType.AGENT, recipient=RoleType.USER, content=content)])
            try:
                self._end_reason = self._advance()
            except Exception as exc:
                if self.user_kind == "llm" and not isinstance(exc, UserSimulatorError):
                    raise UserSimulatorError(
                        f"ToolSandbox's LLM user could not answer ({type(exc).__name__}: {exc})"
                    ) from None
                raise
            new = agent_side().get_messages()[before + 1 :]
        self._context = holder.context
        for m in new:  # the user's own tool calls (end_conversation) go into the transcript too
            if m.sender == RoleType.USER and m.recipient == RoleType.EXECUTION_ENVIRONMENT:
                self.messages.append(
                    Message(
                        role="user",
                        requestor="user",
                        content=m.content,
                        tool_calls=[
                            ToolCallRecord(
                                id=m.openai_tool_call_id or "user_call", name=_called_name(m.content), arguments={}
                            )
                        ],
                    )
                )
        if self._end_reason:
            return Reply(content="", done=True, reason=self._end_reason, from_user=False)
        return Reply(content=new[-1].content)

    def _finish(self, reason: str) -> float:
        return super()._finish(self._end_reason or reason)

    def _score(self, termination_reason: str) -> Score:
        with episode_context(self._context) as holder, _quiet():
            result = self._scenario.evaluation.evaluate(
                execution_context=holder.context, max_turn_count=self._scenario.max_messages
            )
        return score_from_evaluation(result, self._scenario, self._entry, termination_reason)

    def _malformed_observation(self, parsed) -> str:
        """ToolSandbox's own parser of ``<tool_call>`` text (its Hermes agent's) says what is wrong."""
        from openai.types.completion_choice import CompletionChoice
        from tool_sandbox.roles.hermes_api_agent import to_chat_completion_message

        text = self._last_action.strip()
        if "<tool_call>" not in text:
            text = f"<tool_call>{text}</tool_call>"
        try:
            to_chat_completion_message(CompletionChoice(text=text, index=0, finish_reason="stop"))
        except Exception as exc:  # noqa: BLE001 - its words are what we want
            return f"{type(exc).__name__}: {exc}"
        return super()._malformed_observation(parsed)

    # --- ToolSandbox plumbing -----------------------------------------------------------
    def _advance(self) -> str | None:
        """Let the roles other than the agent answer, as ``Scenario.play`` does,
        until the agent is addressed; the reason when the conversation is over."""
        from tool_sandbox.common.execution_context import DatabaseNamespace, RoleType, get_current_context

        while True:
            last = get_current_context().get_database(DatabaseNamespace.SANDBOX, drop_sandbox_message_index=False)
            if not last["conversation_active"][-1]:
                return "user_stop"
            if last["sandbox_message_index"][-1] >= self._message_limit:
                return "max_messages"
            recipient = last["recipient"][-1]
            if recipient == RoleType.AGENT:
                return None
            with _quiet():
                self._roles[recipient].respond()

    def result_shapes(self) -> dict[str, Any]:
        """What each agent tool returns (frozen as ``results.json``): the JSON Schema
        of the type the tool function is annotated to return, in the ``text``
        format, because ToolSandbox answers with Python's ``repr`` of the value
        (``None``, ``True``, ``[{'person_id': ...}]``), not JSON; so results are
        checked only for being text. Errors are the exception line its console
        prints (``TypeError: ...``, ``ValueError: ...``): no common prefix."""
        import inspect

        from pydantic import TypeAdapter

        tools = {t["function"]["name"] for t in self._catalogue.all_agent_tools}
        shapes = {}
        for name, tool in catalogue_tools().items():
            if name not in tools:
                continue
            returns = inspect.signature(tool).return_annotation
            returns = type(None) if returns in (None, inspect.Signature.empty) else returns
            shapes[name] = {"format": "text", "schema": TypeAdapter(returns).json_schema(mode="serialization")}
        return {"error_prefix": "", "tools": shapes}

    @property
    def execution_context(self) -> Any:
        """The episode's ToolSandbox ``ExecutionContext`` (what its evaluator reads)."""
        return self._context

    def oracle_actions(self) -> list[str] | None:
        return None  # ToolSandbox's milestones are not action scripts


def _called_name(code: str) -> str:
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


def catalogue_tools() -> dict[str, Any]:
    """Every tool function ToolSandbox registers, by name."""
    from tool_sandbox.common.tool_discovery import ToolBackend, get_all_tools

    return get_all_tools(ToolBackend.DEFAULT)
