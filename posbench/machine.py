"""The machine kind: what a run's bits depend on beyond its run_id.

A run_id names a configuration; the arithmetic that trains it is chosen by the machine. oneDNN,
MKL and ATen pick their kernels by the CPU's vector extensions (AVX2, AVX-512, AMX) and split
reductions by the number of threads; a GPU by its model and its CUDA libraries. Different
kernels sum in different orders, and float sums in different orders differ in their last bits,
which training then amplifies (posbench/docs/reproducibility.md). So every row records the kind
it was made on: runs with the same run_id and the same kind are bitwise equal, runs of different
kinds are equal in distribution only.

The kind is a short readable prefix and a hash of every detail (`avx512x2-3f9a1c2b`: ATen's CPU
kernels, threads, hash); `detail` spells the details out.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# The /proc/cpuinfo flags that choose kernels (x86: SSE4.2 up to AMX; Arm: NEON, SVE).
VECTOR_FLAGS = ("sse4_2", "avx", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "sve2")
# Environment variables that choose other kernels than the CPU's own (or make MKL's reproducible).
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                   "MKL_CBWR")


@dataclass(frozen=True)
class Machine:
    device: str  # cpu | cuda
    processor: str  # the CPU's model name, or the GPU's name and compute capability
    extensions: tuple[str, ...]  # VECTOR_FLAGS the CPU has, in that order
    kernels: str  # ATen's CPU kernel level (DEFAULT, AVX2, AVX512, ...), or the CUDA and cuDNN versions
    torch: str
    blas: str  # the BLAS and oneDNN builds torch was compiled with
    threads: int  # torch.get_num_threads()
    settings: str = ""  # KERNEL_SETTINGS that are set, e.g. MKL_CBWR=COMPATIBLE

    @property
    def detail(self) -> str:
        return (f"{self.processor}; {' '.join(self.extensions) or 'no vector flags read'}; kernels {self.kernels}; "
                f"torch {self.torch}; {self.blas}; {self.threads} threads" + (f"; {self.settings}" if self.settings else ""))

    @property
    def kind(self) -> str:
        digest = hashlib.sha256(f"{self.device}|{self.detail}".encode()).hexdigest()[:8]
        prefix = "cuda" if self.device == "cuda" else self.kernels.lower()
        return f"{prefix}x{self.threads}-{digest}"

    def columns(self) -> dict[str, str]:
        """The two cells every result row records."""
        return {"machine": self.kind, "machine_detail": self.detail}


def current(device: str = "cpu") -> Machine:
    """The machine this process computes on now (threads as set at this moment)."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        processor = f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"
        kernels = f"cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()}"
        return Machine("cuda", processor, (), kernels, torch.__version__, _blas(), torch.get_num_threads(), _settings())
    model, flags = _cpu()
    return Machine("cpu", model, flags, torch.backends.cpu.get_cpu_capability(), torch.__version__, _blas(),
                   torch.get_num_threads(), _settings())


def _settings() -> str:
    return " ".join(f"{k}={os.environ[k]}" for k in KERNEL_SETTINGS if os.environ.get(k))


@functools.cache
def _cpu() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and vector extensions, from /proc/cpuinfo where there is one."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), ()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fields.get("CPU part") or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return model, tuple(f for f in VECTOR_FLAGS if f in flags)


@functools.cache
def _blas() -> str:
    """e.g. `blas mkl 2024.2, onednn 3.12.0`, from the build torch reports."""
    import torch

    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    parts = [f"blas {blas[1] if blas else 'unknown'}"]
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", config)
    if mkl:
        parts[0] += f" {mkl[1]}"
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    if onednn:
        parts.append(f"onednn {onednn[1]}")
    return ", ".join(parts)


def mixture(rows: Iterable[dict[str, str]], where: str) -> str | None:
    """One line naming the machine kinds of a folder's finished runs when there are several
    (rows written before kinds were recorded count as `unrecorded`), else None."""
    kinds = Counter(r.get("machine") or "unrecorded" for r in rows if r.get("status") == "ok")
    if len(kinds) < 2:
        return None
    named = ", ".join(f"{k} ({n} run{'s' * (n != 1)})" for k, n in sorted(kinds.items()))
    return (f"{where} mixes runs of {len(kinds)} machine kinds: {named}; runs of different kinds are "
            "equal in distribution, not bitwise (posbench/docs/reproducibility.md)")
