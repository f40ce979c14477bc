"""Every positional scheme, one module per family, all in one registry (`SCHEMES`).

Every module of this package is imported here, so a new scheme needs only its class (decorated
with `@register`) in a module of its family. Outside posbench, a plug-in (posbench.plugins) imports
`Scheme` and `register` from here and does the same.
"""

import importlib
import pkgutil

from posbench.schemes.base import (Dims, PositionLimitError, Range, Scheme, above, at_least, below, between, even,
                                   non_negative, one_of, positive)
from posbench.schemes.registry import SCHEMES, get_scheme, register

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SCHEMES", "Dims", "PositionLimitError", "Range", "Scheme", "above", "at_least", "below", "between",
           "even", "get_scheme", "non_negative", "one_of", "positive", "register"]
