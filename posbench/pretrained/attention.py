"""The attention functions posbench registers with transformers' AttentionInterface: Self-Extend,
ReRoPE and DPE's two logit maps (`two_map_attention`, query block by query block, the fused CPU kernel
for the keys wholly inside or outside the window) and DoPE's noisy heads (`dope_attention`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posbench.readers import ATTN_BYTES
from posbench.policies import Policy
from posbench.policies.rotation import turn_at
from posbench.policies.two_maps import two_map_scores
from posbench.pretrained.rotary import Rotary, Turned


TWO_MAP_ATTENTION = "posbench_two_map"
DOPE_ATTENTION = "posbench_dope"
QUERY_BLOCK = 256  # queries per block of two-map attention: its explicit scores are B x 2B


def turned_keys(rotary: Rotary, layer: int, key: torch.Tensor, value: torch.Tensor, inv: torch.Tensor,
                policy: Policy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys (B, Hkv, Tk, D) at 0..Tk-1 turned for the near map and for the far one, and the values,
    in float32. While decoding, the layer's `Turned` keeps them: a decoded token turns the keys it
    adds; anything else (another prompt, policy or length) turns every key again."""
    kept = rotary.turned.get(layer) if rotary.turned is not None else None
    tk = key.shape[2]
    start = kept.n if kept is not None and kept.holds(value, policy, inv) else 0
    pos = torch.arange(start, tk, device=key.device)
    new_key, new_value = key[:, :, start:].float(), value[:, :, start:].float()
    near, far = turn_at(new_key, pos, inv), policy.far_keys(new_key, pos, inv)
    if rotary.turned is None:
        return near, far, new_value
    if not start:
        size = (*key.shape[:2], max(tk, rotary.capacity), key.shape[3])
        kept = Turned(policy, inv, *(torch.empty(size, device=key.device) for _ in range(3)), 0)
        rotary.turned[layer] = kept
    for store, fresh in ((kept.near, near), (kept.far, far), (kept.value, new_value)):
        store[:, :, start:tk] = fresh
    kept.n = tk
    return kept.near[:, :, :tk], kept.far[:, :, :tk], kept.value[:, :, :tk]


