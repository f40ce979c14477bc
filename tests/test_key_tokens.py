"""Key-token perplexity (LongPPL): which targets the whole window predicts better than the last
train_len tokens, on a stream whose every token recurs a fixed distance back; LongPPL's rule
transcribed as the reference; and its columns in extrapolation.csv from `posbench extrapolate`."""

import math

import pytest
import torch

from posbench import results
from posbench.cli import main
from posbench.config import EvalConfig
from posbench.evaluate import KeyTokens, score, short_losses

PERIOD = 40  # every token of the stream recurs 40 tokens later, and nowhere between
SEEN, UNSEEN = 0.1, 5.0  # a fake model's loss of a target whose earlier copy it reads, or does not


class CopyScorer:
    """A model that predicts a token exactly when it reads an earlier copy of it."""

    def losses(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        seen = (inputs[:, None, :] == targets[:, :, None]).tril().any(-1)  # (B, L): target t among inputs 0..t
        return torch.where(seen, torch.tensor(SEEN, dtype=torch.float64), torch.tensor(UNSEEN, dtype=torch.float64))

    def per_forward(self, length: int) -> int:
        return 4


def stream(n: int = 2000) -> torch.Tensor:
    return torch.arange(n) % PERIOD


def test_short_losses_read_at_most_the_context():
    tokens = stream(130)[None]  # one window of 129 targets
    short = short_losses(CopyScorer(), tokens, 32)
    assert short[0, :32].isnan().all()  # the whole window gives these no more than the short one
    assert (short[0, 32:] == UNSEEN).all()  # a copy 40 back is beyond 32 tokens
    assert (short_losses(CopyScorer(), tokens, 64)[0, 64:] == SEEN).all()  # and within 3/4 of 64


@pytest.mark.parametrize("length", [128, 256])
def test_key_tokens_are_the_targets_only_the_whole_window_predicts(length):
    cfg = EvalConfig(lengths=(length,), tokens=1024)
    keys = KeyTokens(CopyScorer(), 32, cfg.key_drop, cfg.key_loss)
    total, count, _, _ = score(CopyScorer(), stream(), length, cfg, cfg.lengths, keys=keys)
    windows = int(count[0])
    # targets t >= 39 read their copy in the whole window; those from 32 on are compared
    assert keys.compared == windows * (length - 32) and keys.keys == windows * (length - (PERIOD - 1))
    cols = keys.columns()
    assert cols["key_ppl"] == pytest.approx(math.exp(SEEN)) and cols["key_tokens"] == keys.keys
    assert cols["key_share"] == pytest.approx((length - PERIOD + 1) / (length - 32))
    strict = KeyTokens(CopyScorer(), 32, UNSEEN, cfg.key_loss)  # no drop is above 5
    score(CopyScorer(), stream(), length, cfg, cfg.lengths, keys=strict)
    assert strict.keys == 0 and strict.columns()["key_ppl"] is None and strict.columns()["key_share"] == 0


def longppl_keys(tokens: torch.Tensor, trunc_len: int, sliding_window: int, alpha=2.0, beta=-2.0) -> list[int]:
    """LongPPL's find_key_token (PKU-ML/LongPPL, longppl.py) on CopyScorer, its loops as written there:
    short windows of trunc_len + sliding_window tokens from every sliding_window-th token, a key
    token where loss_short - loss_full > alpha and loss_full < -beta."""
    full = CopyScorer().losses(tokens[None])[0]  # full[t]: the loss of token t + 1
    length, keys = tokens.shape[0], []
    for start in range(0, length - trunc_len, sliding_window):
        window = min(sliding_window, length - start - trunc_len)
        short = CopyScorer().losses(tokens[None, start: start + trunc_len + window])[0]
        loss_full = full[start + trunc_len - 1: start + trunc_len + window - 1]
        loss_short = short[trunc_len - 1: trunc_len + window - 1]
        key = (loss_short - loss_full > alpha) & (loss_full < -beta)
        keys += [start + trunc_len + i for i in range(window) if key[i]]
    return keys


def test_key_tokens_agree_with_longppls_rule():
    tokens = stream(257)
    reference = longppl_keys(tokens, trunc_len=24, sliding_window=8)  # its short contexts: 24..31 tokens
    assert len(reference) == 256 - (PERIOD - 1)  # every token whose copy lies beyond the short window
    keys = KeyTokens(CopyScorer(), 32, 2.0, 2.0)  # here: 25..32 tokens
    keys.add(tokens[None], CopyScorer().losses(tokens[None]), 0)
    assert keys.keys == len(reference)


@pytest.mark.slow
def test_extrapolate_writes_key_token_columns(corpus_dir, tmp_path):
    tiny = ["--train-len", "16", "--steps", "4", "--batch-size", "4", "--d-model", "32", "--layers", "1",
            "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]
    assert main(["train", "--scheme", "rope", "--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), *tiny]) == 0
    args = ["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,64", "--tokens", "128", "--device", "cpu"]
    assert main(args) == 0
    rows = {r["eval_len"]: r for r in results.read_rows(tmp_path / "extrapolation.csv")}
    assert rows["16"]["key_share"] == "" and rows["16"]["key_tokens"] == "0"  # nothing reads past 16
    share = float(rows["64"]["key_share"])
    assert 0 <= share <= 1 and int(rows["64"]["key_tokens"]) == round(share * 2 * (64 - 16))
    assert main(args + ["--no-key-tokens"]) == 0
    assert {r["key_share"] for r in results.read_rows(tmp_path / "extrapolation.csv")} == {""}
