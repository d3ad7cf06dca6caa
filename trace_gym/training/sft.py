"""The warm start: LoRA supervised fine-tuning on successful trajectories (TRL's ``SFTTrainer``).

A policy that never acts gives GRPO nothing to compare: every group's rewards
are equal. ``sft(config)`` fine-tunes it on trajectories that succeeded, from
any source in our trajectory format: a target's oracle on its train split, a
user's own logs, or the policy's own successes (rejection-sampling
fine-tuning). It writes into ``config.out``:

- ``adapter/``: the LoRA (PEFT format);
- ``model/``: the base model with the LoRA merged in, and its tokenizer with
  the chat template it was trained under; ``hf:<out>/model`` is then a policy
  like any other (``--model``, ``[policy]``, the router, the base of GRPO);
- ``sft_log.jsonl``: one line per optimizer step (loss, agent tokens);
- ``run.json``: the config and what the data held (episodes, tasks, tokens).

The loss is on the tokens the agent produced and nowhere else, under GRPO's
``env_mask`` convention: each demonstration is turned into the token episode a
rollout would have recorded (``LocalHF.encode_conversation``,
``encode_continuation``, ``encode_reply``: the same segments, never a re-render
of the whole transcript), and only its agent turns (each closed by the
end-of-turn token the model stops on) carry loss. System prompt, tool schemas,
tool results, user turns and template tokens carry none, nor does an agent turn
whose call a tool refused with an error: the demonstration teaches what follows
the mistake, not the mistake.

The forward pass is GRPO's update pass (``shared_update.shared_prefix_logps``):
the system prompt a micro-batch shares runs once, and only the agent's tokens
go through the output layer, so a τ² demonstration (about 9.5k tokens, 5% of
them the agent's) never materialises its full-vocabulary logits. Without
``context_gradient`` (``--no-context-gradient``) each demonstration runs turn by
turn instead, what the agent read without gradients (``detached_context_logps``).

What this module must not do: read a held-out task. A trajectory of a task in
its target's ``test`` split is refused before anything loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.env import agent_conversation
from trace_gym.llm.base import TokenEpisode, TokenTurn
from trace_gym.llm.embedded import merge_adapter
from trace_gym.llm.local import LocalHF
from trace_gym.llm.local.lora import without_checkpointing_deprecations
from trace_gym.llm.local.shared_prefix import full_attention_only
from trace_gym.llm.registry import local_spec
from trace_gym.registry import HELD_OUT_SPLIT, held_out_tasks, make
from trace_gym.seeding import derive_seed
from trace_gym.store import read_trajectories

from .config import SFTTrainingConfig, TrainingError, checkpointing
from .log import TrainLog
from .shared_update import checkpointed_layers, shared_prefix_logps
from .trainer import last_checkpoint, load_policy


@dataclass
class SFTResult:
    out: Path
    adapter: Path
    model: Path
    episodes: int
    steps: int
    first_loss: float | None
    last_loss: float | None
    wall_s: float

    @property
    def policy(self) -> str:
        """The model spec of the warm-started policy."""
        return local_spec(self.model)


def load_demonstrations(paths: list[str], min_reward: float) -> tuple[list[Any], dict[str, Any]]:
    """The successful, agent-played trajectories of ``paths``, and what was left out.
    Refuses, in one line, a file that holds an episode of a held-out task."""
    kept, skipped = [], {"below_min_reward": 0, "aborted": 0, "no_agent_turn": 0}
    held: dict[str, set[str]] = {}
    for path in paths:
        if not Path(path).exists():
            raise TrainingError(f"no trajectory file at {path}")
        for trajectory in read_trajectories(path):
            if trajectory.env_id not in held:
                held[trajectory.env_id] = held_out_tasks(trajectory.env_id)
            if trajectory.task_id is not None and str(trajectory.task_id) in held[trajectory.env_id]:
                raise TrainingError(
                    f"{path}: episode {trajectory.episode_id} plays task {trajectory.task_id} of "
                    f"{trajectory.env_id}'s held-out '{HELD_OUT_SPLIT}' split; only evaluation may "
                    "see it (roll demonstrations out with --split train)"
                )
            if trajectory.error:
                skipped["aborted"] += 1
            elif trajectory.reward < min_reward:
                skipped["below_min_reward"] += 1
            elif not any(m.role == "assistant" and m.raw is not None for m in trajectory.messages):
                skipped["no_agent_turn"] += 1
            else:
                kept.append(trajectory)
    if not kept:
        raise TrainingError(
            f"no demonstration to learn from in {', '.join(paths)}: none has reward >= {min_reward} "
            f"and an agent turn ({', '.join(f'{k} {v}' for k, v in skipped.items())})"
        )
    return kept, skipped


def env_tools(env_id: str) -> list[dict[str, Any]]:
    """The tool schemas an agent sees in ``env_id`` (what its ``reset`` puts in ``info``)."""
    env = make(env_id)
    try:
        _, info = env.reset(seed=0)
        return list(info.get("tools") or [])
    finally:
        env.close()


def demonstration_episode(backend: Any, trajectory: Any, tools: list[dict[str, Any]]) -> Any:
    """The ``TokenEpisode`` a rollout would have recorded had the model written the
    trajectory's agent turns (those with ``raw`` text; a target's scripted greeting
    is the environment's), every turn's prompt extending the last one token for token."""
    transcript = [m for m in trajectory.messages if m.requestor != "user"]
    turns = [i for i, m in enumerate(transcript) if m.role == "assistant" and m.raw is not None]
    episode = TokenEpisode()
    for n, i in enumerate(turns):
        if n == 0:
            prompt, _ = backend.encode_conversation(agent_conversation(transcript[:i]), tools)
        else:
            j, last = turns[n - 1], episode.turns[-1]
            prompt = [
                *last.prompt_ids,
                *last.completion_ids,
                *backend.encode_continuation(
                    transcript[j].to_openai(), agent_conversation(transcript[j + 1 : i]), last.completion_ids
                ),
            ]
        completion = backend.encode_reply(transcript[i].to_openai())
        episode.turns.append(TokenTurn(prompt_ids=prompt, completion_ids=completion, logprobs=[0.0] * len(completion)))
    return episode


def demonstration_rows(
    backend: Any, trajectories: list[Any], max_tokens: int, whole_only: bool = False
) -> list[dict[str, list[int]]]:
    """One training row per demonstration: ``prompt_ids`` (up to the first agent
    turn), ``completion_ids`` (the rest) and ``completion_mask`` (1 exactly on the
    agent's tokens, except turns a tool refused: ``refused_turns``), cut after the
    last agent turn that fits in ``max_tokens``; with ``whole_only``, a demonstration
    that does not fit whole is left out instead."""
    tools: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for trajectory in trajectories:
        if trajectory.env_id not in tools:
            tools[trajectory.env_id] = env_tools(trajectory.env_id)
        episode = demonstration_episode(backend, trajectory, tools[trajectory.env_id])
        if whole_only and len(episode.ids) > max_tokens:
            continue
        while episode.turns and len(episode.ids) > max_tokens:
            episode.turns.pop()
        if not episode.turns:
            continue  # not even the first agent turn fits
        episode.check()
        grpo = episode.for_grpo()
        mask = list(grpo["env_mask"])
        start = len(episode.turns[0].prompt_ids)
        for turn, refused in zip(episode.turns, refused_turns(trajectory)):
            if refused:  # a call the tool refused is context for what follows, never a target
                at = len(turn.prompt_ids) - start
                mask[at : at + len(turn.completion_ids)] = [0] * len(turn.completion_ids)
        if not any(mask):
            continue
        rows.append(
            {
                "prompt_ids": grpo["prompt_ids"],
                "completion_ids": grpo["completion_ids"],
                "completion_mask": mask,
                "episode_id": trajectory.episode_id,
                "prompt_group": _prompt_group(trajectory),
            }
        )
    return rows


def refused_turns(trajectory: Any) -> list[bool]:
    """For each agent turn (an assistant message with ``raw`` text), in order: whether
    a tool answered one of its calls with an error. Such a turn carries no loss: a
    successful episode that recovers from a mistake teaches the recovery, not the
    mistake (``fixes_error`` demonstrations, or a user's own logs)."""
    out: list[bool] = []
    answering: int | None = None  # the agent turn the tool messages that follow answer
    for message in trajectory.messages:
        if message.role == "assistant":
            answering = len(out) if message.raw is not None else None  # (a scripted turn is the env's)
            if message.raw is not None:
                out.append(False)
        elif message.role == "tool" and message.requestor == "assistant" and message.error and answering is not None:
            out[answering] = True
    return out


def _prompt_group(trajectory: Any) -> str:
    """What a demonstration's prompt opens with: its env (the tools) and system prompt."""
    system = next((m.content or "" for m in trajectory.messages if m.role == "system"), "")
    return hashlib.sha256(f"{trajectory.env_id}\n{system}".encode()).hexdigest()[:16]


class SharedPromptSampler:
    """The order rows are read in, one epoch at a time: every run of ``micro_batch``
    consecutive rows (one forward pass) opens with the same prompt, so that pass
    runs that prompt once (``shared_prefix_logps``) instead of once per row, and no
    pass mixes a 5k-token τ² prompt with another env's rows, which would share
    nothing and hold every row's whole length in memory with gradients.

    Rows are shuffled within their group and cut into micro-batches, a group's last
    short one filled with rows of that group drawn again; the micro-batches are then
    shuffled. The order is a function of ``seed`` and the epoch (``set_epoch``, as
    the Trainer calls it), so a resumed run reads the same order."""

    def __init__(self, groups: list[str], micro_batch: int, seed: int):
        self.groups, self.micro_batch, self.seed, self.epoch = list(groups), micro_batch, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def batches(self) -> list[list[int]]:
        rng = random.Random(derive_seed(self.seed, "sft-order", self.epoch))
        out = []
        for key in sorted(set(self.groups)):
            rows = [i for i, g in enumerate(self.groups) if g == key]
            rng.shuffle(rows)
            short = -len(rows) % self.micro_batch
            rows += [rng.choice(rows) for _ in range(short)]
            out += [rows[i : i + self.micro_batch] for i in range(0, len(rows), self.micro_batch)]
        rng.shuffle(out)
        return out

    def __iter__(self):
        return iter([i for batch in self.batches() for i in batch])

    def __len__(self) -> int:
        return sum(-(-self.groups.count(g) // self.micro_batch) * self.micro_batch for g in set(self.groups))


class _Collator:
    """Rows to a batch in GRPO's layout: prompts left-padded, completions right-padded."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        p = max(len(r["prompt_ids"]) for r in rows)
        c = max(len(r["completion_ids"]) for r in rows)
        ids, attention, scored = [], [], []
        for r in rows:
            lp, lc = len(r["prompt_ids"]), len(r["completion_ids"])
            ids.append(
                [self.pad_id] * (p - lp) + list(r["prompt_ids"]) + list(r["completion_ids"]) + [self.pad_id] * (c - lc)
            )
            attention.append([0] * (p - lp) + [1] * (lp + lc) + [0] * (c - lc))
            scored.append(list(r["completion_mask"]) + [0] * (c - lc))
        batch = {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.tensor(attention),
            "completion_mask": torch.tensor(scored, dtype=torch.bool),
        }
        if all("prefix_len" in r for r in rows):
            batch["prefix_len"] = torch.tensor([r["prefix_len"] for r in rows])
        return batch


def agent_token_logps(model: Any, batch: dict[str, Any], prefix_gradient: bool = True) -> tuple[Any, Any]:
    """(log-probabilities [rows, completion width], mask) of the agent's tokens
    of a collated batch; the shared prompt runs once, only agent tokens reach the
    output layer. Falls back to the model's plain forward where sharing does not
    apply (reentrant gradient checkpointing, a sliding-window model)."""
    import torch

    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    keep = mask.shape[1]
    part = shared_prefix_logps(
        model, ids, attention, keep, temperature=1.0, scored=mask, min_shared=1, prefix_grad=prefix_gradient
    )
    if part is not None:
        return part[0], mask
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep + 1).logits[:, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -keep:, None]).squeeze(-1)
    return logps.masked_fill(~mask, 0.0), mask


def prompt_prefix_lengths(rows: list[dict[str, Any]]) -> None:
    """Sets each row's ``prefix_len``: the tokens every prompt of its prompt group opens
    with (the system prompt and tool schemas), ending before its own last prompt token,
    the one that predicts its first agent token. ``detached_context_logps`` runs that
    prefix once per optimizer step for the whole group."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(row["prompt_group"], []).append(row)
    for members in by_group.values():
        first = members[0]["prompt_ids"]
        length = min(len(r["prompt_ids"]) for r in members) - 1
        for row in members[1:]:
            length = next((i for i in range(length) if row["prompt_ids"][i] != first[i]), length)
        for row in members:
            row["prefix_len"] = max(length, 0)


class PrefixStore:
    """Keys and values of the prompts rows share, kept for one optimizer step: the weights
    do not change between the micro-batches a step accumulates, so each is computed once a
    step (without gradients) instead of once a micro-batch."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.layers: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}
        self.passes = 0  # prefix passes run (read by tests)

    def get(self, model: Any, tokens: Any, step: int) -> list[tuple[Any, Any]]:
        import torch
        from transformers.cache_utils import DynamicCache

        if step != self.step:
            self.step, self.layers = step, {}
        key = tuple(tokens.tolist())
        if key not in self.layers:
            cache = DynamicCache()
            with torch.no_grad():
                positions = torch.arange(len(tokens), device=tokens.device)[None]
                model(
                    input_ids=tokens[None],
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            self.layers[key] = [(layer.keys, layer.values) for layer in cache.layers]
            self.passes += 1
        return self.layers[key]


def scored_runs(scored: list[bool], start: int) -> list[tuple[int, int, bool]]:
    """[a, b) runs of positions from ``start`` to the last scored one, each with whether its
    positions are scored (each predicts an agent token); positions after the last are left out."""
    last = max((i for i, s in enumerate(scored) if s), default=-1)
    runs: list[tuple[int, int, bool]] = []
    for i in range(start, last + 1):
        if runs and runs[-1][2] == scored[i]:
            runs[-1] = (runs[-1][0], i + 1, scored[i])
        else:
            runs.append((i, i + 1, scored[i]))
    return runs


def chunked_cache(layers: int, prefix: list[tuple[Any, Any]] | None = None) -> Any:
    """A transformers cache that keeps what each forward appends as a chunk of its own and
    joins the chunks anew at every read, so a pass without gradients never cuts the graph of
    the chunks before it (a plain cache's ``torch.cat`` under ``no_grad`` would). ``prefix``:
    one (keys, values) per layer to start from."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    class ChunkLayer(DynamicLayer):
        def __init__(self, keys: Any = None, values: Any = None) -> None:
            super().__init__()
            self.chunks: list[tuple[Any, Any]] = []
            if keys is not None:
                self.lazy_initialization(keys, values)
                self.chunks.append((keys, values))
                self.keys, self.values = keys, values

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.chunks.append((key_states, value_states))
            self.keys = torch.cat([k for k, _ in self.chunks], dim=-2)
            self.values = torch.cat([v for _, v in self.chunks], dim=-2)
            return self.keys, self.values

    return Cache(layers=[ChunkLayer(*(prefix[i] if prefix else (None, None))) for i in range(layers)])


def detached_context_logps(
    model: Any, batch: dict[str, Any], prefixes: PrefixStore | None = None, step: int = 0
) -> tuple[Any, Any] | None:
    """(log-probabilities [rows, completion width], mask) of the agent's tokens, as
    ``agent_token_logps`` gives them, with a stop-gradient on the keys and values of every
    position that predicts no agent token: each row runs in turn order, its context (the
    shared prompt, tool results, user turns, template tokens, each turn's end-of-turn
    token) without gradients, each run of predicting positions with them, on top of the
    keys and values before it (``chunked_cache``: a later turn's loss still reaches the
    keys and values of the agent's earlier turns). The forward is the model's own; the
    gradient leaves out how the weights change the keys and values of what the agent
    read, ``prefix_gradient``'s stop-gradient on every context token. A τ² demonstration
    is about 95% context, so a step costs about a forward pass of it instead of a forward
    and a backward. ``prefixes`` holds each shared prompt for the optimizer step ``step``.
    None where this does not apply: a model with a sliding window (its cache keeps only
    the window), gradient checkpointing (its layers drop the cache), nothing scored."""
    import torch

    inner = getattr(model, "module", model)
    config = getattr(inner, "config", None)
    if config is None or not full_attention_only(config.get_text_config()) or checkpointed_layers(inner):
        return None
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    if not bool(mask.any()):
        return None
    rows, width = ids.shape
    keep = mask.shape[1]
    start = width - keep  # the first completion column
    prefix_lens = batch.get("prefix_len")
    store = prefixes if prefixes is not None else PrefixStore()
    depth = config.get_text_config().num_hidden_layers
    out = torch.zeros(rows, keep, dtype=torch.float32, device=ids.device)
    for r in range(rows):
        real = attention[r].bool()
        first = int(real.int().argmax())
        tokens = ids[r][real]
        prompt = start - first
        targets = [False] * len(tokens)
        for column in mask[r].nonzero().flatten().tolist():
            targets[prompt + column] = True
        scored = [*targets[1:], False]  # position p predicts token p + 1
        prefix = max(min(int(prefix_lens[r]) if prefix_lens is not None else 0, prompt - 1), 0)
        runs = scored_runs(scored, prefix)
        if not runs:
            continue
        cache = chunked_cache(depth, store.get(model, tokens[:prefix], step) if prefix else None)
        for a, b, grad in runs:
            positions = torch.arange(a, b, device=ids.device)[None]
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                output = model(
                    input_ids=tokens[None, a:b],
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    **({} if grad else {"logits_to_keep": 1}),
                )
            if grad:
                logps = torch.log_softmax(output.logits[0].float(), dim=-1)
                picked = logps.gather(-1, tokens[a + 1 : b + 1, None]).squeeze(-1)
                columns = torch.arange(a + 1, b + 1, device=ids.device) - prompt
                out = out.index_put((torch.full((b - a,), r, device=ids.device), columns), picked)
            del output
    return out.masked_fill(~mask, 0.0), mask


def _trainer_class() -> type:
    from trl import SFTTrainer

    class AgentTokenSFTTrainer(SFTTrainer):
        """TRL's SFTTrainer whose loss is the mean negative log-likelihood of the
        agent's tokens, scored by ``agent_token_logps`` (``detached_context_logps``
        without ``context_gradient``)."""

        prefix_gradient = True
        context_gradient = True
        prompt_groups: list[str] | None = None
        prefixes: PrefixStore | None = None  # this trainer's shared prompts, for its current step

        def _get_train_sampler(self, train_dataset=None):
            if self.prompt_groups is None:
                return super()._get_train_sampler(train_dataset)
            return SharedPromptSampler(self.prompt_groups, self.args.per_device_train_batch_size, self.args.seed)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            part = None
            if not self.context_gradient:
                part = detached_context_logps(model, inputs, self.prefixes, self.state.global_step)
            logps, mask = part if part is not None else agent_token_logps(model, inputs, self.prefix_gradient)
            tokens = mask.sum().clamp(min=1)
            loss = -(logps * mask).sum() / tokens
            self._metrics["train"]["agent_tokens"].append(float(tokens))
            return (loss, None) if return_outputs else loss

    return AgentTokenSFTTrainer


RESUME_IGNORES = ("resume", "torch_threads")
"""Config fields a resumed run may change: they do not change what is learnt."""


def _check_out(out: Path, config: SFTTrainingConfig) -> Path | None:
    """The checkpoint to resume from (None: a fresh run); refuses, in one line, a folder
    that holds a finished warm start, or a resume with no checkpoint or another config."""
    if (out / "model").exists():
        raise TrainingError(f"{out} already holds a warm start; choose another --out (or delete it to rebuild)")
    if not config.resume:
        if (out / "run.json").exists():
            raise TrainingError(
                f"{out} already holds a warm start (unfinished: --resume goes on from its last "
                "checkpoint); choose another --out (or delete it to rebuild)"
            )
        return None
    checkpoint = last_checkpoint(out / "checkpoints")
    if checkpoint is None or not (out / "run.json").exists():
        raise TrainingError(f"nothing to resume in {out}: no checkpoint of an earlier sft run (drop --resume)")
    before = json.loads((out / "run.json").read_text(encoding="utf-8"))["config"]
    now = config.as_dict()
    # a field newer than the run is read at its default: what that run did
    defaults = SFTTrainingConfig(trajectories=[], out="").as_dict()
    changed = sorted(k for k in now if k not in RESUME_IGNORES and before.get(k, defaults[k]) != now[k])
    if changed:
        raise TrainingError(
            f"--resume with another config than {out}'s run ({', '.join(changed)} differ); "
            "resume with the same options or choose another --out"
        )
    return checkpoint


def sft(config: SFTTrainingConfig, *, progress: bool | None = None) -> SFTResult:
    """Warm-start ``config.model`` on the demonstrations; see the module docstring."""
    config.check()
    out = Path(config.out)
    checkpoint = _check_out(out, config)
    for module, extra in (("trl", "train"), ("peft", "models"), ("datasets", "train")):
        if importlib.util.find_spec(module) is None:
            raise TrainingError(f"sft needs {module}: pip install 'trace-gym[{extra}]'")
    demonstrations, skipped = load_demonstrations(config.trajectories, config.min_reward)
    t0 = time.perf_counter()

    dtype = config.resolved_dtype()
    model, tokenizer, model_path = load_policy(config.model, dtype, device=config.device)

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig

    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if not config.context_gradient and not full_attention_only(model.config.get_text_config()):
        raise TrainingError(
            f"--no-context-gradient needs a model whose every layer attends to the whole context; {config.model} "
            "has a sliding window (its cache keeps only the window): drop the option"
        )
    context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or 8192
    max_tokens = min(config.max_tokens or context, context)
    backend = LocalHF.from_model(model, tokenizer, name=config.model)
    rows = demonstration_rows(backend, demonstrations, max_tokens, config.whole_only)
    if not rows:
        raise TrainingError(
            f"no demonstration fits in {max_tokens} tokens, "
            + ("whole (--whole-only)" if config.whole_only else "not even its first agent turn")
        )
    prompt_prefix_lengths(rows)
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows]
    agent = [sum(r["completion_mask"]) for r in rows]
    summary = {
        "episodes": len(rows),
        "skipped": {**skipped, "not_trained_on": len(demonstrations) - len(rows)},
        "tasks": sorted({d.task_id or f"seed-{d.seed}" for d in demonstrations}),
        "envs": sorted({d.env_id for d in demonstrations}),
        "tokens_mean": statistics.fmean(lengths),
        "agent_token_share": sum(agent) / sum(lengths),
        "max_tokens": max_tokens,
        "dtype": dtype,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(
        json.dumps({"config": config.as_dict(), "data": summary}, indent=2) + "\n", encoding="utf-8"
    )
    print(
        f"trace-gym sft: {len(rows)} demonstrations ({summary['tokens_mean']:.0f} tokens each on average, "
        f"{100 * summary['agent_token_share']:.1f}% the agent's), {config.epochs} epochs"
        + (
            f"; {len(demonstrations) - len(rows)} left out, longer than {max_tokens} tokens"
            if config.whole_only
            else ""
        )
        + (f", resumed from {checkpoint.name}" if checkpoint else ""),
        flush=True,
    )

    cpu = config.device == "cpu"
    args = SFTConfig(
        output_dir=str(out / "checkpoints"),
        num_train_epochs=config.epochs,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=2,
        optim="adamw_torch",
        per_device_train_batch_size=config.micro_batch,
        gradient_accumulation_steps=config.batch_size // config.micro_batch,
        use_cpu=cpu,
        bf16=not cpu and dtype == "bfloat16",
        fp16=False,
        seed=config.seed,
        data_seed=config.seed,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=1,
        report_to=[],
        disable_tqdm=not progress if progress is not None else None,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        **checkpointing(SFTConfig, False),  # TRL's SFTConfig turns it on: a LoRA on a 135M model need not recompute
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    log_path = out / "sft_log.jsonl"

    log = TrainLog(log_path)
    previous = log.truncate_to(int(checkpoint.name.split("-", 1)[1])) if checkpoint else []
    losses: list[float] = [float(row["loss"]) for row in previous]

    from transformers import TrainerCallback

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                log.append(
                    {
                        "iteration": state.global_step,
                        "epoch": logs.get("epoch"),
                        "loss": logs["loss"],
                        "grad_norm": logs.get("grad_norm"),
                        "agent_tokens": logs.get("agent_tokens"),
                        "elapsed_s": round(time.perf_counter() - t0, 3),
                    }
                )

    with without_checkpointing_deprecations():  # (peft asks the model about checkpointing as it wraps it)
        trainer = _trainer_class()(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(
                [{k: r[k] for k in ("prompt_ids", "completion_ids", "completion_mask", "prefix_len")} for r in rows]
            ),
            processing_class=tokenizer,
            data_collator=_Collator(tokenizer.pad_token_id),
            peft_config=LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=0.0,
                target_modules=list(config.lora_target_modules),
                task_type="CAUSAL_LM",
            ),
            callbacks=[Log()],
        )
    trainer.prefix_gradient = config.prefix_gradient
    trainer.context_gradient = config.context_gradient
    trainer.prefixes = PrefixStore()
    trainer.prompt_groups = [r["prompt_group"] for r in rows]
    with without_checkpointing_deprecations():
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    adapter = out / "adapter"
    trainer.model.save_pretrained(str(adapter))

    merged = merge_adapter(Path(model_path), adapter, out / "model", tokenizer.chat_template)
    steps = trainer.state.global_step
    return SFTResult(
        out=out,
        adapter=adapter,
        model=merged,
        episodes=len(rows),
        steps=steps,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        wall_s=time.perf_counter() - t0,
    )


def export_adapter(adapter: str | Path, target: str | Path, dtype: str = "bfloat16") -> Path:
    """Copy a trained adapter (PEFT folder) to ``target`` with its weights in
    ``dtype``: how a warm start is shipped (half the bytes of float32; merged
    into a float32 model on load)."""
    import torch
    from safetensors.torch import load_file, save_file

    adapter, target = Path(adapter), Path(target)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = None  # a local cache path; the warm start names its base itself
    target.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(getattr(torch, dtype)).contiguous() for k, v in weights.items()},
        str(target / "adapter_model.safetensors"),
    )
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target
