"""posbench: positional-encoding benchmark and length-extrapolation harness."""

__version__ = "0.1.0"
