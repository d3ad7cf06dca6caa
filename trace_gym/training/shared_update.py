"""The update's forward passes with the rows' shared prompt computed once.

TRL scores a micro-batch by running every row whole: prompt and completion. The
rows of a GRPO batch all start with the same system prompt and tool schemas (and
the K rows of one group with the same whole prompt), which is most of each row
on our envs (about 800 of 960 tokens on tool-precision), so most of the update's
forward and backward work is the same prefix, repeated per row.

``shared_prefix_logps`` runs the longest prefix the rows share once (batch 1,
with gradients), then, on top of it, the rest of each prompt once (a group's K
rows share their whole prompt), then each row's remaining tokens on top of its
prompt through the model's own attention and key/value cache, the prompt's
keys and values broadcast to the group's rows. A group's rows run only up to
the last token it scores: trailing tool results and padding are never
computed. The backward pass flows into each prefix once, summed over the rows,
which is exactly the gradient of the rows run whole. The completion tokens'
log-probabilities are the same as TRL's (up to float rounding); the tests
compare both passes and the LoRA gradients, also for a micro-batch of groups
with no common system prompt (a mixture of envs).

Differences, by design: LoRA dropout, if any, draws one mask for the shared
prefix instead of one per row; positions count from each row's first real token
(TRL's count from the padded column, which rotary embeddings do not see).

Two more savings, both exact for the loss:

- only the tokens the model sampled go through the vocabulary-wide softmax,
  and on Llama-family models (whose logits are the output layer alone) through
  the output layer (the trainer finds each row's env_mask by its completion);
  tool results and user turns carry no loss weight, so their log-probabilities
  are left at 0 (about a third of a tool-precision completion);
- ``group_rows`` puts the rows of one group into one micro-batch after TRL's
  shuffle, so a micro-batch shares its whole prompt, not only the system prompt.

One pass skipped, exact as well: while the LoRA adds nothing (every B at peft's
zero init, so before the first optimizer step of a fresh adapter), the policy
is its own KL reference (``adapter_is_identity``). TRL's reference pass (a whole
forward per generation) is then not run; the loss takes the policy's own
log-probabilities, detached, as the reference, which gives the KL term its true
value (0) and gradient (0). A resumed or warm adapter has non-zero B and takes
TRL's pass.

Under gradient checkpointing (non-reentrant, as the trainer sets it) the shared
passes keep working: the prefix's keys and values reach each layer through a
cache that never changes (``prefix_cache``), so a layer the backward pass
recomputes reads the same prefix again, and transformers is told that the
layers may read it (its checkpointed layers otherwise drop any cache). The
memory saved is checkpointing's (each layer's input kept, its insides
recomputed), on top of the prefix run once.

``shared_prefix_logps`` returns None where it does not apply (no prefix worth
sharing, nothing scored, reentrant checkpointing, which gives gradients only to
a layer's outputs and not to the keys a later pass reads, a sliding-window
model, whose cache keeps only the window); the caller then takes TRL's own
path. Memory: the sampled positions' logits are held in full
(sampled tokens x vocabulary, in fp32), where TRL's fused head tiles them;
on a large vocabulary with long completions, lower ``micro_batch`` or switch
this off.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from trace_gym.llm.local.shared_prefix import PLAIN_DECODERS, full_attention_only

MIN_SHARED_TOKENS = 16  # below this, running the rows whole costs about the same


def prefix_cache(layers: int, prefix: list[tuple[Any, Any]] | None = None, *, keep: bool = False) -> Any:
    """A transformers cache holding ``prefix`` (one (keys, values) per layer; none:
    empty) that a forward pass reads and never changes: each layer gets the
    prefix's keys and values with its new ones appended, and the prefix stays as
    it was. A layer recomputed by gradient checkpointing in the backward pass
    therefore reads the same prefix as in the forward (a growing cache would hand
    it its own keys twice). With ``keep``, each layer's appended keys and values
    are kept (``extended(cache)``) for a pass that starts where this one ends."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    class PrefixLayer(DynamicLayer):
        def __init__(self, keys: Any = None, values: Any = None) -> None:
            super().__init__()
            self.extended = None
            if keys is not None:
                self.lazy_initialization(keys, values)
                self.keys, self.values = keys, values

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            both = torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
            if keep:
                self.extended = both
            return both

    return Cache(layers=[PrefixLayer(*(prefix[i] if prefix else (None, None))) for i in range(layers)])


