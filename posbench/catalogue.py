"""The scheme catalogue shown by `posbench schemes`: each row read off the scheme class and an
instance on a reference model (so learned-parameter counts are real, not typed in), then the
layout presets, built on the same reference model."""

from __future__ import annotations

from posbench import layout, plugins
from posbench.schemes import SCHEMES, Dims, get_scheme

REFERENCE_DIMS = Dims(d_model=128, n_heads=4, n_layers=4, vocab_size=2048, train_len=64, max_position=64)


def catalogue() -> list[dict[str, str]]:
    rows = []
    for name, cls in SCHEMES.items():
        scheme = cls(REFERENCE_DIMS)
        rows.append({
            "name": name,
            "family": cls.family,
            "hooks": "+".join(cls.hooks) or "-",
            "learned_params": _count(scheme),
            "extrapolates": cls.extrapolates,
            "parameters": scheme.describe() or "-",
            "reference": cls.reference,
            "notes": cls.notes,
            "source": plugins.describe(cls),
        })
    for name, (spec, reference, notes) in layout.PRESETS.items():
        built = layout.build(name, REFERENCE_DIMS)
        schemes = [get_scheme(lay.scheme) for lay in built.spec.pattern]
        rows.append({
            "name": name,
            "family": "layout",
            "hooks": "+".join(dict.fromkeys(h for cls in schemes for h in cls.hooks)) or "-",
            "learned_params": _count(built),
            "extrapolates": "yes" if all(cls.extrapolates == "yes" for cls in schemes) else "no",
            "parameters": f"{spec} = {built.spec} at train_len {REFERENCE_DIMS.train_len}",
            "reference": reference,
            "notes": notes,
            "source": "built-in",
        })
    return rows


def _count(module) -> str:
    n = sum(p.numel() for p in module.parameters())
    return f"{n:,}" if n else "none"
