"""An OpenEnv environment server as a target: a Gymnasium text env whose episodes
are played on the server, through OpenEnv's own client (``openenv-core``).

A manifest names it:

```toml
id = "trace/my-remote-v0"
kind = "target"
entry_point = "trace_gym.targets.openenv:OpenEnvTarget"
description = "..."
[kwargs]
base_url = "http://127.0.0.1:8000"
splits = { train = [0, 80], test = [80, 100] }  # reset seeds [first, end), or lists of task ids (strings)
```

Each split is either a seed range (``reset(seed=N)``) or a list of task ids
(``reset(task_id=ID)``); ``split_kwarg`` also sends the split's name under
that key (``"split"`` for a server that ``trace-gym envs serve`` runs).
``action_field`` is the action's field that carries the agent's text and
``observation_field`` the observation's field the agent reads (``text`` for
both by default, as ``trace-gym envs serve`` speaks). Where the server's
observation has them, ``messages``, ``system_prompt``, ``tools``, ``reward_info``
and ``termination_reason`` are taken as a trace-gym env gives them; otherwise
the manifest's ``system_prompt`` and ``tools`` are used. The reward is the
server's, when it says the episode is done.

What a remote env cannot give: reference solutions (no ``oracle_actions``), so
identification contrasts the policy's own successes and failures, and an
analyst that needs reference solutions refuses this target.

One WebSocket session per env instance, opened at the first ``reset`` and kept
across episodes (OpenEnv's HTTP endpoints hold no episode); ``close()`` ends it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from trace_gym.env import AnyText
from trace_gym.errors import TraceGymError


class OpenEnvTarget(gym.Env):
    metadata = {"render_modes": []}

    def __init__(
        self,
        base_url: str,
        splits: dict[str, Any],
        split: str = "train",
        max_steps: int = 30,
        action_field: str = "text",
        observation_field: str = "text",
        split_kwarg: str | None = None,
        system_prompt: str = "",
        tools: list[dict[str, Any]] | None = None,
        message_timeout_s: float = 300.0,
    ):
        if not isinstance(splits, dict) or split not in splits:
            raise TraceGymError(
                f"OpenEnv target at {base_url}: no split {split!r} (its splits: "
                f"{', '.join(sorted(splits)) if isinstance(splits, dict) else 'none given'})"
            )
        self.base_url, self.split, self.max_steps = base_url, split, max_steps
        self.action_field, self.observation_field, self.split_kwarg = action_field, observation_field, split_kwarg
        self.system_prompt, self.default_tools = system_prompt, list(tools or [])
        self.message_timeout_s = message_timeout_s
        chosen = splits[split]
        seeds = isinstance(chosen, list) and len(chosen) == 2 and all(type(b) is int for b in chosen)
        if seeds and 0 <= chosen[0] < chosen[1]:
            self._by_seed, self.task_ids = True, [str(s) for s in range(chosen[0], chosen[1])]
        elif not seeds and isinstance(chosen, list) and chosen and all(isinstance(t, str) for t in chosen):
            self._by_seed, self.task_ids = False, [str(t) for t in chosen]
        else:
            raise TraceGymError(
                f"OpenEnv target at {base_url}: split {split!r} must be [first_seed, end_seed] or a "
                f"list of task ids, got {chosen!r}"
            )
        self.observation_space = self.action_space = AnyText()
        self._client: Any = None
        self._steps = 0
        self._done = True

    def _connect(self) -> Any:
        if self._client is None:
            try:
                from openenv.core import GenericEnvClient
            except ImportError as exc:
                raise TraceGymError(
                    f"an OpenEnv target needs openenv-core ({exc}); pip install 'trace-gym[openenv]'"
                ) from None
            client = GenericEnvClient(base_url=self.base_url, message_timeout_s=self.message_timeout_s).sync()
            try:
                client.connect()
            except Exception as exc:  # the client raises ConnectionError, OSError or its own
                raise TraceGymError(f"no OpenEnv server at {self.base_url} ({type(exc).__name__}: {exc})") from None
            self._client = client
        return self._client

    def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._connect(), what)(*args, **kwargs)
        except TraceGymError:
            raise
        except Exception as exc:  # a server error frame (RuntimeError), a dropped connection
            raise TraceGymError(
                f"OpenEnv server at {self.base_url}: {what} failed ({type(exc).__name__}: {exc})"
            ) from None

    def _text(self, observation: Any) -> str:
        if isinstance(observation, dict) and self.observation_field in observation:
            return str(observation[self.observation_field])
        raise TraceGymError(
            f"OpenEnv server at {self.base_url}: its observation has no field "
            f"{self.observation_field!r} (it has {sorted(observation) if isinstance(observation, dict) else type(observation).__name__})"
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task_id")
        task = str(task) if task is not None else self.task_ids[(seed or 0) % len(self.task_ids)]
        if task not in self.task_ids:
            raise TraceGymError(f"OpenEnv target at {self.base_url}: task {task!r} is not in its {self.split!r} split")
        kwargs: dict[str, Any] = {"seed": int(task)} if self._by_seed else {"task_id": task}
        if self.split_kwarg:
            kwargs[self.split_kwarg] = self.split
        result = self._call("reset", **kwargs)
        observation = result.observation if isinstance(result.observation, dict) else {}
        self._steps, self._done = 0, False
        info: dict[str, Any] = {
            "system_prompt": observation.get("system_prompt") or self.system_prompt,
            "tools": observation.get("tools") or self.default_tools,
            "task_id": task,
        }
        if observation.get("messages") is not None:
            info["messages"] = observation["messages"]
        return self._text(result.observation), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise TraceGymError("reset() before step(): the episode is over")
        result = self._call("step", {self.action_field: action})
        observation = result.observation if isinstance(result.observation, dict) else {}
        self._steps += 1
        info: dict[str, Any] = {}
        if observation.get("messages") is not None:
            info["messages"] = observation["messages"]
        done = bool(result.done)
        truncated = bool(observation.get("truncated")) or (not done and self._steps >= self.max_steps)
        terminated = done and not truncated
        if done or truncated:
            self._done = True
            info["termination_reason"] = observation.get("termination_reason") or ("max_steps" if truncated else "done")
            if observation.get("reward_info"):
                info["reward_info"] = observation["reward_info"]
        reward = float(result.reward or 0.0) if done else 0.0
        return self._text(result.observation), reward, terminated, truncated, info

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None
        super().close()
