"""The scheme catalogue shown by `posbench schemes`: each row read off the scheme class and an
instance on a reference model (so learned-parameter counts are real, not typed in)."""

from __future__ import annotations

from posbench.schemes import SCHEMES, Dims

REFERENCE_DIMS = Dims(d_model=128, n_heads=4, n_layers=4, vocab_size=2048, train_len=64, max_position=64)


def catalogue() -> list[dict[str, str]]:
    rows = []
    for name, cls in SCHEMES.items():
        scheme = cls(REFERENCE_DIMS)
        n = sum(p.numel() for p in scheme.parameters())
        rows.append({
            "name": name,
            "family": cls.family,
            "hooks": "+".join(cls.hooks) or "-",
            "learned_params": f"{n:,}" if n else "none",
            "extrapolates": cls.extrapolates,
            "parameters": scheme.describe() or "-",
            "reference": cls.reference,
            "notes": cls.notes,
        })
    return rows
