"""`posbench check --policy NAME`: the conformance report of an eval-time RoPE policy, a plug-in's
above all. Each property reads a small RoPE model (posbench.conformance.build: 2 layers, d_model 32,
2 heads of 16, random weights of seed 0 with the attention projections scaled up so that
positions matter, training length 16) on the same random tokens at lengths
8, 16, ..., 256 (1/2x to 16x), and answers pass, warn or fail:

- settings: the policy is built with the settings given (`--param KEY=VALUE`), and for each
  declared range a value outside it is refused in one line;
- finite: finite outputs at every length (a hook's exception or non-finite frequencies: fail, with
  the line `extrapolate` would write in the row's reason);
- inside the training length: at 8 and 16 the unscaled model's outputs (pass), or not (warn:
  "changes the model inside its training length", as static PI does);
- no jump: the largest change of mean loss between consecutive lengths at most that of the
  unscaled model plus 0.05 nats;
- adapters: the same logits of one layer through the trained-run adapter (the rope scheme) and the
  pretrained-model adapter (posbench.pretrained's rotary swap and attention functions), at every
  length.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from posbench.conformance import ATOL, T, VOCAB, Finding, build
from posbench.errors import PosbenchError
from posbench.policies.registry import Policy, coerce, get_policy

LENGTHS = (8, 16, 32, 64, 128, 256)
PAIRS = 8  # rotary pairs of a head of the check's model (head dim 16)
SHARPEN = 8.0  # the random model's q, k and v projections scaled up (`sharpened`)
JUMP_TOLERANCE = 0.05  # nats beyond the unscaled model's largest step between lengths
PROPERTIES = ("settings", "finite", "inside training length", "no jump", "adapters")


def check_policy(name: str, settings: dict[str, Any] | None = None) -> list[Finding]:
    """The findings of policy `name` built with `settings` (strings as the command line gives them)."""
    cls = get_policy(name)
    given = dict(settings or {})
    factor = float(given.pop("factor", 0.0) or 0.0)
    unknown = [k for k in given if k not in cls.defaults]
    if unknown:
        raise PosbenchError(f"policy {name} has no setting {unknown[0]!r}"
                            + (f"; its settings are {', '.join(cls.defaults)}" if cls.defaults else ""))
    policy = cls(factor, **{k: coerce(cls, k, v) for k, v in given.items()})
    try:
        policy.check(PAIRS, T)
    except PosbenchError as e:
        raise PosbenchError(f"{e}: the check's model has {PAIRS} rotary pairs a head, trained at {T}; give the "
                            "policy's settings with --param KEY=VALUE") from None
    found = [settings_refused(cls)]
    read = readings(policy)
    unscaled = readings(get_policy("none")())
    found.append(finite(read))
    if any(r["error"] for r in read.values()):
        return found + [Finding(p, "skip", "not finite at every length") for p in PROPERTIES[2:]]
    found += [inside(read, unscaled), jumps(read, unscaled), adapters(policy)]
    return found


def settings_refused(cls: type[Policy]) -> Finding:
    """For every declared range, a value outside it is refused with one line."""
    ranged = [k for k in cls.defaults if k in cls.ranges]
    if not cls.defaults:
        return Finding("settings", "pass", "no settings")
    if not ranged:
        return Finding("settings", "warn", f"{', '.join(cls.defaults)} declare no ranges: any value is taken")
    taken = []
    for key in ranged:
        bad = next((v for v in (-1e6, -1.0, 0.0, 0.5, 1.5, 1e6) if not cls.ranges[key].holds(v)), None)
        if bad is None:
            continue
        try:
            cls(**{key: (bad,) if isinstance(cls.defaults[key], tuple) else type_like(cls.defaults[key], bad)})
        except PosbenchError:
            continue
        taken.append(f"{key}={bad:g}")
    if taken:
        return Finding("settings", "fail", f"values outside their ranges are taken: {', '.join(taken)}")
    return Finding("settings", "pass", f"{', '.join(ranged)}: values outside their ranges refused")


def type_like(default: Any, value: float) -> Any:
    return int(value) if isinstance(default, int) and not isinstance(default, bool) and value.is_integer() else value


def readings(policy: Policy) -> dict[int, dict]:
    """At every length: the model's logits (1, n, V) and mean loss on the same tokens, or the
    error line a row would carry."""
    from posbench.sweep import failure

    model = sharpened(build("rope"))
    tokens = torch.randint(0, VOCAB, (1, max(LENGTHS) + 1), generator=torch.Generator().manual_seed(1))
    out = {}
    for n in LENGTHS:
        try:
            model.layout.set_scaling(policy)
            with torch.no_grad():
                logits = model(tokens[:, :n])
        except Exception as e:
            reason = failure(e, n)
            if reason is None:
                raise
            out[n] = {"error": reason}
            continue
        if not bool(torch.isfinite(logits).all()):
            out[n] = {"error": f"at {n} positions: non-finite outputs"}
            continue
        loss = F.cross_entropy(logits[0].float(), tokens[0, 1: n + 1]).item()
        out[n] = {"error": "", "logits": logits, "loss": loss}
    return out


def sharpened(model):
    """The model with its query, key and value projections times SHARPEN: at initialization its
    attention is near uniform, so positions barely change its outputs; sharpened, they do."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(SHARPEN)
    return model


