import os
import random
from pathlib import Path

import pytest
import torch

from posbench.config import TrainConfig
from posbench.data import DataConfig
from posbench import layout, plugins
from posbench.model import ModelConfig, Transformer
from posbench.probes import PROBES
from posbench.probes.base import TEXT_PROBES
from posbench.schemes import SCHEMES, Dims

# Two threads a test, as CI's two cores; under pytest-xdist the workers share the cores instead
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which "
         "model position token attention length scheme rotary bias window train test loss").split()


@pytest.fixture(autouse=True, scope="session")
def _isolated_caches(tmp_path_factory):
    """Every test run gets its own token cache (shared by its xdist workers: a cache is filled
    atomically) and never reaches a hub."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "caches"
    root.mkdir(exist_ok=True)
    os.environ["POSBENCH_CACHE"] = str(root / "posbench")
    os.environ["HF_HOME"] = str(root / "hf")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf" / "datasets")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture
def registry():
    """Plug-ins register into the process's registries: each test gets them back as they were."""
    saved = dict(SCHEMES), dict(PROBES), dict(TEXT_PROBES), dict(plugins._loaded), list(plugins._command_line)
    yield
    for live, old in zip((SCHEMES, PROBES, TEXT_PROBES, plugins._loaded), saved):
        live.clear()
        live.update(old)
    plugins._command_line[:] = saved[4]


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (names and bytes) but lock files: what 'results untouched'
    compares."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def write_corpus(directory: Path, n_docs: int = 60, words: int = 400, seed: int = 0) -> Path:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        (directory / f"doc{i:03d}.txt").write_text(text + "\n")
    return directory


def pretrained_task(folder: Path, tmp_path: Path) -> Path:
    """A task file that reads the Hugging Face model in `folder` on a small corpus of its own, at
    lengths 32 and 64 over 128 tokens."""
    corpus = write_corpus(tmp_path / "corpus", n_docs=4, words=200)
    task = tmp_path / "mine.toml"
    task.write_text(f'schemes = []\n[data]\nspec = "files:{corpus}/*.txt"\n[model]\npretrained = "hf:{folder}"\n'
                    "[eval]\nlengths = [32, 64]\ntokens = 128\n")
    return task


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_data(corpus_dir) -> DataConfig:
    return DataConfig(spec=f"files:{corpus_dir}", tokenizer="bytes")


# The [data] .. [eval] tables of a tiny task file on the test corpus ({corpus}); [eval] comes last
# so that a test can add keys to it.
TINY_TASK = """
[data]
spec = "files:{corpus}"
tokenizer = "bytes"
[model]
d_model = 32
n_layers = 1
n_heads = 2
[train]
train_len = 16
steps = 4
batch_size = 4
warmup = 1
eval_interval = 4
eval_windows = 4
[eval]
lengths = [16, 32]
tokens = 64
"""

# A passkey task's data, model and [train] at the smallest size (its [train] table left open).
TINY_PASSKEY = """
[data]
spec = "passkey"
[model]
d_model = 16
n_layers = 1
n_heads = 2
[train]
train_len = 32
steps = 2
batch_size = 2
warmup = 1
eval_interval = 2
"""
TINY_MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=4)
TINY_TRAIN = TrainConfig(train_len=16, steps=6, batch_size=4, warmup=2, eval_interval=3,
                         eval_windows=4, checkpoint_interval=2)


def tiny_model(name: str, train_len: int = 16, seed: int = 0, vocab: int = 50,
               n_layers: int | None = None, **params) -> Transformer:
    """A scheme, preset or layout spec on a tiny model, 2 layers or one period of the layout's
    pattern if longer; `model.layout.schemes[0]` is the first (for a scheme: the only) scheme."""
    if n_layers is None:
        n_layers = max(2, len(layout.parse(name).pattern))
    torch.manual_seed(seed)
    dims = Dims(d_model=32, n_heads=4, n_layers=n_layers, vocab_size=vocab, train_len=train_len,
                max_position=train_len, params=params)
    cfg = ModelConfig(vocab_size=vocab, d_model=32, n_layers=n_layers, n_heads=4)
    return Transformer(cfg, layout.build(name, dims)).eval()


@pytest.fixture
def one_thread():
    """The threads a worker of two on two cores computes with, for the runs made in this process."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
