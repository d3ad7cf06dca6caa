"""Who speaks in a ToolSandbox episode besides the agent: its execution context held under
one lock, the agent's seat, the scripted single-turn user and ToolSandbox's LLM user."""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from dataclasses import dataclass
import threading
from typing import Any, Iterator

from ...errors import UserSimulatorError

LOCK = threading.RLock()  # ToolSandbox's execution context is a process global


@contextlib.contextmanager
def quiet() -> Iterator[None]:
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
def role_classes():
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
    return role_classes()[0]


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
