"""The adapter: a loaded model as posbench reads it (`Pretrained`: a Scorer for perplexity, greedy
decoding for prompts, the columns that name it in rows, the memory a window takes), with the
policies of an evaluation set on it and the forwards they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from posbench import results
from posbench.config import EvalConfig
from posbench.data import load_corpus
from posbench.errors import PosbenchError
from posbench.extension import columns as extension_columns
from posbench.readers import ATTN_BYTES
from posbench.sweep import Variant
from posbench.policies import Policy, from_eval, specs
from posbench.policies.hf import OWN, own_rope_scaling
from posbench.policies.scaling import note
from posbench.pretrained.attention import DOPE_ATTENTION, TWO_MAP_ATTENTION
from posbench.pretrained.rotary import Rotary


LOGIT_CHUNK = 1024  # positions whose vocabulary logits are formed at once


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
    eval_cfg: EvalConfig | None = None  # the policies it is read under (`variants`)
    _variants: tuple[EvalConfig, list] | None = field(default=None, repr=False)
    draws = 1  # a pretrained model reads each window at positions 0..L-1
    extension = "none"  # it has no learned position table

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

    # ---- as the sweep reads it (posbench.sweep.Reader) ----------------------------------------------

    @property
    def columns(self) -> dict:
        """The columns that name it in every row."""
        return {"run_id": self.run_id, "scheme": self.name, "params": str(self.path), "seed": 0,
                "train_len": self.train_len, **extension_columns(None), "position_draws": 0,
                **results.provenance(self.device.type, self.dtype)}

    def variants(self) -> list[Variant]:
        """The policies of `eval_cfg`, each checked on the model once."""
        if self._variants is None or self._variants[0] is not self.eval_cfg:
            self._variants = (self.eval_cfg, [Variant(s) for s in policies(self, self.eval_cfg)])
        return self._variants[1]

    def set(self, variant: Variant) -> None:
        self.set_scaling(variant.scaling)

    def cell(self, variant: Variant, length: int) -> dict:
        return {"scaling": variant.scaling_label, "extension": "none", "backend": self.backend,
                **variant.scaling.provenance()}

    def distinct(self, scaling: Policy, length: int) -> tuple:
        return distinct(self, scaling, length)

    def scorer(self, length: int, draw: int = 0, batch_tokens: int = 0) -> "Pretrained":
        return self

    def rotary_pairs(self) -> tuple[int, int]:
        return self.rotary.dim // 2, self.train_len

    def answers(self, prompts: list, length: int, draw: int = 0):
        """Per text prompt, its verdicts on what the model decodes greedily after it."""
        for p in prompts:
            made = self.greedy(p.tokens, p.steps, p.to_end)
            yield p.check(self.tokenizer.decode(made, skip_special_tokens=p.skip_special))

    def set_scaling(self, scaling: Policy) -> None:
        try:
            scaling.check(self.rotary.dim // 2, self.train_len)  # longrope's count, DPE's scales
        except PosbenchError as e:
            raise PosbenchError(f"{self.name}: {e}") from None
        self.rotary.scaling = scaling
        attention = (DOPE_ATTENTION if scaling.masks_heads else TWO_MAP_ATTENTION if scaling.merges_maps
                     else "sdpa")
        self.model.set_attn_implementation(attention)

    @property
    def backend(self) -> str:
        return "explicit" if self.rotary.scaling.merges_maps else "sdpa"

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
        two_maps, heads = self.rotary.scaling.merges_maps, self.rotary.scaling.masks_heads
        attention = 4 * kv + ATTN_BYTES if two_maps else 6 * keys if heads else 2 * keys * size // 4
        cache = c.num_hidden_layers * kv * (2 * size // 4 + 3 * two_maps) if decoding else 0
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


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def memory_line(m: Pretrained, scalings: list[Policy], length: int, decoding: bool = False) -> str:
    """What the longest window (`decoding`: prompt, decoded greedily) takes, said before any runs."""
    worst = max(scalings, key=lambda s: 2 if s.merges_maps else s.masks_heads)
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


def distinct(m: Pretrained, scaling: Policy, length: int) -> tuple:
    """What the forward of a window depends on under `scaling`: policies that give the same
    frequencies and attention factor at this length (every rescaling at s = 1) score alike; the
    policies that form their own attention (two maps, dope) never share."""
    if scaling.explicit:
        return (scaling, length)
    saved, m.rotary.scaling, m.rotary.length = m.rotary.scaling, scaling, length
    inv, mscale = m.rotary.frequencies()
    m.rotary.scaling = saved
    return (inv.numpy().tobytes(), mscale, length)


def own(m: Pretrained) -> Policy:
    """The policy `config`: the model's own rope_scaling, from its folder's config.json."""
    policy, notes = own_rope_scaling(m.spec, m.path)
    for line in notes:
        note(line)
    return policy


def policies(m: Pretrained, eval_cfg: EvalConfig) -> list[Policy]:
    """The distinct policies of `eval_cfg`, each set once on the model so that a bad longrope
    count fails before any prompt."""
    scalings = list(dict.fromkeys(own(m) if k.strip() == OWN else from_eval(k, eval_cfg) for k in specs(eval_cfg)))
    for s in scalings:
        m.set_scaling(s)
    return scalings
