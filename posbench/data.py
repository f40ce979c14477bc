"""Text sources, tokenizers and the on-disk cache of tokenized splits (posbench/docs/data.md).

A data SPEC is one of:
- ``pystdlib``: the running Python's standard-library ``.py`` files (no site-/dist-packages),
- ``files:PATH_OR_GLOB``: the user's plain-text files, loaded through ``datasets``,
- ``hf:NAME[:CONFIG]``: a Hugging Face dataset through ``datasets`` (a local dataset folder works).
- ``PROBE[:OPTIONS]``: a synthetic probe (``passkey``, ``mqar:spacing=8``, ...; posbench.probes,
  `posbench probe --list`), whose runs train on its examples in the probe family's symbol
  vocabulary (posbench.batches), not on text: it has no corpus or tokenizer here.

Splits are deterministic: by a hash of each document's name when there are enough documents,
otherwise by contiguous ranges of the text (90/5/5). The tokenizer is a byte-level BPE trained on
the training split, or raw bytes.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from posbench.errors import PosbenchError, first_line, naming
from posbench.knobs import knob
from posbench.probes import PROBES, TOKENIZER, parse_probe, probe_name
from posbench.probes.symbols import SYMBOLS

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "valid", "test")
EOS = "<|endoftext|>"
CACHE_FORMAT = 1


@dataclass(frozen=True)
class DataConfig:
    """A probe's data always takes the probe family's symbol vocabulary, whatever was asked."""

    spec: str = knob("pystdlib", "pystdlib | files:PATH_OR_GLOB | hf:NAME[:CONFIG]", flag="data")
    tokenizer: str = knob("bpe", "bpe | bytes (symbols: probes)", flag=True)
    vocab_size: int = knob(2048, "BPE vocabulary size", flag=True)

    def __post_init__(self):
        if is_probe(self):
            object.__setattr__(self, "tokenizer", "symbols")
            object.__setattr__(self, "vocab_size", TOKENIZER.vocab_size)


def is_probe(cfg: DataConfig) -> bool:
    return isinstance(cfg.spec, str) and probe_name(cfg.spec) in PROBES


def probe_corpus(cfg: DataConfig, revision: bool = True) -> tuple[int, str]:
    """A probe run's vocabulary size and fingerprint (of the vocabulary, the probe's settings and
    its generator's revision; `revision=False`: the fingerprint of before revisions were kept)."""
    probe = parse_probe(cfg.spec)
    key = f"{TOKENIZER.name}|{' '.join(SYMBOLS)}|{probe.name}:{probe.settings()}"
    key += f"|r{probe.revision}" if revision else ""
    return TOKENIZER.vocab_size, f"{TOKENIZER.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def check_probe_corpus(cfg: DataConfig, recorded, run_id: str) -> None:
    """Refuse a probe run whose examples came from another revision of its generator (or another
    symbol vocabulary) than today's: its weights and scores would not be of this probe, and its
    run_id (of the settings alone) cannot tell."""
    if not is_probe(cfg) or recorded is None:
        return
    now = probe_corpus(cfg)[1]
    # a run recorded before fingerprints held the revision was trained on revision 1
    older = probe_corpus(cfg, revision=False)[1] if parse_probe(cfg.spec).revision == 1 else None
    if recorded not in (now, older):
        raise PosbenchError(f"run {run_id} was trained on {cfg.spec} examples of an earlier revision of the "
                            f"probe (corpus {recorded}, now {now}): its scores would not be of today's probe; "
                            f"move its folder out of the runs directory to train it again")


@dataclass
class Corpus:
    spec: str
    fingerprint: str
    splits: dict[str, list[str]]  # split -> documents


@dataclass
class TokenData:
    train: torch.Tensor  # (N,) int64 token stream, documents separated by EOS
    valid: torch.Tensor
    test: torch.Tensor
    vocab_size: int
    fingerprint: str  # of the corpus
    tokenizer: str  # e.g. "bpe4096"

    def split(self, name: str) -> torch.Tensor:
        return getattr(self, name)


# --- corpora -------------------------------------------------------------------------------


def _hash_bucket(name: str) -> str:
    b = int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100
    return "train" if b < 90 else "valid" if b < 95 else "test"


def split_documents(names: list[str], docs: list[str]) -> dict[str, list[str]]:
    """Deterministic 90/5/5 split: by name hash with >= 40 documents, else by text ranges."""
    if len(docs) >= 40:
        out: dict[str, list[str]] = {s: [] for s in SPLITS}
        for name, doc in zip(names, docs):
            out[_hash_bucket(name)].append(doc)
        if all(out.values()):
            return out
    text = "\n".join(docs)
    a, b = int(len(text) * 0.9), int(len(text) * 0.95)
    return {"train": [text[:a]], "valid": [text[a:b]], "test": [text[b:]]}


