"""The scheme interface: a positional encoding is a small module that overrides only the hooks it
needs. The model calls them; it knows nothing about any particular scheme.

Hooks (posbench/docs/model.md), with shapes. B batch, T window length, H heads, D head dim,
d model width. `pos` is a (T,) long tensor of explicit positions shared by the batch.

- input   ``embed(x, idx, pos) -> x``          x (B, T, d), idx (B, T) token ids
- mixer   ``mix(x) -> x``                      x (B, T, d)
- qk      ``rotate(q, k, pos, ctx, layer) -> q, k``  q, k (B, H, T, D) in; out (B, H, T, D'),
                                               D' = D unless the scheme widens both (tupe,
                                               pope: 2D); v keeps D. `layer` picks the
                                               layer's own parameters (pope's phase offsets,
                                               fope's coefficients)
- bias    ``bias_fn(h, qpos, kpos) -> b``      elementwise on broadcastable long tensors; the same
                                               function serves the materialized (H, T, T) mask and
                                               FlexAttention's score_mod
- logits  ``logits(q, k, pos, ctx, layer) -> s``  the full pre-softmax scores (B, H, T, T)
- content ``content(x, layer) -> z``           what the logits or qk hook reads of the layer's
                                               input x (B, T, d) (PaTH's Householder steps,
                                               Selective RoPE's angles), any tensors; a scheme
                                               with it takes z as a sixth argument:
                                               ``logits(q, k, pos, ctx, layer, z)``,
                                               ``rotate(q, k, pos, ctx, layer, z)``
- values  ``values(attn, pos, ctx, layer) -> o``  a term added to attn @ v, (B, H, T, D)
- vo      ``turn_values(v, pos, ctx, layer) -> v``,  v (B, H, T, D) before attention and the
          ``turn_output(y, pos, ctx, layer) -> y``   head's output y (B, H, T, D) after it, each
                                               linear (accum-rope's value rotation); with a
                                               content hook z comes sixth, as for rotate
- gate    ``gate(x, layer) -> c``              per-token scalars from the layer's input x
                                               (B, T, d): c (B, H, T) float32, added to the
                                               logits as c_i - c_j (the parameters of every layer
                                               belong to the scheme, shared by its layers)
- weights ``weights(scores) -> attn``          replaces softmax: scores (B, H, T, T) float32,
                                               -inf outside the span, to weights (explicit path)
- heads   ``attention_heads() -> m``         the layer attends with m H heads over its H keys
                                               and values: the qk (or logits) hook returns q and k
                                               with m H heads, the m of model head h next to one
                                               another (h m .. h m + m - 1); the model repeats each
                                               value head m times alike, and the output projection
                                               reads the m H outputs side by side, m d -> d
                                               (rope-pp's equal-cache variant). m is fixed when the
                                               scheme is built; without the hook m = 1

``prepare(pos)`` runs once per forward and returns whatever the hooks share across layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from posbench.errors import PosbenchError, did_you_mean
from posbench.ranges import (MAX_INT, MAX_SIZE, Range, above, at_least, below, between, check_number, even,  # noqa: F401
                             frequency_base, non_negative, one_of, positive, size)
from posbench.schemes.tables import position_count

HOOKS = ("input", "mixer", "qk", "bias", "logits", "content", "values", "vo", "gate", "weights", "heads")


class PositionLimitError(PosbenchError):
    """A scheme was asked for a position it has no representation for."""


@dataclass(frozen=True)
class Dims:
    """What a scheme may know of the model it plugs into."""

    d_model: int
    n_heads: int
    n_layers: int
    vocab_size: int
    train_len: int
    max_position: int  # largest position index seen in training, plus one
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def coerce_params(cls: type[Scheme], given: dict[str, Any]) -> dict[str, Any]:
    """Defaults of `cls` overridden by `given`, each value cast to its default's type and checked
    against the range `cls.ranges` declares for it."""
    out = dict(cls.defaults)
    for key, value in given.items():
        if key not in cls.defaults:
            if not cls.defaults:
                raise PosbenchError(f"scheme {cls.name!r} takes no parameters (got {key!r})")
            raise did_you_mean(key, cls.defaults, f"parameter of scheme {cls.name!r}")
        default = cls.defaults[key]
        try:
            if isinstance(default, bool) and isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                value = value.lower() in ("true", "1", "yes")
            out[key] = check_number(type(default)(value), f"parameter {key} of scheme {cls.name!r}")
        except (TypeError, ValueError):
            raise PosbenchError(
                f"parameter {key}={value!r} of scheme {cls.name!r} must be {type(default).__name__}"
            ) from None
        check_range(cls, key, out[key])
    return out


def check_range(cls: type[Scheme], key: str, value: Any) -> None:
    """One line when `value` is outside the range `cls` declares for parameter `key`."""
    allowed = cls.ranges.get(key)
    if allowed is None or allowed.holds(value):
        return
    if allowed.choices and isinstance(value, str):
        raise did_you_mean(value, allowed.choices, f"value for parameter {key} of scheme {cls.name!r}:")
    raise PosbenchError(f"parameter {key} of scheme {cls.name!r} must be {allowed.says}, got {value}")


def identity_params(cls: type[Scheme], params: dict[str, Any]) -> dict[str, Any]:
    """The resolved parameters that name a run (its run_id): all of them, except a parameter of
    `cls.added_params` at its default. A parameter added to a scheme later then leaves the run_id of
    every run trained before it existed unchanged, and those runs keep their results."""
    return {k: v for k, v in params.items() if k not in cls.added_params or v != cls.defaults[k]}


class Scheme(nn.Module):
    """Base class. Subclasses set the class attributes and override the hooks they list."""

    name: ClassVar[str]
    family: ClassVar[str]
    hooks: ClassVar[tuple[str, ...]] = ()
    reference: ClassVar[str] = ""
    extrapolates: ClassVar[str] = "yes"  # yes | no | extension (needs an eval-time policy)
    notes: ClassVar[str] = ""
    # The scheme in one line of plain-text maths, shown by `posbench schemes` and on the catalogue
    # page (posbench/docs/schemes.md). Notation: query i (or m), key j (or n), head dim D.
    formula: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    # The valid values of each parameter (`Range`), checked whenever parameters are resolved.
    ranges: ClassVar[dict[str, Range]] = {}
    relative: ClassVar[bool] = False  # outputs unchanged when every position shifts by a constant
    takes_positions: ClassVar[bool] = True  # integer positions (the randomized modifier applies)
    # Reads positions as numbers, so real ones between integers mean something: the scheme takes
    # `--position-sampling float` (RFS, posbench.positions). A table of learned rows or of distance
    # buckets does not.
    float_positions: ClassVar[bool] = False
    owns_token_embedding: ClassVar[bool] = False  # the input hook builds token embeddings itself
    extensions: ClassVar[tuple[str, ...]] = ()  # eval-time policies past position_limit()
    # Parameters added after the scheme first shipped: see `identity_params`.
    added_params: ClassVar[tuple[str, ...]] = ()
    # Names of the scheme's own parameters that take no weight decay whatever their shape (the
    # optimizer decays every other tensor of 2 or more dimensions): biases stacked per layer and
    # head, which the references keep out of weight decay.
    no_weight_decay: ClassVar[tuple[str, ...]] = ()
    # Raised when a scheme's training numerics change; from 2 on it enters the run_id, so a run
    # of the earlier revision keeps its results and a new one trains beside it.
    revision: ClassVar[int] = 1

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims
        self.p = coerce_params(type(self), dims.params)
        self.n_heads = dims.n_heads
        self.head_dim = dims.head_dim
        self.extension = "none"
        # Every position of the training run is below it (Transformer.reserve_positions); the
        # compiled training forward reads it in place of max(pos) (tables.position_count).
        self.position_bound: int | None = None

    def set_extension(self, name: str) -> None:
        """Choose an eval-time extension policy (`extensions`), or "none"."""
        if name != "none" and name not in self.extensions:
            raise PosbenchError(f"scheme {self.name!r} has no extension {name!r}")
        self.extension = name

    # Scale applied to q.k by the SDPA paths; schemes that rescale content logits override it.
    @property
    def qk_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def position_limit(self) -> int | None:
        """Positions >= this have no representation (None: unbounded)."""
        return None

    def check_positions(self, pos: torch.Tensor) -> None:
        limit = self.position_limit()
        if limit is not None and position_count(pos, self.position_bound) > limit:
            raise PositionLimitError(
                f"{self.name}: position {int(pos.max())} is beyond its table of {limit} positions"
            )

    def prepare(self, pos: torch.Tensor) -> Any:
        return None

    def embed(self, x: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rotate(self, q, k, pos, ctx, layer: int):
        raise NotImplementedError

    def bias_fn(self, h: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def flex_bias_fn(self):
        """`bias_fn` as FlexAttention's score_mod reads it, made once per forward. On CUDA the
        compiled backward of a score_mod takes a learned tensor that the score_mod indexes once
        and computes nothing on before indexing; a scheme whose bias_fn indexes a parameter
        twice, or transforms it first (softplus, a hidden unit's weights), returns here a
        function over tensors computed outside, each indexed once."""
        return self.bias_fn

    def distance_bias(self, dist: torch.Tensor) -> torch.Tensor:
        """Optional, for a bias of the distance alone read from a learned table, b_h(i, j) =
        f_h(pos_i - pos_j) (t5's buckets): f at each distance of `dist` (R,) long, as (H, R). A
        scheme that defines it has FlexAttention's score_mod read a vector of the window's
        distances built from it once per forward (`flex_bias`), not the table: the backward then
        sums each score's gradient into the cell of its distance (2T - 1 cells per head) instead
        of a few shared buckets, and one gather carries those sums to the table. `bias_fn` stays
        the definition (the mask and the explicit path); both must give the same values."""
        raise NotImplementedError

    def flex_bias(self, pos: torch.Tensor):
        """The function of (h, qpos, kpos) that FlexAttention's score_mod adds, made once per
        forward over the window's positions `pos` (T,): `flex_bias_fn()`, or for a scheme with
        `distance_bias` a read of vec[h, qpos - kpos + n - 1], vec (H, 2n - 1) over distances
        -(n - 1)..n - 1, n the positions' count (max(pos) + 1, or the run's bound inside the
        compiled training forward; positions are non-negative) rounded up to a power of two, so
        windows of one length at other offsets reuse the compiled kernel."""
        if type(self).distance_bias is Scheme.distance_bias:
            return self.flex_bias_fn()
        n = 1 << (position_count(pos, self.position_bound) - 1).bit_length()
        dist = torch.arange(-(n - 1), n, device=pos.device)
        # a copy in memory order, never a view: FlexAttention's compiled backward drops the
        # gradient of a captured view
        vec = self.distance_bias(dist).clone(memory_format=torch.contiguous_format)  # (H, 2n - 1)
        offset = n - 1

        def fn(h, qpos, kpos):
            return vec[h, qpos - kpos + offset]

        return fn

    def bias(self, pos: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """The materialized (H, T, T) bias: `bias_fn` on broadcast indices."""
        h = torch.arange(self.n_heads, device=pos.device)[:, None, None]
        return self.bias_fn(h, pos[None, :, None], pos[None, None, :]).float()

    def logits(self, q, k, pos, ctx, layer: int) -> torch.Tensor:
        raise NotImplementedError

    def content(self, x: torch.Tensor, layer: int) -> Any:
        raise NotImplementedError

    def values(self, attn, pos, ctx, layer: int) -> torch.Tensor:
        raise NotImplementedError

    def turn_values(self, v, pos, ctx, layer: int):
        raise NotImplementedError

    def turn_output(self, y, pos, ctx, layer: int):
        raise NotImplementedError

    def gate(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention_heads(self) -> int:
        raise NotImplementedError

    def undecayed(self) -> list[nn.Parameter]:
        """The parameters named in `no_weight_decay`."""
        return [getattr(self, name) for name in self.no_weight_decay]

    def describe(self) -> str:
        """The parameter values, as recorded in result rows."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.p.items()))
