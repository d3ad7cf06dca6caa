"""Shared-prefix ("cascade") attention for ``LocalHF``.

Every episode of a τ² batch starts with the same ~5k-token system turn (policy +
tool schemas), and each episode adds only a few hundred tokens of its own per turn.
Plain attention reads the whole cache once per row per step, so a batch of B
episodes reads the shared prefix B times, and at this context length that, not the
weights, is what a decode step costs on a CPU. Here the queries of all rows attend
to the shared prefix in one matrix product (the prefix's keys and values are read
once per batch; once per group where rows have different prefixes), the rows' own
tokens in one batched product, and the parts are joined under one running maximum
and one normaliser, so the result is exact attention over prefix + own tokens. On
CPU (inference, float32 or bfloat16) each part runs in PyTorch's fused attention
kernel, which returns the parts' log-sum-exps to join them by; elsewhere, in
plain matrix products.

The model's own attention layers call ``shared_prefix_attention`` through
transformers' ``AttentionInterface`` while ``use_shared_prefix`` is active; the
prefixes are passed to the forward as the ``shared_prefix`` keyword (groups of rows,
each with its prefix: one (keys, values) pair per layer, each ``[1, kv_heads,
prefix_len, head_dim]``; a batch may mix adapters, whose prefixes differ), and the
mask, built by the caller, covers the rows' own tokens only (a prefix is visible to
every query of its rows). Without ``shared_prefix`` the function is transformers' SDPA.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

NAME = "trace_gym_shared_prefix"
# Model types whose attention layers dispatch through AttentionInterface with grouped key heads, and whose
# logits are the output layer applied to the decoder's last hidden state (no soft-capping, no logit scale).
PLAIN_DECODERS = frozenset({"llama", "qwen2", "qwen3", "mistral"})
_registered = False
CPU_KERNEL = True  # False: the matrix-product path on CPU too (the tests compare both)
_switch_lock = threading.Lock()
_switched: dict[int, list] = {}  # id(config) -> [blocks inside, the setting to restore]
_kernel_masks = threading.local()  # .last: the kernel mask of this thread's latest forward (``_kernel_mask``)


def shared_prefix_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prefix: Any = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention of ``query`` [B, H, Q, D] over a shared prefix + each row's own
    ``key``/``value`` [B, KVH, S, D]; ``attention_mask`` [B, 1, Q, S] (bool, True =
    visible) covers the own tokens. ``shared_prefix`` is a list of groups
    ``(prefix layers or None, row indices or None for every row)``: the rows of a
    group share that prefix (None: the rows hold all their tokens themselves).
    Returns [B, Q, H, D], as transformers expects."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layer = module.layer_idx
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    groups = [(prefix[layer] if prefix is not None else None, rows) for prefix, rows in shared_prefix]
    return _attend(query, key, value, attention_mask, groups, scale).transpose(1, 2).contiguous(), None


def _attend(query: Any, key: Any, value: Any, attention_mask: Any, groups: list[tuple[Any, Any]], scale: float) -> Any:
    """[B, H, Q, D]: attention of each row over its group's prefix and its own
    ``key``/``value`` under ``attention_mask``, exact (one softmax over both). On
    CPU, with gradients off (``LocalHF`` runs under inference mode), in float32 or bfloat16: PyTorch's fused CPU attention
    per part, joined by the parts' log-sum-exps (``_attend_cpu``); elsewhere in
    matrix products (``_attend_matmul``). Never under autocast: accelerate runs a
    bf16 model's forward under it, which would cast the fp32 scores back to bf16."""
    import torch

    with torch.autocast(device_type=query.device.type, enabled=False):
        return _attend_uncast(query, key, value, attention_mask, groups, scale)


def _attend_uncast(
    query: Any, key: Any, value: Any, attention_mask: Any, groups: list[tuple[Any, Any]], scale: float
) -> Any:
    import torch

    if (
        CPU_KERNEL
        and not torch.is_grad_enabled()
        and query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.bfloat16)
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    ):
        return _attend_cpu(query, key, value, attention_mask, groups, scale)
    return _attend_matmul(query, key, value, attention_mask, groups, scale)