def _fingerprint(names: list[str], blobs: list[bytes]) -> str:
    h = hashlib.sha256()
    for name, blob in zip(names, blobs):
        h.update(name.encode() + b"\0" + blob + b"\0")
    return h.hexdigest()[:16]


def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_pystdlib() -> Corpus:
    root, files = stdlib_files()
    if not files:
        raise PosbenchError(f"no .py files under the standard library at {root}")
    names = [p.relative_to(root).as_posix() for p in files]
    blobs = [p.read_bytes() for p in files]
    docs = [b.decode("utf-8", errors="replace") for b in blobs]
    fp = _fingerprint(names, blobs)
    return Corpus("pystdlib", f"py{sys.version_info[0]}.{sys.version_info[1]}-{fp}", split_documents(names, docs))


def _expand(pattern: str) -> list[str]:
    path = Path(pattern).expanduser()
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*") if p.is_file())
    return sorted(p for p in glob.glob(str(path), recursive=True) if Path(p).is_file())


def load_files(pattern: str) -> Corpus:
    files = _expand(pattern)
    if not files:
        raise PosbenchError(f"no readable files match {pattern!r}")
    try:
        blobs = [Path(f).read_bytes() for f in files]
    except OSError as e:
        raise PosbenchError(f"cannot read {e.filename}: {e.strerror}") from None
    import datasets

    try:
        with _no_progress_bars():
            ds = datasets.load_dataset(
                "text", data_files=files, sample_by="document", split="train", keep_in_memory=True
            )
    except Exception as e:  # datasets raises many kinds; all mean the same to the user
        raise PosbenchError(f"cannot load files {pattern!r}: {first_line(e)}") from None
    docs = list(ds["text"])
    if not any(d.strip() for d in docs):
        raise PosbenchError(f"files {pattern!r} contain no text")
    # Names relative to the files' common folder: the same files elsewhere split the same way.
    root = os.path.commonpath([str(Path(f).parent) for f in files])
    names = [Path(f).relative_to(root).as_posix() for f in files]
    return Corpus(f"files:{pattern}", _fingerprint(names, blobs), split_documents(names, docs))


def _is_offline(e: BaseException) -> bool:
    names = {type(x).__name__ for x in (e, e.__cause__, e.__context__) if x is not None}
    text = str(e).lower()
    return bool(
        names & {"ConnectionError", "OfflineModeIsEnabled", "ConnectTimeout", "ConnectError",
                 "LocalEntryNotFoundError"}
        or "offline" in text
        or "couldn't reach" in text
        or "connection" in text
    )


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host accepts a connection within `timeout` seconds: when it does not,
    datasets would retry for half a minute before failing."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _no_progress_bars():
    """datasets' bars ("Generating train split") off for one call: the corpus is a step of a
    command, which speaks in lines of its own."""
    from datasets.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """datasets and huggingface_hub in offline mode (cached datasets still load) for one call;
    both read HF_HUB_OFFLINE once, at import, so their flags are set directly."""
    import datasets
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    if offline:
        constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def load_hf(name: str, config: str | None) -> Corpus:
    import datasets
    from huggingface_hub import constants

    label = name + (f":{config}" if config else "")
    offline = not Path(name).is_dir() and not constants.HF_HUB_OFFLINE and not _hub_reachable()
    try:
        with _hub_offline(offline), _no_progress_bars():
            dd = datasets.load_dataset(name, config)
    except Exception as e:
        if offline or _is_offline(e):
            raise PosbenchError(
                f"cannot reach the Hugging Face hub to load {label!r} (offline?); "
                "use --data pystdlib or files:PATH"
            ) from None
        raise PosbenchError(f"cannot load dataset {label!r}: {first_line(e)}") from None
    aliases = {"train": ["train"], "valid": ["validation", "valid", "dev"], "test": ["test"]}
    texts: dict[str, str] = {}
    for split, keys in aliases.items():
        for key in keys:
            if key in dd:
                column = "text" if "text" in dd[key].column_names else dd[key].column_names[0]
                texts[split] = "\n".join(str(t) for t in dd[key][column])
                break
    if "train" not in texts:
        raise PosbenchError(f"dataset {label!r} has no train split (has: {', '.join(dd)})")
    if len(texts) < 3:
        text = texts["train"]
        a, b = int(len(text) * 0.9), int(len(text) * 0.95)
        texts = {"train": text[:a], "valid": text[a:b], "test": text[b:]}
    h = hashlib.sha256()
    for split in SPLITS:
        h.update(texts[split].encode() + b"\0")
    return Corpus(f"hf:{label}", h.hexdigest()[:16], {s: [texts[s]] for s in SPLITS})


