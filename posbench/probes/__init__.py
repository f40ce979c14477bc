"""Synthetic length-generalization probes, one module per family, in two registries:
`PROBES` (symbols, for the models posbench trains) and `TEXT_PROBES` (text, for pretrained models).

A probe's data spec is its name with options after a colon (``mqar:spacing=8``); posbench.batches
makes its training examples through `parse_probe` and knows nothing else about probes. Every
module of this package is imported here, so a new probe needs only its class (decorated with
`@register`) and a test.
"""

import importlib
import pkgutil

from posbench.probes.base import (PROBES, TEXT_PROBES, Answer, Example, Fill, Probe, Text, TextProbe, TextPrompt,
                                   parse_probe, probe_name, register)
from posbench.probes.symbols import TOKENIZER

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PROBES", "TEXT_PROBES", "TOKENIZER", "Answer", "Example", "Fill", "Probe", "Text", "TextProbe", "TextPrompt",
           "parse_probe", "probe_name", "register"]
