"""Synthetic length-generalization probes, one module per family, all in one registry (`PROBES`).

A probe's data spec is its name with options after a colon (``copy:size=1-40,seed=3``); data.py
loads its training documents through `parse_probe` and knows nothing else about probes. Every
module of this package is imported here, so a new probe needs only its class (decorated with
`@register`) and a test.
"""

import importlib
import pkgutil

from posbench.probes.base import (PROBES, Answer, Fill, Probe, Prompt, PromptMaker, Text, parse_probe,
                                  probe_name)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PROBES", "Answer", "Fill", "Probe", "Prompt", "PromptMaker", "Text", "parse_probe", "probe_name"]