def finite(read: dict[int, dict]) -> Finding:
    bad = [r["error"] for r in read.values() if r["error"]]
    if bad:
        return Finding("finite", "fail", f"{len(bad)} of {len(read)} lengths: {bad[0]}")
    return Finding("finite", "pass", f"finite at {', '.join(map(str, read))} positions")


def inside(read: dict[int, dict], unscaled: dict[int, dict]) -> Finding:
    gaps = {n: float((read[n]["logits"] - unscaled[n]["logits"]).abs().max()) for n in read if n <= T}
    changed = {n: g for n, g in gaps.items() if not g <= ATOL}
    if changed:
        n = max(changed)
        return Finding("inside training length", "warn", f"changes the model inside its training length (at {n} "
                                                          f"positions, logits apart by up to {changed[n]:.1e})")
    return Finding("inside training length", "pass", f"the unscaled model's outputs at {', '.join(map(str, gaps))}")


def jumps(read: dict[int, dict], unscaled: dict[int, dict]) -> Finding:
    def largest(r):
        steps = [(abs(r[b]["loss"] - r[a]["loss"]), a, b) for a, b in zip(LENGTHS, LENGTHS[1:])]
        return max(steps)

    (step, a, b), (base, _, _) = largest(read), largest(unscaled)
    said = f"largest step {step:.3f} nats ({a} -> {b}), unscaled {base:.3f}"
    if step > base + JUMP_TOLERANCE or not math.isfinite(step):
        return Finding("no jump", "fail", said)
    return Finding("no jump", "pass", said)


def adapters(policy: Policy) -> Finding:
    """One layer's logits (1, H, n, n), causal part, through the rope scheme (trained runs) and
    through posbench.pretrained's Rotary and attention functions (pretrained models)."""
    try:
        from posbench.pretrained.rotary import Rotary
    except ImportError as e:  # the pretrained extra is not installed
        return Finding("adapters", "skip", f"no pretrained adapter here: {e}")
    from posbench.policies.two_maps import two_map_scores

    scheme = build("rope").layout.schemes[0]
    dim, base = scheme.rotary_dim, scheme.p["base"]
    worst = 0.0
    for n in LENGTHS:
        torch.manual_seed(n)
        q, k = torch.randn(1, scheme.n_heads, n, dim), torch.randn(1, scheme.n_heads, n, dim)
        pos = torch.arange(n)
        scheme.set_scaling(policy)
        ctx = scheme.prepare(pos)
        if policy.explicit:
            trained = scheme.logits(q, k, pos, ctx, 0)
        else:
            qr, kr = scheme.rotate(q, k, pos, ctx, 0)
            trained = qr @ kr.transpose(-1, -2) * scheme.qk_scale
        rotary = Rotary(dim, base, T)
        rotary.scaling, rotary.length = policy, n
        cos, sin = rotary(q, pos[None])
        if policy.merges_maps:
            ready = policy.ready(dim // 2, n, T)
            other = two_map_scores(q, k, pos, pos, rotary.inv, ready, ready.neighbour_window(T)) * scheme.qk_scale
        else:
            qr, kr = (x * cos + half_turn(x) * sin for x in (q, k))  # transformers' apply_rotary_pos_emb
            if policy.masks_heads:
                qr, kr = policy.heads(qr, kr, 0)
            other = qr @ kr.transpose(-1, -2) * scheme.qk_scale
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        worst = max(worst, float((trained - other)[..., causal].abs().max()))
    status = "pass" if worst <= 1e-4 else "fail"
    return Finding("adapters", status, f"trained-run and pretrained adapters' logits apart by {worst:.1e} at most")


def half_turn(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the head."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
