"""A model spec (`hf:FOLDER`, `gguf:FILE`) parsed, located and loaded through transformers, local files
only, its architecture checked and its rotary embedding swapped for posbench's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import os
import re
import struct
from pathlib import Path

import torch

from posbench import results
from posbench.policies import POLICIES
from posbench.config import DTYPES
from posbench.errors import PosbenchError, did_you_mean, first_line
from posbench.pretrained.attention import register_attention
from posbench.pretrained.model import Pretrained
from posbench.pretrained.rotary import Rotary


ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # half-split RoPE on every head dim, q and k by apply_rotary_pos_emb


def parse(spec: str, base: Path | None = None) -> tuple[str, Path]:
    """(kind, path) of `hf:FOLDER` or `gguf:FILE`; one line when the path is not a local one."""
    kind, colon, where = spec.partition(":")
    if not colon or kind not in results.MODEL_KINDS or not where:
        raise PosbenchError(f"bad model {spec!r}: use hf:FOLDER (a local Hugging Face model folder) or gguf:FILE")
    path = locate(where, base)
    if path is None:
        hub = re.fullmatch(r"[\w.-]+/[\w.-]+", where) is not None and kind == "hf"
        if hub:
            raise PosbenchError(f"{where!r} is not a local folder; posbench never downloads a model: fetch it "
                                f"first (e.g. `hf download {where} --local-dir DIR`), then --model hf:DIR")
        raise PosbenchError(f"model {kind}:{where} does not exist")
    if kind == "hf" and not (path / "config.json").is_file():
        raise PosbenchError(f"{path} is not a Hugging Face model folder (no config.json)")
    if kind == "gguf" and not path.is_file():
        raise PosbenchError(f"{path} is not a GGUF file")
    return kind, path


def locate(where: str, base: Path | None) -> Path | None:
    """The path as given (from `base`, a task file's folder, when relative), else inside the
    installed package its first part names; None when neither exists."""
    path = Path(where).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path] + ([base / path] if base else [])
    found = next((p for p in candidates if p.exists()), None)
    if found is None and not path.is_absolute() and len(path.parts) > 1:
        spec = importlib.util.find_spec(path.parts[0]) if path.parts[0].isidentifier() else None
        if spec is not None and spec.submodule_search_locations:
            inside = Path(next(iter(spec.submodule_search_locations))).joinpath(*path.parts[1:])
            found = inside if inside.exists() else None
    return found.resolve() if found is not None else None


def file_hash(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and bytes, sorted; hidden ones left out)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() + b"\0" if f != path else b"")
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def require_extra(kind: str) -> None:
    needed = ["transformers"] + (["gguf"] if kind == "gguf" else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise PosbenchError(f"--model needs {' and '.join(missing)}: pip install 'posbench[pretrained]'")


@contextlib.contextmanager
def _read_once(kind: str):
    """While a GGUF model loads, gguf's reader parses its file once. transformers (5.x) reads the
    file through gguf.GGUFReader for the configuration, again when the tokenizer reads the
    configuration, and again for the weights, and builds gguf's table of tensor names once per
    module (some 400 times for SmolLM2-135M): the same file and the same table each time, so both
    are kept for the length of one load (SmolLM2-135M loads in about half the time). transformers
    imports both from gguf when it calls them; gguf's own are back once the load ends."""
    if kind != "gguf":
        yield
        return
    import gguf

    kept = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map") if hasattr(gguf, name)}
    for name, made in kept.items():
        setattr(gguf, name, functools.cache(made))
    try:
        yield
    finally:
        for name, made in kept.items():
            setattr(gguf, name, made)


def _quiet(kind: str):
    """transformers de-quantizes a GGUF file's tensors under a tqdm bar of its own, which its
    `disable_progress_bar` does not reach: stderr goes nowhere while such a model loads (its errors
    are raised, and transformers' log handler keeps the stream it was given)."""
    return contextlib.redirect_stderr(io.StringIO()) if kind == "gguf" else contextlib.nullcontext()


def load(spec: str, base: Path | None = None, device: torch.device | str = "cpu", dtype: str = "float32") -> Pretrained:
    """The model of `spec` on `device` in `dtype` (float32 or bfloat16: a GGUF file's tensors are
    de-quantized to float32 first), its rotary embedding swapped for posbench's."""
    if dtype not in DTYPES:
        raise did_you_mean(dtype, DTYPES, "dtype")
    kind, path = parse(spec, base)
    require_extra(kind)
    os.environ["HF_HUB_OFFLINE"] = "1"  # read at import: never a request to the hub
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": str(path), "local_files_only": True}
    if kind == "gguf":
        where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name, "local_files_only": True}
    with _read_once(kind):
        try:
            config = AutoConfig.from_pretrained(**where)
        except Exception as e:  # transformers' many error types: one line
            raise PosbenchError(f"cannot read the model configuration of {spec}: {first_line(e)}"
                                f"{_cut_short(e, kind, path)}") from None
        check_architecture(config, spec)
        try:
            with _quiet(kind):
                model = AutoModelForCausalLM.from_pretrained(**where, config=config, dtype=torch.float32,
                                                             attn_implementation="sdpa")
                tokenizer = AutoTokenizer.from_pretrained(**where)
        except Exception as e:
            raise PosbenchError(f"cannot load {spec}: {first_line(e)}{_cut_short(e, kind, path)}") from None
    model.to(device, dtype=getattr(torch, dtype)).eval()
    register_attention()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # a model that rescales its RoPE (read as the policy `config`) was trained at its original length
    context = config.rope_parameters.get("original_max_position_embeddings") or config.max_position_embeddings
    rotary = Rotary(head_dim, float(config.rope_parameters["rope_theta"]), int(context))
    model.model.rotary_emb = rotary
    for layer in model.model.layers:
        layer.self_attn.posbench_rotary = rotary
    return Pretrained(spec, path, model, tokenizer, rotary, file_hash(path), dtype)


def _cut_short(e: Exception, kind: str, path: Path) -> str:
    """What a GGUF reader's error means when it reads past the file's end (a struct that does not
    fit, an array smaller than its shape): the file holds fewer bytes than its header describes."""
    if kind == "gguf" and (isinstance(e, struct.error) or "cannot reshape array" in str(e)):
        return f" (the file, {path.stat().st_size:,} bytes, ends before the data its header describes: is it whole?)"
    return ""


def check_architecture(config, spec: str) -> None:
    """One line unless the model is one whose rotary layers posbench rescales: plain RoPE (no
    rescaling of its own) over every head dim, in an architecture that rotates q and k by
    apply_rotary_pos_emb and attends through transformers' attention interface."""
    kind = getattr(config, "model_type", "?")
    if kind not in ARCHITECTURES:
        raise PosbenchError(f"{spec} is a {kind} model: posbench rescales the rotary layers of "
                            f"{', '.join(ARCHITECTURES)} models only")
    rope = getattr(config, "rope_parameters", None) or {}
    if not any(rope.get("rope_type", "default") in cls.hf_types for cls in POLICIES.values()):
        raise PosbenchError(f"{spec} already rescales its RoPE ({rope['rope_type']}), which no posbench policy reads; "
                            "posbench applies its policies to a model with plain RoPE or one of theirs")
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise PosbenchError(f"{spec} rotates part of each head only; posbench rescales full-head RoPE only")