def _attend_cpu(
    query: Any, key: Any, value: Any, attention_mask: Any, groups: list[tuple[Any, Any]], scale: float
) -> Any:
    """``_attend`` with PyTorch's fused CPU attention, which returns each query's
    log-sum-exp beside its output: the rows' own tokens in one call, each group's
    prefix in one call for its rows, and each row's two parts joined by their
    log-sum-exps (as flash-decoding joins splits). Scores stay in float32 inside
    the kernel, so bf16 keys and values are never copied to float32 (a copy per
    layer and step that made the matrix-product path several times slower in bf16)."""
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    n = heads // kv_heads * q_len
    q = query.reshape(batch, kv_heads, n, dim)  # the query heads that share one key head, side by side
    mask, seen = (
        _kernel_mask(attention_mask, batch, n, q_len, query.dtype) if attention_mask is not None else (None, None)
    )
    out, lse = flash(q, key.to(query.dtype), value.to(query.dtype), 0.0, False, attn_mask=mask, scale=scale)[:2]
    out, lse = out.float(), lse.float()
    if seen is not None:  # a query that sees none of its own tokens gets 0 from its own part, and no weight in the join
        lse = lse.masked_fill(~seen, float("-inf"))  # (the kernel gives it log-sum-exp 0, as if it had seen weight 1)
        out = out.masked_fill(~seen[..., None], 0.0)
    for prefix, rows in groups:
        if prefix is None or prefix[0].shape[2] == 0:  # (the kernel dies on an empty key sequence)
            continue
        index = slice(None) if rows is None else torch.tensor(rows, device=q.device)
        q_rows = q[index]
        count = q_rows.shape[0]
        part, part_lse = flash(
            q_rows.transpose(0, 1).reshape(1, kv_heads, count * n, dim),
            prefix[0].to(query.dtype),
            prefix[1].to(query.dtype),
            0.0,
            False,
            scale=scale,
        )[:2]
        part = part.float().view(kv_heads, count, n, dim).transpose(0, 1)
        part_lse = part_lse.float().view(kv_heads, count, n).transpose(0, 1)
        own_lse = lse[index]
        top = torch.maximum(own_lse, part_lse)  # (finite: a non-empty prefix is seen by every query)
        own_w, part_w = torch.exp(own_lse - top), torch.exp(part_lse - top)
        out[index] = (out[index] * own_w[..., None] + part * part_w[..., None]) / (own_w + part_w)[..., None]
    return out.reshape(batch, heads, q_len, dim).to(query.dtype)


def _kernel_mask(attention_mask: Any, batch: int, n: int, q_len: int, dtype: Any) -> tuple[Any, Any]:
    """The fused kernel's additive mask [B, 1, G*Q, S] (0 visible, -inf not) for
    ``attention_mask`` and which queries see any own token [B, 1, G*Q]. Every layer
    of a forward is handed the same mask tensor, so this is built in the first layer
    and reused by the rest: inside ``use_shared_prefix``'s block, one entry per
    thread, reused only for the very mask object it was built from and dropped when
    the block ends (the callers build a mask afresh per forward and never change it
    in place)."""
    import torch

    key = (n, q_len, dtype)
    held = getattr(_kernel_masks, "last", None)
    if held is not None and held[0] is attention_mask and held[1] == key:
        return held[2], held[3]
    visible = _grouped_visible(attention_mask, batch, n, q_len)
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    seen = visible.any(dim=-1)  # [B, 1, n]
    if getattr(_kernel_masks, "depth", 0):  # (outside a block nothing would drop it)
        _kernel_masks.last = (attention_mask, key, mask, seen)
    return mask, seen


