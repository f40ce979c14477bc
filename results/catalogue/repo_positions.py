"""What RePo's module learned: the spread of the positions it gives, per RePo layer and head.

For each trained `repo` run, reads the first 64 and 1,024 test tokens and prints, per layer that
uses RePo, the mean |z|, each head's span max(z) - min(z), the mean step z_{t+1} - z_t, and each
head's correlation of z with the token index t (1 for a module that had learned RoPE's z = t).

    python results/catalogue/repo_positions.py RUN_DIR [RUN_DIR ...]

Its output for the three runs of README.md is repo_positions.txt.
"""
import sys
from pathlib import Path

import torch

from posbench.data import load_tokens
from posbench.runs import load_trained


def spread(z: torch.Tensor) -> str:
    """One line for positions z (H, T) of one window."""
    t = torch.arange(z.shape[1], dtype=torch.float32)
    span = [round(float(h.max() - h.min()), 2) for h in z]
    corr = [round(float(torch.corrcoef(torch.stack([h, t]))[0, 1]), 2) for h in z]
    step = float((z[:, 1:] - z[:, :-1]).mean())
    return f"|z| mean {float(z.abs().mean()):.3f}, span per head {span}, mean step {step:+.4f}, corr(z, t) per head {corr}"


def main(runs: list[str]) -> None:
    for run in runs:
        spec, model, _ = load_trained(Path(run))
        test = load_tokens(spec.data).test
        repo = next(m for m in model.modules() if type(m).__name__ == "RePo")
        seen: dict[int, torch.Tensor] = {}
        given = repo.positions

        def spy(x, layer):
            seen[layer] = given(x, layer)
            return seen[layer]

        repo.positions = spy
        for length in (64, 1024):
            seen.clear()
            with torch.no_grad():
                model(test[:length].unsqueeze(0))
            for layer, z in sorted(seen.items()):
                print(f"{Path(run).name} {length} tokens, layer {layer}: {spread(z[0])}")


if __name__ == "__main__":
    main(sys.argv[1:])
