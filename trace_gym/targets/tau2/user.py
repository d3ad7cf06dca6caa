"""User simulators for the τ²-bench targets.

``LLMUser`` is tau2's own ``UserSimulator`` (its guidelines, its stop tokens),
pointed at any OpenAI-compatible endpoint through litellm.

``ScriptedUser`` needs no model. It is built from the task's user scenario and
is deterministic. Its limits, on purpose and written down:

- its opening message is the scenario's reason for calling plus what the user
  knows, turned into the first person, all at once;
- it answers any question that asks for confirmation with yes, and restates
  what it knows to anything else: it never negotiates, refuses or changes its
  mind, so tasks that test how an agent handles a difficult user are easier
  than with an LLM user;
- it ends the call (``###STOP###``) when the agent asks whether there is
  anything else, after ``max_turns`` replies, and answers ``###TRANSFER###``
  once the agent has transferred it to a human;
- in telecom, where the user acts on their own phone, it performs the task's
  gold user-side actions, in order, each time the agent writes to it: the
  agent's side is still entirely the agent's.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

from ...errors import UserSimulatorError

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
MAX_USER_TOOL_ROUNDS = 10

_CONFIRM = re.compile(
    r"\b(confirm|proceed|go ahead|would you like|shall i|should i|do you want|is that (correct|right)|yes or no|ok(ay)? to)\b",
    re.IGNORECASE,
)
_ANYTHING_ELSE = re.compile(r"\banything else\b", re.IGNORECASE)


class ScriptedUser:
    def __init__(self, task: Any, tau2_env: Any, max_turns: int = 12):
        instructions = task.user_scenario.instructions
        if isinstance(instructions, str):
            reason, known = instructions, ""
        else:
            reason, known = instructions.reason_for_call or "", instructions.known_info or ""
        self._opening = " ".join(part for part in (first_person(reason), first_person(known)) if part)
        self._known = first_person(known) or "I already told you everything I know."
        gold = (task.evaluation_criteria.actions if task.evaluation_criteria else None) or []
        self._gold = list(gold)
        self._cursor = 0
        self._env = tau2_env
        self._turns = 0
        self._max_turns = max_turns
        self._transferred = False

    def observe_agent_calls(self, calls: list[Any]) -> None:
        if any(c.name == "transfer_to_human_agents" for c in calls):
            self._transferred = True

    @staticmethod
    def is_stop(message: Any) -> bool:
        return bool(message.content) and (STOP in message.content or TRANSFER in message.content)

    def respond(self, message: Any) -> Iterator[tuple[Any, list[Any]]]:
        from tau2.data_model.message import UserMessage

        self._turns += 1
        if self._turns > 1:
            calls = self._due_user_actions()
            if calls:
                yield UserMessage(role="user", tool_calls=calls), [self._env.get_response(c) for c in calls]
        yield UserMessage(role="user", content=self._text_reply(message.content or "")), []

    def _text_reply(self, agent_text: str) -> str:
        if self._turns == 1:
            return self._opening or "Hi, I need some help."
        if self._transferred:
            return TRANSFER
        if self._turns > self._max_turns:
            return f"I have to go now. {STOP}"
        if _ANYTHING_ELSE.search(agent_text):
            return f"No, that's all. Thank you! {STOP}"
        if _CONFIRM.search(agent_text):
            return "Yes, I confirm. Please go ahead."
        return self._known

    def _due_user_actions(self) -> list[Any]:
        """The next run of gold user-side actions, as tau2 tool calls."""
        from tau2.data_model.message import ToolCall

        while self._cursor < len(self._gold) and self._gold[self._cursor].requestor != "user":
            self._cursor += 1
        calls = []
        while self._cursor < len(self._gold) and self._gold[self._cursor].requestor == "user":
            action = self._gold[self._cursor]
            calls.append(
                ToolCall(id=f"user_call_{self._cursor}", name=action.name, arguments=action.arguments, requestor="user")
            )
            self._cursor += 1
        return calls


class LLMUser:
    """tau2's ``UserSimulator`` through an OpenAI-compatible endpoint."""

    def __init__(self, task: Any, tau2_env: Any, model: str | None, base_url: str | None, api_key: str | None):
        from tau2.user.user_simulator import UserSimulator

        model = model or os.environ.get("TRACE_GYM_USER_MODEL")
        if not model:
            raise UserSimulatorError("user='llm' needs a model: pass user_model=... or set TRACE_GYM_USER_MODEL")
        self._base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._model = model
        self._env = tau2_env
        tools = tau2_env.get_user_tools() if tau2_env.user_tools is not None else None
        self._sim = UserSimulator(
            tools=tools,
            instructions=str(task.user_scenario),
            llm=f"openai/{model}",
            llm_args={"api_base": self._base_url, "api_key": key, "num_retries": 1, "timeout": 120},
        )
        self._state = self._sim.get_init_state()

    def observe_agent_calls(self, calls: list[Any]) -> None:
        pass  # the LLM user sees the transfer in the agent's messages, as in tau2

    def is_stop(self, message: Any) -> bool:
        return self._sim.is_stop(message)

    def respond(self, message: Any) -> Iterator[tuple[Any, list[Any]]]:
        from tau2.data_model.message import MultiToolMessage

        incoming = message
        for _ in range(MAX_USER_TOOL_ROUNDS):
            try:
                user_message, self._state = self._sim.generate_next_message(incoming, self._state)
            except Exception as exc:  # litellm raises many types; all mean "no answer"
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise UserSimulatorError(
                    f"the LLM user simulator ({self._model} at {self._base_url}) did not answer: {first_line}"
                ) from None
            if not user_message.is_tool_call():
                yield user_message, []
                return
            tool_messages = [self._env.get_response(call) for call in user_message.tool_calls]
            yield user_message, tool_messages
            incoming = (
                tool_messages[0]
                if len(tool_messages) == 1
                else MultiToolMessage(role="tool", tool_messages=tool_messages)
            )
        raise UserSimulatorError(f"the LLM user simulator made more than {MAX_USER_TOOL_ROUNDS} tool calls in a row")