class CacheNotRead(Exception):
    """A layer never read its cache (a model whose layers drop it): the shared pass does not apply."""


def extended(cache: Any) -> list[tuple[Any, Any]]:
    """The prefix with the keys and values a ``prefix_cache(..., keep=True)`` pass appended, per layer."""
    layers = [layer.extended for layer in cache.layers]
    if any(layer is None for layer in layers):
        raise CacheNotRead
    return layers


def checkpointed_layers(model: Any) -> list[Any]:
    """The layers of ``model`` that gradient checkpointing recomputes in training mode."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not model.training:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def reentrant(layer: Any) -> bool:
    """Whether ``layer`` is checkpointed the reentrant way (torch's old default), which
    runs the forward without autograd and gives gradients only to its outputs."""
    function = getattr(layer, "_gradient_checkpointing_func", None)
    return getattr(function, "keywords", {}).get("use_reentrant", True) is not False


@contextlib.contextmanager
def reading_cache_under_checkpointing(layers: list[Any]) -> Iterator[None]:
    """Lets checkpointed ``layers`` read a cache: transformers drops the cache of a
    checkpointed layer in training (a growing cache would be written twice), which
    a ``prefix_cache`` never is. Each layer's own setting is back afterwards."""
    before = [layer.__dict__.get("_can_checkpoint_with_cache") for layer in layers]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer, value in zip(layers, before):
            if value is None:
                del layer._can_checkpoint_with_cache
            else:
                layer._can_checkpoint_with_cache = value


def shared_prefix_len(input_ids: Any, attention_mask: Any, logits_to_keep: int) -> tuple[int, Any]:
    """(P, first): the length of the token prefix all rows share, counted from each
    row's first real token (``first``, after left padding), and ending before
    every row's last prompt token, so every completion token is predicted from a
    position after the prefix."""
    import torch

    width = input_ids.shape[1]
    mask = attention_mask.bool()
    first = mask.int().argmax(dim=1)
    start = width - logits_to_keep  # the first completion column
    limit = int((start - 1 - first).min())
    if limit <= 0:
        return 0, first
    columns = first[:, None] + torch.arange(limit, device=input_ids.device)[None, :]
    aligned = input_ids.gather(1, columns)
    shared = (aligned == aligned[:1]).all(dim=0) & mask.gather(1, columns).all(dim=0)
    length = limit if bool(shared.all()) else int((~shared).int().argmax())
    return length, first


def _decoder_and_head(inner: Any) -> tuple[Any, Any] | None:
    """(decoder, output layer) of a causal LM whose logits are the output layer
    applied to the decoder's last hidden state, nothing else (no soft-capping,
    no logit scale); None for other models (their logits come from the model)."""
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    if getattr(getattr(base, "config", None), "model_type", "") not in PLAIN_DECODERS:
        return None
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    return (decoder, head) if decoder is not None and head is not None else None


def prompt_groups(input_ids: Any, attention_mask: Any, logits_to_keep: int) -> list[list[int]]:
    """The rows grouped by their prompt (the real tokens before the completion
    columns), groups in the order of their first row: the K rollouts of one seed."""
    start = input_ids.shape[1] - logits_to_keep
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (ids, keep) in enumerate(zip(input_ids[:, :start].tolist(), attention_mask[:, :start].tolist())):
        groups.setdefault(tuple(t for t, k in zip(ids, keep) if k), []).append(row)
    return list(groups.values())


def _checkpointing_aware(function: Any) -> Any:
    """``function`` (``shared_prefix_logps``) run so that checkpointed layers read
    its caches; None under reentrant checkpointing or where a layer never read one."""

    @functools.wraps(function)
    def run(model: Any, *args: Any, **kwargs: Any) -> Any:
        checkpointed = checkpointed_layers(getattr(model, "module", model))
        if any(reentrant(layer) for layer in checkpointed):
            return None
        with reading_cache_under_checkpointing(checkpointed), contextlib.suppress(CacheNotRead):
            return function(model, *args, **kwargs)
        return None

    return run


@_checkpointing_aware
def shared_prefix_logps(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    temperature: float,
    compute_entropy: bool = False,
    entropy_grad: bool = False,
    min_shared: int = MIN_SHARED_TOKENS,
    scored: Any = None,
    prefix_grad: bool = True,
) -> tuple[Any, Any] | None:
    """Per-token log-probabilities [rows, logits_to_keep] of the last
    ``logits_to_keep`` tokens of each row (and their entropies, if asked; with
    gradient if ``entropy_grad``, for an entropy bonus), as TRL's
    ``_get_per_token_logps_and_entropies`` returns them; None when no rows share
    ``min_shared`` tokens, the model cannot keep a cache, or no position is scored.

    Two levels of sharing: the prefix all rows share (the system prompt and tool
    schemas) runs once; on top of it, each group of rows with one prompt runs the
    rest of its prompt once; then the group's rows run their own tokens, only
    up to the group's last scored position (trailing tool results and padding
    are never computed).

    ``scored`` [rows, logits_to_keep] bool, if given, names the positions whose
    values are used (the tokens the model sampled: TRL's loss mask lies within
    them); the others are 0 and never reach the output layer, which on a
    multi-turn episode spares the vocabulary-wide softmax of every tool result
    and user token.

    ``prefix_grad=False`` runs the prefix all rows share without gradients: the
    forward is unchanged, the gradient leaves out how the weights change the
    shared prompt's keys and values (a stop-gradient on the system prompt; the
    SFT warm start's option, never GRPO's)."""
    import torch

    inner = getattr(model, "module", model)  # (under a DDP wrapper, the model it wraps)
    config = getattr(inner, "config", None)
    if config is None or not full_attention_only(config.get_text_config()):
        return None  # a sliding-window cache keeps only the window of the prefix
    rows, width = input_ids.shape
    device = input_ids.device
    start = width - logits_to_keep  # the first completion column
    length, first = shared_prefix_len(input_ids, attention_mask, logits_to_keep)
    if bool((first >= start).any()):
        return None  # a row without a prompt (not TRL's layout): nothing predicts its first token
    length = length if length >= min_shared else 0  # (a chat template's few opening tokens are not worth a pass)
    groups = []
    for members in prompt_groups(input_ids, attention_mask, logits_to_keep):
        index = torch.tensor(members, device=device)
        groups.append((index, shared_prefix_len(input_ids[index], attention_mask[index], logits_to_keep)[0]))
    if not length and not any(len(index) > 1 and shared >= min_shared for index, shared in groups):
        return None
    pick = attention_mask[:, start:].bool()  # padded slots are 0, as TRL's pass gives
    if scored is not None:
        pick = pick & scored.to(device=device, dtype=torch.bool)
    if not bool(pick.any()):
        return None  # (TRL's pass keeps the loss attached to the graph)
    split = _decoder_and_head(inner) if model is inner else None  # (a DDP wrapper's forward must run: it syncs)
    run = split[0] if split is not None else model  # the decoder alone, where the output layer can be applied apart

    depth = config.get_text_config().num_hidden_layers

    def extend(
        layers: list[tuple[Any, Any]] | None, ids: Any, positions: Any, keep: bool = False, **inputs: Any
    ) -> Any:
        """The model on ``ids`` after the prefix ``layers``: (output, the prefix
        extended by ``ids``' keys and values if ``keep``)."""
        cache = prefix_cache(depth, layers, keep=keep)
        output = run(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=False, **inputs)
        return output, extended(cache) if keep else None

    one_logit = {} if split is not None else {"logits_to_keep": 1}
    base = None
    if length:
        at = int(first[0])
        with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
            base = extend(
                None, input_ids[:1, at : at + length], torch.arange(length, device=device)[None, :], True, **one_logit
            )[1]
    states, where_rows, where_columns = [], [], []
    for index, shared in groups:
        need = pick[index]
        live = need.any(dim=1)
        if not bool(live.any()):
            continue
        index, need = index[live], need[live]
        ids, mask, starts = input_ids[index], attention_mask[index], first[index]
        layers = base
        if shared > length:  # the rest of the group's prompt, once
            at = int(starts[0])
            layers = extend(
                base,
                ids[:1, at + length : at + shared],
                torch.arange(length, shared, device=device)[None, :],
                True,
                **one_logit,
            )[1]
        # the rows' own tokens, aligned on the original columns, up to the last position the group scores
        kept = int(need.any(dim=0).nonzero().max()) + 1  # completion columns up to the last scored one
        lo, end = int(starts.min()) + shared, start + kept - 1  # (the last scored token is predicted, not fed)
        columns = torch.arange(lo, end, device=device)
        own = mask[:, lo:end].bool() & (columns[None, :] >= (starts + shared)[:, None])
        n = len(index)
        output, _ = extend(
            [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers] if layers else None,
            ids[:, lo:end],
            (columns[None, :] - starts[:, None]).clamp(min=0),
            attention_mask=torch.cat([torch.ones(n, shared, dtype=torch.long, device=device), own.long()], dim=1),
            **({} if split is not None else {"logits_to_keep": kept}),
        )
        need = need[:, :kept]
        states.append((output.last_hidden_state if split is not None else output.logits)[:, -kept:][need])
        del output
        at_row, at_column = need.nonzero(as_tuple=True)
        where_rows.append(index[at_row])
        where_columns.append(at_column)
    where = (torch.cat(where_rows), torch.cat(where_columns))
    logits = torch.cat(states)
    if split is not None:
        logits = split[1](logits)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, input_ids[:, start:][where][:, None]).squeeze(-1)
    token_logps = picked.new_zeros(rows, logits_to_keep).index_put(where, picked)
    entropy = None
    if compute_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            values = -(log_probs.exp() * log_probs).sum(dim=-1)
            entropy = values.new_zeros(rows, logits_to_keep).index_put(where, values)
    return token_logps, entropy


