"""The eval-time RoPE policies (`--rope-scaling`, posbench/docs/extension.md and policies.md): how a
model trained with RoPE is read past its training length without training again.

A policy is one class on `Policy`, registered with `register` (posbench.policies.registry): the
built-ins are in posbench.policies.builtins; a plug-in (posbench/docs/plugins.md) does the same:

    from posbench.policies import Policy, register

- posbench.policies.registry: `Policy`, its hooks, `register`, `POLICIES` and the policy specs.
- posbench.policies.scaling: `RopeScaling(kind, factor, **settings)` and `from_eval`.
- posbench.policies.frequencies: the rotary frequencies under a policy, and the built-ins' formulas.
- posbench.policies.rotation: turning q and k by position.
- posbench.policies.two_maps: the merged logits of the two-map policies (Self-Extend, ReRoPE, DPE).
- posbench.policies.dpe: DPE's scales, detected or defaulted.
- posbench.policies.check: `posbench check --policy`, the conformance report of a policy.
"""

from posbench.policies.registry import POLICIES, Policy, PolicyFailure, get_policy, make, register
from posbench.policies.scaling import RopeScaling, from_eval, names, refuse_stale, specs
from posbench.policies import builtins  # noqa: F401  (registers the built-ins)

__all__ = ["POLICIES", "Policy", "PolicyFailure", "RopeScaling", "from_eval", "get_policy", "make", "names",
           "refuse_stale", "register", "specs"]
