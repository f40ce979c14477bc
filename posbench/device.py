"""Where a run computes: the device, bfloat16 autocast, data parallelism under torchrun and the
compiled training forward."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from posbench import batches
from posbench.errors import PosbenchError


@dataclass(frozen=True)
class Distributed:
    """Data parallelism under torchrun (WORLD_SIZE > 1): every rank draws the same global batch
    from the same generator and trains on its slice, so N processes follow the trajectory of one
    process with the same global batch. Rank 0 alone writes files."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls, dev: torch.device) -> tuple[Distributed, torch.device]:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(), dev
        import torch.distributed as dist

        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        return cls(dist.get_rank(), world), dev

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def local(self, batch: batches.Batch) -> batches.Batch:
        """This rank's rows of the batch (positions are shared by every row)."""
        rows = batch.tokens.shape[0]
        if rows % self.world:
            raise PosbenchError(f"batch size {rows} is not divisible by {self.world} processes")
        per = rows // self.world

        def part(x):
            return None if x is None else x[self.rank * per: (self.rank + 1) * per]

        return batches.Batch(part(batch.tokens), part(batch.targets), part(batch.mask), batch.positions)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return value
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.world

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether `flag` is set on any rank, so that every rank stops at the same step."""
        if self.world == 1:
            return flag
        return self.mean(torch.tensor(float(flag), device=device)).item() > 0

    def wait(self) -> None:
        """Every rank here before any goes on: at the end of training, so that no rank tears the
        process group down while another still writes or reads through it."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise PosbenchError(f"unknown device {device!r}: use auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PosbenchError("--device cuda was asked for but no CUDA device is available")
    return torch.device(device)


def autocast(device: torch.device, dtype: str):
    enabled = dtype == "bfloat16"
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


class TrainingForward:
    """The model's training forward, compiled once (torch.compile, fixed shapes: every training
    batch has the same) or eager. `status` is what runs.csv records: on, off, or fallback when
    compilation failed and training went on eager after one warning line. Validation calls the
    eager model, which shares the weights: a few forwards per run do not repay a second
    compilation for eval mode and no_grad."""

    def __init__(self, net: torch.nn.Module, setting: str, device: torch.device):
        self.net = net
        self.status = "on" if setting == "on" or (setting == "auto" and device.type == "cuda") else "off"
        self.compiled = net
        self.proven = self.status == "off"  # a compiled step ran forward and backward once
        if self.status == "on":
            # One run, one graph: the compiled frames of earlier runs in this process (a grid
            # trains its schemes one after another) would each hold a cache entry of the model's
            # forward, and past torch's limit of 8 a later scheme would train eager unnoticed.
            import torch._dynamo

            torch._dynamo.reset()
            try:
                self.compiled = torch.compile(net, dynamic=False)
            except Exception as e:  # noqa: BLE001 - any failure of the compiler means eager
                self.fall_back(e)

    def fall_back(self, error: Exception) -> None:
        first = str(error).splitlines()[0] if str(error) else ""
        print(f"warning: torch.compile failed ({type(error).__name__}: {first[:200]}); "
              "training eager", file=sys.stderr)
        self.compiled, self.status, self.proven = self.net, "fallback", True

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)

    def first_step(self, step):
        """Run `step` (forward, backward); compilation happens lazily inside the first one, so
        its failure there falls back to eager and the step runs again from the same batch."""
        if self.proven:
            return step()
        try:
            out = step()
        except PosbenchError:
            raise
        except Exception as e:  # noqa: BLE001
            self.fall_back(e)
            return step()
        self.proven = True
        return out