def group_rows(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of TRL's shuffled micro-batches, reordered so that the rows of one
    group (one prompt) sit side by side, and split again into as many micro-batches
    of the same size. A micro-batch of one group shares its whole prompt, not
    only the system prompt. The gradient is unchanged: the micro-batches of an
    iteration accumulate into one optimizer step (each row's loss weight does not
    depend on its micro-batch under the ``grpo``/``dapo``/``dr_grpo`` losses;
    ``bnpo``, an entropy bonus and TRL's per-micro-batch metrics (clip ratios'
    min/max) average per micro-batch, now over groups instead of a random
    partition). The caller regroups only when one generation is one optimizer
    step (TRL's ``steps_per_generation`` equal to its gradient accumulation)."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    if len(batches) < 2 or any(key in batches[0] for key in ("pixel_values", "num_images")):
        return batches
    merged: dict[str, Any] = {}
    for key, value in batches[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            merged[key] = torch.cat([b[key] for b in batches])
        elif isinstance(value, list):
            merged[key] = [v for b in batches for v in b[key]]
        else:
            merged[key] = value  # a scalar (num_items_in_batch) or None: the same in every micro-batch
    order = [row for group in prompt_groups(merged["prompt_ids"], merged["prompt_mask"], 0) for row in group]
    for key, value in merged.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            merged[key] = value[torch.tensor(order, device=value.device)]
        elif isinstance(value, list):
            merged[key] = [value[row] for row in order]
    return split_tensor_dict(merged, len(batches))


def sampled_positions(
    completion_ids: list[list[int]], env_masks: list[list[int]] | None
) -> dict[tuple[int, ...], list[int]]:
    """completion ids -> env_mask (1 on the tokens the model sampled) of one
    generation; two rows with one completion get what either sampled."""
    table: dict[tuple[int, ...], list[int]] = {}
    for ids, mask in zip(completion_ids, env_masks or []):
        before = table.get(tuple(ids))
        table[tuple(ids)] = list(mask) if before is None else [a or b for a, b in zip(before, mask)]
    return table


def scored_positions(
    table: dict[tuple[int, ...], list[int]], input_ids: Any, attention_mask: Any, logits_to_keep: int
) -> Any:
    """[rows, logits_to_keep] bool: the positions of the tokens each row's model
    sampled, found in ``table`` by the row's completion; a row whose completion is
    not there scores each of its real positions (so what a row gets never depends
    on the rows it is scored beside: its policy and reference passes agree); None
    (score every position) when there is no table."""
    import torch

    if not table:
        return None
    real = attention_mask[:, -logits_to_keep:].bool()
    scored = real.clone().cpu()
    for row, (ids, keep) in enumerate(zip(input_ids[:, -logits_to_keep:].tolist(), real.tolist())):
        mask = table.get(tuple(t for t, k in zip(ids, keep) if k))
        if mask is not None:
            scored[row] = False
            scored[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return scored


def chunk_logps(
    model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *, scored: Any, whole: Any, **options: Any
) -> tuple[Any, Any, bool]:
    """(log-probabilities, entropies, shared) of one chunk: ``shared_prefix_logps``
    where it applies, else ``whole(model, input_ids, attention_mask,
    logits_to_keep)`` (TRL's pass). Either way the positions outside ``scored``
    are 0, so the policy and KL-reference passes of a row agree there even when
    one takes the shared path and the other does not (TRL's KL term of a 0
    against a real log-probability can overflow to NaN)."""
    part = shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, scored=scored, **options)
    if part is not None:
        return part[0], part[1], True
    logps, entropy = whole(model, input_ids, attention_mask, logits_to_keep)
    if scored is not None:
        off = ~scored.to(logps.device)  # (masked, not multiplied: a -inf there would give NaN)
        logps = logps.masked_fill(off, 0.0)
        entropy = entropy.masked_fill(off, 0.0) if entropy is not None else None
    return logps, entropy, False


def adapter_is_identity(model: Any) -> bool:
    """Whether ``model`` is a peft LoRA that adds nothing yet: every B matrix zero
    (peft's default init) and nothing else trained (no DoRA, LoRA bias or module
    copies, no ``ref`` adapter). Its output is then exactly its base model's, the
    KL reference of a fresh adapter. False for anything else."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs or "ref" in configs:
        return False
    for config in configs.values():
        if str(getattr(config, "peft_type", "")).rsplit(".", 1)[-1] != "LORA":
            return False
        if getattr(config, "use_dora", False) or getattr(config, "lora_bias", False) or config.modules_to_save:
            return False
    import torch

    tensors = [p.detach() for name, p in model.named_parameters() if "lora_B" in name or "lora_embedding_B" in name]
    if not tensors:
        return False
    return not bool(torch.stack([t.ne(0).any() for t in tensors]).any())  # (one device sync, not one per matrix)


def trainer_class() -> type:
    """TRL's ``GRPOTrainer`` whose log-probability passes (the KL reference's, the
    policy's) go through ``shared_prefix_logps`` where it applies."""
    from trl import GRPOTrainer

    class SharedPrefixGRPOTrainer(GRPOTrainer):
        shared_prefix_update = True  # False: every pass is TRL's own
        shared_prefix_chunks = (0, 0)  # (chunks scored with a shared prefix, chunks scored whole), read by tests
        _sampled: dict[tuple[int, ...], list[int]] = {}  # completion ids -> env_mask of the last generation
        skip_identity_reference = True  # False: TRL's reference pass runs even while the adapter adds nothing
        reference_passes_skipped = 0  # generations scored without TRL's reference pass, read by tests
        _reference_slot: dict[str, Any] | None = None  # a micro-batch whose reference is the policy's own

        def _policy_is_reference(self) -> bool:
            return (
                self.beta != 0.0
                and self.ref_model is None
                and adapter_is_identity(self.accelerator.unwrap_model(self.model))
            )

        def _generate_and_score_completions(self, inputs):
            if not (self.skip_identity_reference and self.model.training and self._policy_is_reference()):
                return super()._generate_and_score_completions(inputs)
            beta, self.beta = self.beta, 0.0  # (TRL reads beta once there: only to run its reference pass)
            try:
                output = super()._generate_and_score_completions(inputs)
            finally:
                self.beta = beta
            self.reference_passes_skipped += 1
            return output

        def _compute_loss(self, model, inputs):
            if self.beta == 0.0 or "ref_per_token_logps" in inputs:
                return super()._compute_loss(model, inputs)
            if not self._policy_is_reference():  # (an optimizer step came between this batch's scoring and now)
                inputs["ref_per_token_logps"] = self.reference_logps(inputs)
                return super()._compute_loss(model, inputs)
            self._reference_slot = inputs  # filled by the policy's pass below, before TRL reads it
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._reference_slot = None

        def reference_logps(self, inputs):
            """The reference's log-probabilities of one micro-batch, as TRL's reference pass
            computes them (the base model: the adapter disabled)."""
            import torch
            from trl.trainer.utils import use_adapter

            input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            with torch.no_grad(), use_adapter(self.accelerator.unwrap_model(self.model), adapter_name=None):
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, inputs["completion_ids"].size(1)
                )
            return logps

        def _generate(self, prompts):
            result = super()._generate(prompts)
            if self.model.training:  # (an evaluation's generation must not replace the table a buffer is scored by)
                self._sampled = sampled_positions(result[1], result[2])  # (completion ids, env_mask)
            return result

        def _prepare_inputs(self, generation_batch):
            before = self._buffered_inputs
            inputs = super()._prepare_inputs(generation_batch)
            if (
                self.shared_prefix_update
                and self._buffered_inputs is not before
                and self.args.steps_per_generation == self.args.gradient_accumulation_steps
            ):
                # TRL has just shuffled a new generation into micro-batches that accumulate into one step
                self._buffered_inputs = group_rows(self._buffered_inputs)
                inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
            return inputs

        def _scored(self, input_ids, attention_mask, logits_to_keep):
            return scored_positions(self._sampled, input_ids, attention_mask, logits_to_keep)

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            result = self._scored_logps_and_entropies(model, input_ids, *args, **kwargs)
            slot, self._reference_slot = self._reference_slot, None
            if slot is not None:  # the policy's pass of a micro-batch whose reference it is
                slot["ref_per_token_logps"] = result[0].detach()
            return result

        def _scored_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **extra,
        ):
            if self.shared_prefix_update and not compute_aux_loss and all(v is None for v in extra.values()):
                size = batch_size or input_ids.size(0)
                parts = []
                for at in range(0, input_ids.size(0), size):
                    chunk_ids, chunk_mask = input_ids[at : at + size], attention_mask[at : at + size]
                    with self.accelerator.autocast():
                        logps, entropy, used = chunk_logps(
                            model,
                            chunk_ids,
                            chunk_mask,
                            logits_to_keep,
                            scored=self._scored(chunk_ids, chunk_mask, logits_to_keep),
                            whole=lambda *args: super(SharedPrefixGRPOTrainer, self)._get_per_token_logps_and_entropies(
                                *args, compute_entropy=compute_entropy
                            )[:2],
                            temperature=self.temperature,
                            compute_entropy=compute_entropy,
                            entropy_grad=getattr(self, "_entropy_bonus_enabled", False),
                        )
                    shared, whole = self.shared_prefix_chunks
                    self.shared_prefix_chunks = (shared + used, whole + (not used))
                    parts.append((logps, entropy))
                import torch

                logps = torch.cat([p[0] for p in parts], dim=0)
                entropies = torch.cat([p[1] for p in parts], dim=0) if compute_entropy else None
                return logps, entropies, None
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **extra,
            )

    return SharedPrefixGRPOTrainer