def load_corpus(spec: str) -> Corpus:
    kind, _, rest = spec.partition(":")
    if spec == "pystdlib":
        return load_pystdlib()
    if kind == "files" and rest:
        return load_files(rest)
    if kind == "hf" and rest:
        name, _, config = rest.partition(":")
        return load_hf(name, config or None)
    if kind in PROBES:
        raise PosbenchError(f"{spec!r} is a probe: its runs train on its examples and are scored with "
                            "`posbench probe`, not on a text corpus")
    raise PosbenchError(
        f"unknown data spec {spec!r}: use pystdlib, files:PATH_OR_GLOB, hf:NAME[:CONFIG] or a probe "
        f"({', '.join(sorted(PROBES))})[:OPTIONS]"
    )


# --- tokenizers ----------------------------------------------------------------------------


class ByteTokenizer:
    """Raw UTF-8 bytes, 0..255, and EOS = 256."""

    vocab_size = 257
    eos_id = 256

    def encode_documents(self, docs: list[str]) -> np.ndarray:
        parts = []
        for doc in docs:
            parts.append(np.frombuffer(doc.encode("utf-8"), dtype=np.uint8).astype(np.int32))
            parts.append(np.array([self.eos_id], dtype=np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE from `tokenizers`, trained on the training split."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.eos_id = tok.token_to_id(EOS)

    @classmethod
    def train(cls, docs: list[str], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(docs, trainer=trainer)
        return cls(tok)

    def encode_documents(self, docs: list[str]) -> np.ndarray:
        parts = []
        for enc in self.tok.encode_batch(docs):
            parts.append(np.asarray(enc.ids, dtype=np.int32))
            parts.append(np.array([self.eos_id], dtype=np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))


def tokenizer_label(cfg: DataConfig) -> str:
    if cfg.tokenizer == "bytes":
        return "bytes"
    if cfg.tokenizer == "bpe":
        return f"bpe{cfg.vocab_size}"
    if cfg.tokenizer == "symbols" and is_probe(cfg):
        return TOKENIZER.name
    raise PosbenchError(f"unknown tokenizer {cfg.tokenizer!r}: use bpe or bytes (probes: symbols)")


def cache_dir() -> Path:
    return Path(os.environ.get("POSBENCH_CACHE", Path.home() / ".cache" / "posbench"))


def cached_tokens(cfg: DataConfig, cache: dict) -> TokenData | None:
    """A run's token data, loaded once per data config into `cache`; None for a probe's run, whose
    examples need no corpus."""
    if cfg not in cache:
        cache[cfg] = None if is_probe(cfg) else load_tokens(cfg)
    return cache[cfg]


def load_tokens(cfg: DataConfig) -> TokenData:
    """Tokenized splits, from the cache when the corpus fingerprint and tokenizer match."""
    label = tokenizer_label(cfg)
    if cfg.tokenizer == "bpe" and not 300 <= cfg.vocab_size <= 65535:
        raise PosbenchError(f"vocab_size must be in 300..65535 for bpe, got {cfg.vocab_size}")
    corpus = load_corpus(cfg.spec)
    key = hashlib.sha256(f"{corpus.fingerprint}|{label}|{CACHE_FORMAT}".encode()).hexdigest()[:20]
    where = cache_dir() / key
    if not (where / "meta.json").exists():
        build_cache(corpus, cfg, where)
    meta = json.loads((where / "meta.json").read_text())
    import torch  # here, not at import: the command line builds its options without it

    arrays = {s: torch.from_numpy(np.load(where / f"{s}.npy").astype(np.int64)) for s in SPLITS}
    return TokenData(**arrays, vocab_size=meta["vocab_size"], fingerprint=corpus.fingerprint, tokenizer=label)


def build_cache(corpus: Corpus, cfg: DataConfig, where: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=where.parent, prefix=".tmp-"))
    try:
        if cfg.tokenizer == "bytes":
            tok = ByteTokenizer()
        else:
            tok = BPETokenizer.train(corpus.splits["train"], cfg.vocab_size)
            # beside the ids it made, to read them (tokenizers.Tokenizer.from_file); posbench needs only the ids
            tok.tok.save(str(tmp / "tokenizer.json"))
        for split in SPLITS:
            ids = tok.encode_documents(corpus.splits[split])
            if len(ids) < 2:
                raise PosbenchError(f"corpus {corpus.spec!r} has an empty {split} split")
            with naming(where / f"{split}.npy"):
                np.save(tmp / f"{split}.npy", ids.astype(np.uint16 if tok.vocab_size <= 65536 else np.int32))
        meta = {"spec": corpus.spec, "fingerprint": corpus.fingerprint, "tokenizer": tokenizer_label(cfg),
                "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "format": CACHE_FORMAT}
        with naming(where / "meta.json"):
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(where)
        except OSError:  # another process filled the cache first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def unigram_loss(train: torch.Tensor, valid: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats) on `valid` of a unigram model fit on `train` (add-one smoothing)."""
    import torch

    counts = torch.bincount(train, minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[valid].mean())
