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

import copy
import inspect
import json
import warnings
from typing import Any

from ...actions import ToolCall
from ...env import Reply, Score, Start, TextEnv, ToolResult
from ...errors import UnknownTaskError, UserSimulatorError
from ...trajectory import Message, ToolCallRecord
from .. import UserKind, user_kind

from .roles import agent_side, episode_context, llm_user, quiet, role_classes
from .scenarios import SPLITS, ScenarioEntry, ScenarioExclusionWarning, catalogue, catalogue_tools, schemas_of
from .scoring import called_name, score_from_evaluation


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
        user = user_kind(user)
        self.split = split
        self.user_kind = user
        self._user_config = {"model": user_model, "base_url": user_base_url, "api_key": user_api_key}
        if user == UserKind.LLM:
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
        if entry.multi_turn and self.user_kind == UserKind.SCRIPTED:
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
        _, scripted_user = role_classes()
        user = llm_user(**self._user_config) if self.user_kind == UserKind.LLM else scripted_user()
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
            self._tools = schemas_of(agent_side().get_available_tools())
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
                if self.user_kind == UserKind.LLM and not isinstance(exc, UserSimulatorError):
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
                                id=m.openai_tool_call_id or "user_call", name=called_name(m.content), arguments={}
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
        with episode_context(self._context) as holder, quiet():
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
            with quiet():
                self._roles[recipient].respond()

    def result_shapes(self) -> dict[str, Any]:
        """What each agent tool returns (frozen as ``results.json``): the JSON Schema
        of the type the tool function is annotated to return, in the ``text``
        format, because ToolSandbox answers with Python's ``repr`` of the value
        (``None``, ``True``, ``[{'person_id': ...}]``), not JSON; so results are
        checked only for being text. Errors are the exception line its console
        prints (``TypeError: ...``, ``ValueError: ...``): no common prefix."""
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