def _grouped_visible(attention_mask: Any, batch: int, n: int, q_len: int) -> Any:
    """[B, 1, G*Q, S] bool: ``attention_mask`` [B, 1, Q, S] (bool, or additive with
    0 = visible) repeated for the G query heads that share one key head."""
    import torch

    visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    return visible[:, :, None].expand(batch, 1, n // q_len, q_len, visible.shape[-1]).reshape(batch, 1, n, -1)


def _attend_matmul(
    query: Any, key: Any, value: Any, attention_mask: Any, groups: list[tuple[Any, Any]], scale: float
) -> Any:
    """``_attend`` in plain matrix products (any device, differentiable): one softmax over each row's prefix (shared by the rows of its
    group, read once per group) and the row's own ``key``/``value`` under
    ``attention_mask``. The two parts are summed with a common running maximum
    (as flash attention joins blocks), so the rows' own tokens are attended to in
    one product for the whole batch, whatever group each row is in."""
    import torch

    dtype = query.dtype  # scores, softmax and sums in fp32 (as SDPA's kernels accumulate), whatever the model's dtype
    query, key, value = query.float(), key.float(), value.float()
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    n = heads // kv_heads * q_len
    # [B, KVH, G*Q, D]: the query heads that share one key head, side by side
    q = query.reshape(batch, kv_heads, n, dim)
    # each row's own tokens: [B, KVH, G*Q, D] @ [B, KVH, D, S]
    scores = torch.matmul(q, key.transpose(2, 3)).mul_(scale)
    if attention_mask is not None:
        scores = scores.masked_fill(~_grouped_visible(attention_mask, batch, n, q_len), float("-inf"))
    # each group's prefix, once for its rows: [KVH, rows*G*Q, D] @ [KVH, D, P]
    parts = []
    top = scores.amax(dim=-1, keepdim=True).detach()  # (a shift: it carries no gradient)
    for prefix, rows in groups:
        if prefix is None or prefix[0].shape[2] == 0:
            continue
        index = slice(None) if rows is None else torch.tensor(rows, device=q.device)
        q_rows = q[index]
        keys = prefix[0].float()
        part = torch.bmm(q_rows.transpose(0, 1).reshape(kv_heads, -1, dim), keys[0].transpose(1, 2)).mul_(scale)
        part = part.view(kv_heads, q_rows.shape[0], n, keys.shape[2]).transpose(0, 1)
        parts.append((prefix[1][0].float(), index, part))
        top[index] = torch.maximum(top[index], part.amax(dim=-1, keepdim=True).detach())
    top = top.masked_fill(torch.isinf(top), 0.0)  # a query that sees nothing gets 0 (only padding queries do)
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    out = torch.matmul(weights, value)
    for values, index, part in parts:
        part_weights = torch.exp(part - top[index])
        rows_n = part_weights.shape[0]
        part_out = torch.bmm(part_weights.transpose(0, 1).reshape(kv_heads, rows_n * n, -1), values)
        out[index] += part_out.view(kv_heads, rows_n, n, dim).transpose(0, 1)
        total[index] += part_weights.sum(dim=-1, keepdim=True)
    out = out / total.clamp(min=torch.finfo(total.dtype).tiny)
    return out.reshape(batch, heads, q_len, dim).to(dtype)


def register() -> None:
    """Register the attention function, and SDPA's mask builder under the same
    name, so a forward without ``shared_prefix`` made while the switch is on
    (another caller of the same model) gets its padding mask as under SDPA."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, shared_prefix_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True


def supported(config: Any) -> bool:
    """True for model configs whose attention layers dispatch through transformers'
    ``AttentionInterface`` with a ``layer_idx`` and grouped key heads, and no sliding
    window or soft-capping (Llama, SmolLM2, Qwen2/3, Mistral)."""
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False  # (SDPA only: a forward without a shared prefix falls back to SDPA, which must be what it was)
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not heads or not kv_heads or heads % kv_heads:
        return False
    if not full_attention_only(config):
        return False
    if getattr(config, "attn_logit_softcapping", None):
        return False
    return getattr(config, "model_type", "") in PLAIN_DECODERS


def full_attention_only(config: Any) -> bool:
    """True when every layer attends to the whole context (no sliding window), so a
    prefix's keys and values kept in a cache are all a later token attends to."""
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False  # (Qwen2 configs name a window they do not use)
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or [])


@contextlib.contextmanager
def use_shared_prefix(config: Any) -> Iterator[None]:
    """Route a model's attention (its ``config``) through ``shared_prefix_attention``
    for the block. Overlapping blocks on one config (two backends over one model,
    two threads) are counted: the last one out restores the original setting."""
    register()
    with _switch_lock:
        held = _switched.get(id(config))
        if held is None:
            held = _switched[id(config)] = [0, config._attn_implementation]
            config._attn_implementation = NAME
        held[0] += 1
    _kernel_masks.depth = getattr(_kernel_masks, "depth", 0) + 1  # (this thread's blocks: its kernel masks are kept)
    try:
        yield
    finally:
        _kernel_masks.depth -= 1
        if not _kernel_masks.depth:
            _kernel_masks.last = None  # (a prefill's mask can be large; it is not kept past the block)
        with _switch_lock:
            held[0] -= 1
            if held[0] == 0:
                config._attn_implementation = held[1]
                del _switched[id(config)]


def own_mask(rows: int, queries: int, slots: int, first: list[int], last_visible: list[int], device: Any) -> Any:
    """[rows, 1, queries, slots] bool, the cache slots each query sees: query t of
    row i sees slots ``first[i] .. last_visible[i] + t`` (left padding before, the
    future after). With shared-prefix attention the slots hold the rows' own tokens
    (the prefix is visible to every query); without it, every token of the row."""
    import torch

    slot = torch.arange(slots, device=device)
    lo = torch.tensor(first, device=device)[:, None, None]
    hi = torch.tensor(last_visible, device=device)[:, None, None] + torch.arange(queries, device=device)[None, :, None]
    return ((slot[None, None, :] >= lo) & (slot[None, None, :] <= hi))[:, None]