# Words after which "you" is an object: "the agent asks you", "to you", "let you know".
# Regular verbs as stems, which also match with -s, -d or -ed ("caused you", "offers you").
_PREPOSITIONS = "to|for|with|from|about|of|by|at|without|against|towards?|like"
_VERBS = "ask|tell|help|give|offer|thank|send|show|remind|contact|assist|inform|make|save|provide|allow|cause|compensate|correct"
_TAKES_OBJECT = rf"{_PREPOSITIONS}|(?:{_VERBS})(?:s|d|ed)?|told|gave|sent|made|lets?"

_FIRST_PERSON = [
    (r"\byou are\b", "I am"),
    (r"\byou're\b", "I'm"),
    (r"\byou were\b", "I was"),
    (r"\byou'd\b", "I'd"),
    (r"\byou'll\b", "I'll"),
    (r"\byou've\b", "I've"),
    (r"\byourself\b", "myself"),
    (r"\byours\b", "mine"),
    (r"\byour\b", "my"),
    (r"\byou name\b", "my name"),  # tau2's own typo, in a retail task's known info
    (rf"\b({_TAKES_OBJECT})\s+you\b", r"\1 me"),
    # elsewhere in a scenario "you" is the subject: "how much you paid", "If not, you want"
    (r"\byou\b", "I"),
]


def first_person(text: str) -> str:
    """Turn a second-person scenario ("You received your order") into what the
    user would say ("I received my order"). Good enough for scripted speech."""
    out = text.strip()
    for pattern, repl in _FIRST_PERSON:
        out = re.sub(pattern, lambda m, r=repl: _keep_case(m, r), out, flags=re.IGNORECASE)
    return out


def _keep_case(match: re.Match, repl: str) -> str:
    text = match.expand(repl)
    original = match.group(0)
    stripped = original.lstrip(" .!?;:")
    if stripped[:1].isupper() and not text[:1].isupper():
        prefix_len = len(original) - len(stripped)
        return text[:prefix_len] + text[prefix_len : prefix_len + 1].upper() + text[prefix_len + 1 :]
    return text
