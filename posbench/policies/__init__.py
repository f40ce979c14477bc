"""The eval-time RoPE policies (`--rope-scaling`, posbench/docs/extension.md): how a model trained
with RoPE is read past its training length without training again.

- posbench.policies.scaling: the policies' names, what `posbench schemes --policies` lists, and
  `RopeScaling`, one policy with its settings (no torch: the command line names them without it).
- posbench.policies.frequencies: the rotary frequencies under each policy that rescales them.
- posbench.policies.rotation: turning q and k by position.
- posbench.policies.two_maps: Self-Extend, ReRoPE and DPE's merged logit maps.
- posbench.policies.dpe: DPE's scales, detected or defaulted.

This package imports only the torch-free names; the formulas are imported from their modules.
"""

from posbench.policies.scaling import (DOPE_DEFAULTS, DPE_GROUPS, KINDS, LLAMA3_DEFAULTS, LOGIT_POLICIES, POLICIES,
                                       SCALINGS, TWO_MAPS, UNSCALED, YARN_DEFAULTS, RopeScaling)

__all__ = ["DOPE_DEFAULTS", "DPE_GROUPS", "KINDS", "LLAMA3_DEFAULTS", "LOGIT_POLICIES", "POLICIES", "SCALINGS",
           "TWO_MAPS", "UNSCALED", "YARN_DEFAULTS", "RopeScaling"]