def two_map_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Self-Extend or ReRoPE attention for transformers: query (B, H, Tq, D), key and value
    (B, Hkv, Tk, D) unrotated -> (B, Tq, H, D), causal by position; the keys sit at positions
    0..Tk-1 (a cache holds them unrotated). For a block of queries at a..c-1 (c - a <= W), the keys
    below a - W + 1 are beyond the window of every query (the far map alone) and those from c - W to
    a within it (plain RoPE): both go to the fused CPU kernel, no score matrix formed, the query
    heads of each key-value head read as one (`_grouped`). Only the two strips of keys between,
    where the maps or the causal edge differ by query, are scored explicitly by `two_map_scores`,
    their keys repeated over the query heads. The softmaxes of the parts are merged by their
    log-sum-exps, so time and memory grow with T, not T^2. Without the fused kernel every key is
    scored explicitly. Turned keys are kept between decoded tokens (`turned_keys`)."""
    rotary: Rotary = module.posbench_rotary
    groups = query.shape[1] // key.shape[1]
    qpos = rotary.positions.to(query.device)
    kpos = torch.arange(key.shape[2], device=query.device)
    inv = rotary.inv.to(query.device)
    policy = rotary.scaling.ready(len(inv), rotary.length, rotary.train_len)  # DPE's scales set
    window = policy.neighbour_window(rotary.train_len)
    fused = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None) if query.device.type == "cpu" else None
    b, h, tq, _ = query.shape
    # A block's explicit scores: B queries over 2B keys with the kernel, over every key without it
    block = min(window, QUERY_BLOCK, max(1, ATTN_BYTES // (4 * b * h * (2 * window if fused else key.shape[2]))))
    if fused is not None:  # every key turned once for each map
        near_k, far_k, value = turned_keys(rotary, module.layer_idx, key, value, inv, policy)
    else:
        value = value.float()
    out = torch.empty_like(query)
    for i in range(0, tq, block):
        qp, q = qpos[i: i + block], query[:, :, i: i + block].float()
        a, c = int(qp[0]), int(qp[-1]) + 1
        parts = []  # (output (B, H, Tb, D), log-sum-exp (B, H, Tb, 1)) of each set of keys
        if fused is not None and c - a == len(qp):
            far_end, near_start = max(0, a - window + 1), max(0, c - window)
            if far_end:
                parts.append(_grouped(fused, policy.far_queries(q, qp, inv, window), far_k[:, :, :far_end],
                                      value[:, :, :far_end], scaling))
            if a + 1 > near_start:
                parts.append(_grouped(fused, turn_at(q, qp, inv), near_k[:, :, near_start: a + 1],
                                      value[:, :, near_start: a + 1], scaling))
            explicit = torch.cat([kpos[far_end:near_start], kpos[a + 1: c]])
        else:
            explicit = kpos[:c]
        if len(explicit):
            strip_k, strip_v = (x[:, :, explicit].float().repeat_interleave(groups, 1) for x in (key, value))
            scores = two_map_scores(q, strip_k, qp, explicit, inv, policy, window) * scaling
            scores = scores.masked_fill(explicit[None, :] > qp[:, None], -math.inf)  # (B, H, Tb, K)
            lse = scores.logsumexp(-1, keepdim=True)
            parts.append(((scores - lse).exp().nan_to_num() @ strip_v, lse))
        total = torch.logsumexp(torch.stack([lse for _, lse in parts]), 0)
        out[:, :, i: i + block] = sum(o * (lse - total).exp() for o, lse in parts).to(out.dtype)
    return out.transpose(1, 2).contiguous(), None


def dope_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """DoPE attention for transformers: query (B, H, Tq, D), key and value (B, Hkv, Tk, D) after
    RoPE -> (B, Tq, H, D), the noisy heads' q and k replaced by Gaussian noise
    (posbench.schemes.dope.dope_qk, the keys repeated over the query heads), causal by position (the
    keys sit at 0..Tk-1). In decoding each step flags the heads over the keys cached so far."""
    rotary: Rotary = module.posbench_rotary
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1).float(), value.repeat_interleave(groups, 1).float()
    q, k = rotary.scaling.heads(query.float(), key, module.layer_idx)
    if q.shape[2] == k.shape[2]:
        out = F.scaled_dot_product_attention(q, k, value, is_causal=True, scale=scaling)
    else:
        visible = torch.arange(k.shape[2], device=q.device)[None, :] <= rotary.positions.to(q.device)[:, None]
        out = F.scaled_dot_product_attention(q, k, value, attn_mask=visible, scale=scaling)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _fused(kernel, q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over every key k, v by the fused CPU kernel: output and log-sum-exp (..., 1)."""
    out, lse = kernel(q, k, v, 0.0, False, scale=scale)[:2]
    return out, lse[..., None]


def _grouped(kernel, q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fused` of q (B, H, Tb, D) over k, v (B, Hkv, Tk, D), query head h reading key head
    h // G (G = H / Hkv) as transformers' repeat_kv pairs them, without repeating the keys: one
    call for the heads g, G + g, 2G + g, ... of each g, so that every head's rows go to the kernel as
    with repeated keys (its sums, bit for bit, depend on how many rows a head holds)."""
    groups = q.shape[1] // k.shape[1]
    out, lse = torch.empty_like(q), q.new_empty(*q.shape[:3], 1)
    for g in range(groups):
        out[:, g::groups], lse[:, g::groups] = _fused(kernel, q[:, g::groups], k, v, scale)
    return out, lse


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    for name, function in ((TWO_MAP_ATTENTION, two_map_attention), (DOPE_ATTENTION, dope_attention)):
        AttentionInterface.register(name, function)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, lambda *args, **kwargs: None)  # causal by position
