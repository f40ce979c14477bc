"""Every positional scheme, one module per family, all in one registry (`SCHEMES`)."""

from posbench.schemes import absolute, bias, rotary  # noqa: F401  (registers the schemes)
from posbench.schemes.base import Dims, PositionLimitError, Scheme
from posbench.schemes.registry import SCHEMES, get_scheme

__all__ = ["SCHEMES", "Dims", "PositionLimitError", "Scheme", "get_scheme"]
