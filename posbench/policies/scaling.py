"""Policies by name, as the evaluation's settings give them: `RopeScaling(kind, factor, **settings)`
(settings the policy does not take are left out, so that one set of [eval] settings serves every
policy), `from_eval` (a policy spec of `--rope-scaling` with the [eval] keys of the per-policy
flags), and `names` (the policies registered, built-ins first).
"""

from __future__ import annotations

import sys
from typing import Any

from posbench.errors import PosbenchError
from posbench.policies.registry import POLICIES, Policy, coerce, get_policy, parse_spec


def RopeScaling(kind: str = "none", factor: float = 0.0, **settings: Any) -> Policy:  # noqa: N802 (a constructor)
    """The policy `kind` with a factor and those of `settings` it takes."""
    cls = get_policy(kind)
    return cls(factor, **{k: v for k, v in settings.items() if k in cls.defaults or k in cls.internal})


_said: set[str] = set()


def note(line: str) -> None:
    """One line on stderr, `note: ...` (a rope_scaling field left out), once per process."""
    if line not in _said:
        _said.add(line)
        print(f"note: {line}", file=sys.stderr)


def names() -> tuple[str, ...]:
    return tuple(POLICIES)


def refuse_stale(rows: list[dict[str, str]], policies: list[Policy], where: str) -> None:
    """Before any row is rewritten: one line when `rows` (a table in `where`) hold rows of a plug-in
    policy read now that another version of its file made (their policy_sha256 differs)."""
    loaded = {p.name: p.plugin_source.sha256 for p in policies if p.plugin_source is not None}
    for r in rows:
        name, sha = parse_spec(r.get("scaling") or "none")[0], r.get("policy_sha256") or ""
        if sha and name in loaded and sha != loaded[name]:
            raise PosbenchError(f"{where} holds rows of policy {name} made with another version of its plug-in file "
                                f"(sha256 {sha[:12]}, loaded now {loaded[name][:12]}); write to another --out or "
                                "remove those rows, so that one table never mixes two versions")


def specs(cfg) -> tuple[str, ...]:
    """The policies an evaluation reads: `rope_scaling`'s, then `rope_scaling_json`'s when given."""
    return (*cfg.rope_scaling, *((cfg.rope_scaling_json,) if cfg.rope_scaling_json.strip() else ()))


def from_eval(spec: str, cfg) -> Policy:
    """The policy of one `--rope-scaling` item, e.g. `yarn`, `yarn:4`, `yarn(alpha=2)`,
    `blend(mix=0.3)`: its settings from the [eval] keys that name them (yarn_alpha, ...) and the
    factor from rope_scaling_factor, then those written in the spec itself. A JSON object is
    transformers' rope_scaling (`--rope-scaling-json`, posbench.policies.hf), said where a field has
    no counterpart."""
    if spec.lstrip().startswith("{"):
        from posbench.policies.hf import from_rope_scaling

        policy, notes = from_rope_scaling(spec, "rope_scaling_json")
        for line in notes:
            note(line)
        return policy
    if spec.strip() == "config":
        raise PosbenchError("the policy config is a pretrained model's own rope_scaling (--model hf:FOLDER); a trained "
                            "run has none")
    name, factor, written = parse_spec(spec)
    cls = get_policy(name)
    settings = {k: getattr(cfg, flag) for k, flag in cls.flags.items()}
    for key, value in written.items():
        if key not in cls.defaults:
            raise PosbenchError(f"rope scaling {spec!r}: policy {name} has no setting {key!r}"
                                + (f"; its settings are {', '.join(cls.defaults)}" if cls.defaults else ""))
        settings[key] = coerce(cls, key, value)
    factor = cfg.rope_scaling_factor if factor is None else factor
    if factor and not factor >= 1:
        raise PosbenchError(f"rope scaling {spec!r}: the factor must be >= 1, got {factor:g}")
    return cls(factor, **settings)
