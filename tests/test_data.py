import json

import pytest
import torch

from conftest import write_corpus
from posbench import data
from posbench.data import DataConfig, load_tokens
from posbench.errors import PosbenchError


@pytest.mark.slow
def test_stdlib_files_exclude_site_packages_and_are_sorted():
    root, files = data.stdlib_files()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert not any("site-packages" in r or "dist-packages" in r for r in rel)
    assert all(r.endswith(".py") for r in rel)


def test_split_is_deterministic_and_disjoint():
    names = [f"f{i}.py" for i in range(200)]
    docs = [f"text {i}" for i in range(200)]
    a = data.split_documents(names, docs)
    b = data.split_documents(list(reversed(names)), list(reversed(docs)))
    assert {k: sorted(v) for k, v in a.items()} == {k: sorted(v) for k, v in b.items()}
    assert sum(len(v) for v in a.values()) == 200
    assert 150 < len(a["train"]) < 195 and a["valid"] and a["test"]


def test_few_documents_split_by_text_ranges():
    out = data.split_documents(["a"], ["x" * 1000])
    assert [len(out[s][0]) for s in data.SPLITS] == [900, 50, 50]


def test_files_loader_bytes_roundtrip(corpus_dir):
    tokens = load_tokens(DataConfig(spec=f"files:{corpus_dir}", tokenizer="bytes"))
    assert tokens.vocab_size == 257
    text = data.ByteTokenizer().decode(tokens.train[:200].tolist())
    assert text.split()[0] in open(next(corpus_dir.iterdir())).read() or text.strip()
    assert len(tokens.train) > 10 * len(tokens.valid) > 0


def test_bpe_trained_on_train_split_and_cached(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c", n_docs=50, words=200, seed=3)
    cfg = DataConfig(spec=f"files:{corpus}", tokenizer="bpe", vocab_size=300)
    first = load_tokens(cfg)
    assert first.vocab_size == 300 and first.tokenizer == "bpe300"
    # BPE compresses: fewer tokens than bytes.
    byte_count = sum(len(p.read_bytes()) for p in corpus.iterdir())
    assert len(first.train) + len(first.valid) + len(first.test) < byte_count / 2
    # A second load reads the cache: training a tokenizer again would fail here.
    monkeypatch.setattr(data.BPETokenizer, "train", lambda *a: pytest.fail("retrained"))
    second = load_tokens(cfg)
    assert torch.equal(first.train, second.train) and first.fingerprint == second.fingerprint
    # The cache keeps the tokenizer beside its ids, and it reads them back to the training split.
    from tokenizers import Tokenizer

    (where,) = [m.parent for m in data.cache_dir().glob("*/meta.json")
                if json.loads(m.read_text())["fingerprint"] == first.fingerprint
                and json.loads(m.read_text())["tokenizer"] == "bpe300"]
    tok = Tokenizer.from_file(str(where / "tokenizer.json"))
    ends = [i for i, t in enumerate(first.train.tolist()) if t == tok.token_to_id(data.EOS)]
    docs = [tok.decode(first.train[a + 1:b].tolist()) for a, b in zip([-1, *ends], ends)]
    assert docs == data.load_corpus(cfg.spec).splits["train"]


def test_cache_keyed_by_content(tmp_path):
    corpus = write_corpus(tmp_path / "c", n_docs=45, seed=1)
    cfg = DataConfig(spec=f"files:{corpus}", tokenizer="bytes")
    a = load_tokens(cfg)
    (corpus / "doc000.txt").write_text("changed text\n")
    b = load_tokens(cfg)
    assert a.fingerprint != b.fingerprint


def test_hf_loader_on_local_dataset_folder(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    for split, n in (("train", 300), ("validation", 30), ("test", 30)):
        (folder / f"{split}.txt").write_text("\n".join(f"{split} line {i} of text" for i in range(n)))
    tokens = load_tokens(DataConfig(spec=f"hf:{folder}", tokenizer="bytes"))
    assert b"validation line" in bytes(t for t in tokens.valid.tolist() if t < 256)
    assert b"test line" in bytes(t for t in tokens.test.tolist() if t < 256)


def test_hf_offline_is_one_clear_error():
    with pytest.raises(PosbenchError, match="cannot reach the Hugging Face hub"):
        load_tokens(DataConfig(spec="hf:wikitext:wikitext-103-raw-v1", tokenizer="bytes"))


@pytest.mark.parametrize("spec, message", [
    ("files:/definitely/not/here/*.txt", "no readable files"),
    ("nonsense", "unknown data spec"),
    ("files:", "unknown data spec"),
])
def test_bad_specs(spec, message):
    with pytest.raises(PosbenchError, match=message):
        load_tokens(DataConfig(spec=spec, tokenizer="bytes"))


def test_unigram_loss_of_uniform_stream_is_log_vocab():
    stream = torch.arange(64).repeat(100)
    assert data.unigram_loss(stream, stream, 64) == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=1e-3)


def test_files_split_does_not_depend_on_where_the_corpus_lives(tmp_path):
    a = write_corpus(tmp_path / "one" / "corpus", n_docs=45, words=30)
    b = write_corpus(tmp_path / "two" / "deeper" / "corpus", n_docs=45, words=30)
    first, second = data.load_files(str(a)), data.load_files(str(b))
    assert first.splits == second.splits and first.fingerprint == second.fingerprint
