"""The update's forward passes with the rows' shared prompt computed once.

TRL scores a micro-batch by running every row whole: prompt and completion. The
rows of a GRPO batch all start with the same system prompt and tool schemas (and
the K rows of one group with the same whole prompt), which is most of each row
on our envs (about 800 of 960 tokens on tool-precision), so most of the update's
forward and backward work is the same prefix, repeated per row.

``shared_prefix_logps`` runs the longest prefix the rows share once (batch 1,
with gradients), then runs each row's remaining tokens on top of it through the
model's own attention and key/value cache, the prefix's keys and values
broadcast to the rows. The backward pass flows into the prefix once, summed
over the rows, which is exactly the gradient of the rows run whole. The
completion tokens' log-probabilities are the same as TRL's (up to float
rounding); the tests compare both passes and the LoRA gradients.

Differences, by design: LoRA dropout, if any, draws one mask for the shared
prefix instead of one per row; positions count from each row's first real token
(TRL's count from the padded column, which rotary embeddings do not see).

``shared_prefix_logps`` returns None where it does not apply (no prefix worth
sharing, gradient checkpointing, which disables the cache, a sliding-window
model, whose cache keeps only the window); the caller then takes TRL's own
path. Memory: the completion positions' logits are held in full
(rows x completion x vocabulary, in fp32), where TRL's fused head tiles them;
on a large vocabulary with long completions, lower ``micro_batch`` or switch
this off.
"""

from __future__ import annotations

from typing import Any

from trace_gym.llm.shared_prefix import full_attention_only

MIN_SHARED_TOKENS = 16  # below this, running the rows whole costs about the same


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


def shared_prefix_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *, temperature: float,
                        compute_entropy: bool = False, entropy_grad: bool = False,
                        min_shared: int = MIN_SHARED_TOKENS) -> tuple[Any, Any] | None:
    """Per-token log-probabilities [rows, logits_to_keep] of the last
    ``logits_to_keep`` tokens of each row (and their entropies, if asked; with
    gradient if ``entropy_grad``, for an entropy bonus), as TRL's
    ``_get_per_token_logps_and_entropies`` returns them; None when the rows share
    fewer than ``min_shared`` tokens or the model cannot keep a cache."""
    import torch
    from transformers import DynamicCache

    inner = getattr(model, "module", model)  # (under a DDP wrapper, the model it wraps says whether it checkpoints)
    checkpointing = getattr(inner, "is_activation_checkpointing", None)  # (transformers 5's name, then the old one)
    if checkpointing is None:
        checkpointing = getattr(inner, "is_gradient_checkpointing", False)
    if checkpointing and inner.training:
        return None  # checkpointed layers in training mode return no cache (TRL's reference pass turns it off first)
    config = getattr(inner, "config", None)
    if config is None or not full_attention_only(config.get_text_config()):
        return None  # a sliding-window cache keeps only the window of the prefix
    length, first = shared_prefix_len(input_ids, attention_mask, logits_to_keep)
    if length < min_shared:
        return None
    rows, width = input_ids.shape
    device = input_ids.device
    prefix_ids = input_ids[:1, int(first[0]):int(first[0]) + length]
    prefix = model(input_ids=prefix_ids, position_ids=torch.arange(length, device=device)[None, :], use_cache=True,
                   logits_to_keep=1)
    layers = [(layer.keys, layer.values) for layer in prefix.past_key_values.layers]
    del prefix

    # each row's own tokens, aligned on the original columns: from the earliest row start after the prefix to the end
    lo = int(first.min()) + length
    columns = torch.arange(lo, width, device=device)
    own = attention_mask[:, lo:].bool() & (columns[None, :] >= (first + length)[:, None])
    cache = DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in layers])
    keys_mask = torch.cat([torch.ones(rows, length, dtype=torch.long, device=device), own.long()], dim=1)
    positions = (columns[None, :] - first[:, None]).clamp(min=0)
    output = model(input_ids=input_ids[:, lo:], attention_mask=keys_mask, position_ids=positions,
                   past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep + 1)
    logits = output.logits[:, :-1].float() / temperature
    del output, cache
    log_probs = torch.log_softmax(logits, dim=-1)
    padded = ~attention_mask[:, width - logits_to_keep:].bool()  # 0 there, as TRL's pass gives
    token_logps = log_probs.gather(-1, input_ids[:, width - logits_to_keep:, None]).squeeze(-1).masked_fill(padded, 0.0)
    entropy = None
    if compute_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(dim=-1).masked_fill(padded, 0.0)
    return token_logps, entropy


def trainer_class() -> type:
    """TRL's ``GRPOTrainer`` whose log-probability passes (the KL reference's, the
    policy's) go through ``shared_prefix_logps`` where it applies."""
    from trl import GRPOTrainer

    class SharedPrefixGRPOTrainer(GRPOTrainer):
        shared_prefix_update = True  # False: every pass is TRL's own
        shared_prefix_chunks = (0, 0)  # (chunks scored with a shared prefix, chunks scored whole), read by tests

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                               compute_entropy=False, compute_aux_loss=False, **extra):
            if self.shared_prefix_update and not compute_aux_loss and all(v is None for v in extra.values()):
                size = batch_size or input_ids.size(0)
                parts = []
                for at in range(0, input_ids.size(0), size):
                    with self.accelerator.autocast():
                        part = shared_prefix_logps(model, input_ids[at:at + size], attention_mask[at:at + size],
                                                   logits_to_keep, temperature=self.temperature,
                                                   compute_entropy=compute_entropy,
                                                   entropy_grad=getattr(self, "_entropy_bonus_enabled", False))
                    shared, whole = self.shared_prefix_chunks
                    if part is None:
                        part = super()._get_per_token_logps_and_entropies(
                            model, input_ids[at:at + size], attention_mask[at:at + size], logits_to_keep,
                            compute_entropy=compute_entropy)[:2]
                        whole += 1
                    else:
                        shared += 1
                    self.shared_prefix_chunks = (shared, whole)
                    parts.append(part)
                import torch

                logps = torch.cat([p[0] for p in parts], dim=0)
                entropies = torch.cat([p[1] for p in parts], dim=0) if compute_entropy else None
                return logps, entropies, None
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size=batch_size, compute_entropy=compute_entropy,
                                                              compute_aux_loss=compute_aux_loss, **extra)

    return SharedPrefixGRPOTrainer
