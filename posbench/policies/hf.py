"""A policy as transformers spells it in a model's config.json, `rope_scaling = {"rope_type": "yarn",
"factor": 4.0, "beta_fast": 32, ...}` (`--rope-scaling-json`, [eval] rope_scaling_json, and the
policy `config` of `--model hf:FOLDER`, the folder's own): mapped to the registered policy that
declares that rope_type (`hf_types`), its fields to the policy's settings (`hf_fields`); a field
with no counterpart is said in one line and left out. Imports no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posbench.errors import PosbenchError
from posbench.policies.registry import POLICIES, Policy, coerce

OWN = "config"  # the policy spec that names a pretrained model's own rope_scaling


def from_rope_scaling(config: dict[str, Any] | str, where: str = "rope_scaling",
                      known: tuple[str, ...] = ("rope_theta",)) -> tuple[Policy, list[str]]:
    """The policy of transformers' rope_scaling `config` (a dict or its JSON) and a line for each
    field that has no counterpart in it (but those `known` elsewhere: the base, a model's context)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise PosbenchError(f"{where}: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(config, dict):
        raise PosbenchError(f"{where}: a JSON object such as {{\"rope_type\": \"yarn\", \"factor\": 4.0}}, got {config!r}")
    kind = config.get("rope_type", config.get("type"))
    if not isinstance(kind, str):
        raise PosbenchError(f"{where}: no rope_type (transformers' name of the policy, e.g. \"yarn\")")
    cls = next((c for c in POLICIES.values() if kind in c.hf_types), None)
    if cls is None:
        known = sorted(t for c in POLICIES.values() for t in c.hf_types)
        raise PosbenchError(f"{where}: rope_type {kind!r} has no posbench policy; those with one: {', '.join(known)}")
    settings, factor, notes = {}, 0.0, []
    for key, value in config.items():
        if key in ("rope_type", "type"):
            continue
        if key == "factor" and cls.interpolates:
            factor = float(value)
        elif key in cls.hf_fields:
            settings[cls.hf_fields[key]] = coerce(cls, cls.hf_fields[key], value)
        elif key not in known:
            notes.append(f"{where}: {key} has no counterpart in posbench's {cls.name}; left out")
    if factor and not factor >= 1:
        raise PosbenchError(f"{where}: factor must be >= 1, got {factor:g}")
    return cls(factor, **settings), notes


def own_rope_scaling(spec: str, path: Path) -> tuple[Policy, list[str]]:
    """The policy `config` of a pretrained model: the rope_scaling of its folder's config.json (a
    GGUF file has none), `none` when it declares none."""
    if not spec.startswith("hf:"):
        raise PosbenchError(f"the policy {OWN} reads a Hugging Face folder's config.json (--model hf:FOLDER); "
                            f"{spec} has none")
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    scaling = raw.get("rope_scaling")
    if scaling is None and isinstance(raw.get("rope_parameters"), dict):  # transformers 5's spelling
        scaling = {k: v for k, v in raw["rope_parameters"].items() if k != "rope_theta"}
    if not scaling:
        return POLICIES["none"](), [f"{path / 'config.json'} declares no rope_scaling: {OWN} reads it as none"]
    # the base and the training length are the model's (posbench.pretrained.loading reads both)
    return from_rope_scaling(scaling, f"{path / 'config.json'} rope_scaling",
                             ("rope_theta", "original_max_position_embeddings"))
