"""Training speed of posbench against x-transformers (the `peer` extra: pip install -e '.[peer]').

Both implementations train the same model (the quick task's: d_model 128, 4 layers, 4 heads, MLP
ratio 4, vocabulary 2048, untied head) with AdamW on the same random batches. Their steps are
interleaved in one process, so that a busy machine slows both alike: the ratio of medians is
meaningful on a shared machine, the absolute times are not.

    python scripts/peer_speed.py                          # none rope alibi t5, 30 rounds
    python scripts/peer_speed.py --schemes none rope --rounds 60 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from posbench.model import ModelConfig
from posbench.runs import RunSpec, build_model

# The x-transformers decoder options that give each scheme (its fused SDPA path wherever it has
# one: T5's learned bias is added to materialized scores); none turns positions off entirely.
PEER_OPTIONS = {
    "none": {"attn_flash": True},
    "rope": {"rotary_pos_emb": True, "attn_flash": True},
    "alibi": {"alibi_pos_bias": True, "attn_flash": True},
    "t5": {"rel_pos_bias": True},
}


def peer_model(scheme: str, cfg: ModelConfig, train_len: int) -> torch.nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=cfg.vocab_size, max_seq_len=train_len, use_abs_pos_emb=False,
        attn_layers=Decoder(dim=cfg.d_model, depth=cfg.n_layers, heads=cfg.n_heads,
                            ff_mult=cfg.mlp_ratio, **PEER_OPTIONS[scheme]),
    )


def ours_loss(model, x, y):
    return model(x, targets=y).mean()


def peer_loss(model, x, y):
    logits = model(x)  # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), y)


def step_seconds(model, loss_fn, opt, x, y) -> float:
    began = time.perf_counter()
    loss = loss_fn(model, x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", nargs="+", default=list(PEER_OPTIONS), choices=list(PEER_OPTIONS))
    ap.add_argument("--rounds", type=int, default=30, help="timed steps per model")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per model first")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = ModelConfig(vocab_size=2048)
    models = {}
    for scheme in args.schemes:
        ours = build_model(RunSpec(scheme=scheme), cfg.vocab_size)
        torch.manual_seed(0)
        peer = peer_model(scheme, cfg, args.train_len)
        for name, model, fn in (("posbench", ours, ours_loss), ("x-transformers", peer, peer_loss)):
            models[scheme, name] = (model.train(), fn, torch.optim.AdamW(model.parameters(), lr=1e-4))

    gen = torch.Generator().manual_seed(0)
    times = {key: [] for key in models}
    for round_ in range(args.warmup + args.rounds):
        x = torch.randint(0, cfg.vocab_size, (args.batch, args.train_len), generator=gen)
        y = torch.randint(0, cfg.vocab_size, (args.batch, args.train_len), generator=gen)
        # Alternate the order every round so that neither side always runs first.
        keys = list(models) if round_ % 2 == 0 else list(reversed(models))
        for key in keys:
            model, fn, opt = models[key]
            seconds = step_seconds(model, fn, opt, x, y)
            if round_ >= args.warmup:
                times[key].append(seconds)

    tokens = args.batch * args.train_len
    print(f"{'scheme':<8} {'posbench ms':>12} {'peer ms':>10} {'posbench/peer tok/s':>20}")
    for scheme in args.schemes:
        ours = statistics.median(times[scheme, "posbench"])
        peer = statistics.median(times[scheme, "x-transformers"])
        print(f"{scheme:<8} {ours * 1e3:>12.1f} {peer * 1e3:>10.1f} {peer / ours:>20.2f}")
    print(f"medians of {args.rounds} interleaved steps of {tokens} tokens, {args.threads} thread(s); "
          "on a shared machine only the ratios are meaningful")


if __name__ == "__main__":
    main()
