"""Result files: long-format CSV, one row per observation, columns declared once here.

Writes are atomic (a temp file unique to the writer, then one rename; merges under a lock) and
merges are keyed: writing a row whose key is already present replaces it, so an interrupted or
repeated run never loses or duplicates rows. Temp files are hidden (`.NAME.tmp-PID-RANDOM`), so a
kill leaves nothing a reader picks up, and whoever next takes the lock removes them.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import io
import json
import os
import platform
import secrets
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import posbench
from posbench import machine
from posbench.errors import PosbenchError, naming

# `machine` and `machine_detail`: what the numbers' bits depend on beyond the run_id (posbench.machine).
PROVENANCE = ["device", "dtype", "torch", "posbench", "git_sha", "python", "corpus", "created", "machine",
              "machine_detail"]
MACHINE = {"machine", "machine_detail"}
POLICY_SHA = "policy_sha256"  # the sha256 of the plug-in file of a row's eval-time policy ("" for a built-in)

TABLES: dict[str, dict[str, list[str]]] = {
    "runs": {
        "key": ["run_id"],
        "columns": ["run_id", "task", "scheme", "params", "seed", "train_len", "randomized",
                    "steps", "stopped_at", "tokens", "scored_tokens", "padding_tokens", "n_params",
                    "final_train_loss", "final_val_loss", "final_val_accuracy",
                    "unigram_val_loss", "train_seconds", "tokens_per_second",
                    "model_flops_per_second", "mfu", "mfu_peak", "backend", "compile", "ensemble", "status",
                    "message", "parent_run", "extend_method", "extend_len", "extend_steps", "plugins",
                    "weights_sha256", "d_model", "n_layers", "n_heads", "lr", "non_embedding_params"] + PROVENANCE,
    },
    "extrapolation": {
        "key": ["run_id", "eval_len", "mode", "stride", "scaling", "extension"],
        "columns": ["run_id", "task", "scheme", "params", "seed", "train_len", "eval_len", "ratio",
                    "mode", "stride", "scaling", "extension", "position_draws", "tokens", "loss",
                    "ppl", "loss_se", "ppl_lo", "ppl_hi", "key_ppl", "key_share", "key_tokens", "backend", "status",
                    "reason", "parent_run", "extend_method", "extend_len", "extend_steps", "position_sampling"] + PROVENANCE
                   + [POLICY_SHA],
    },
    # Each scored window's mean loss: what posbench.pairing pairs between two models.
    "windows": {
        "key": ["run_id", "eval_len", "mode", "stride", "scaling", "extension", "window"],
        "columns": ["run_id", "task", "scheme", "params", "seed", "train_len", "eval_len", "mode",
                    "stride", "scaling", "extension", "position_draws", "corpus", "window", "start",
                    "loss", "parent_run", "extend_method", "extend_len", "extend_steps", "position_sampling"],
    },
    "positions": {
        "key": ["run_id", "eval_len", "mode", "stride", "scaling", "extension", "bucket"],
        "columns": ["run_id", "scheme", "train_len", "eval_len", "mode", "stride", "scaling",
                    "extension", "bucket", "position_start", "position_end", "tokens", "loss"],
    },
    "probes": {
        "key": ["run_id", "probe", "eval_len", "variant", "scaling", "extension"],
        "columns": ["run_id", "task", "probe", "spec", "scheme", "params", "seed", "train_len",
                    "eval_len", "ratio", "variant", "trials", "position_draws", "answers", "hits",
                    "accuracy", "acc_lo", "acc_hi", "exact", "exact_match", "em_lo", "em_hi", "chance",
                    "scaling", "extension", "backend", "status",
                    "reason", "parent_run", "extend_method", "extend_len", "extend_steps",
                    "position_sampling"] + PROVENANCE + [POLICY_SHA],
    },
    # One row per prompt of a probe, trained run or pretrained model (posbench.probing.Verdicts): its
    # verdict per answer (`verdicts`: y or n each; a randomized run's, each position draw's in turn),
    # written as the prompts are judged, so that `--resume` reads again only the prompts an
    # interruption lost, and policies can be paired prompt by prompt. `prompt_sha` fingerprints the
    # prompt: a kept verdict is for the same prompt.
    "prompts": {
        "key": ["run_id", "probe", "spec", "seed", "eval_len", "variant", "scaling", "extension", "prompt"],
        "columns": ["run_id", "task", "probe", "spec", "scheme", "seed", "train_len", "eval_len", "variant",
                    "scaling", "extension", "prompt", "prompt_sha", "answers", "hits", "verdicts", "seconds", "backend",
                    "device", "dtype", "git_sha", "created", "machine"],
    },
    # Per run and protocol (perplexity: mode and stride; accuracy: the probe), the longest length
    # from the training length up whose value stays within `criterion` (posbench.effective). The
    # criterion is part of the key: `extrapolate --tolerance 0.2` and a later report at the default
    # 0.1 each keep their rows.
    "effective_length": {
        "key": ["run_id", "metric", "protocol", "scaling", "extension", "criterion"],
        "columns": ["run_id", "task", "scheme", "params", "seed", "train_len", "metric", "protocol", "basis",
                    "scaling", "extension", "position_draws", "reference", "criterion", "max_len",
                    "effective_len", "ratio", "status", "parent_run", "extend_method", "extend_len",
                    "extend_steps", "position_sampling"] + PROVENANCE,
    },
    # Per layer and head, what attention does at each length (posbench.attention_measures).
    "attention": {
        "key": ["run_id", "eval_len", "mode", "stride", "scaling", "extension", "layer", "head"],
        "columns": ["run_id", "task", "scheme", "params", "seed", "train_len", "eval_len", "ratio", "mode",
                    "stride", "scaling", "extension", "position_draws", "layer", "head", "windows",
                    "entropy", "entropy_norm", "distance", "sink_mass", "far_mass", "far_from", "backend",
                    "parent_run", "extend_method", "extend_len", "extend_steps", "position_sampling"] + PROVENANCE,
    },
    "speed": {
        "key": ["scheme", "backend", "compile", "pass", "device", "device_name", "dtype", "batch", "heads",
                "head_dim", "seq_len"],
        "columns": ["scheme", "backend", "compile", "pass", "device", "device_name", "dtype", "batch", "heads",
                    "head_dim", "seq_len", "median_ms", "iqr_ms", "tflops", "tokens_per_second",
                    "peak_mem_mb", "ratio_vs_none", "status", "reason", "torch", "posbench",
                    "git_sha", "created"],
    },
}


# Columns an older posbench did not write yet: a file may lack these (they read as empty), never
# the others, without which its rows mean nothing (a merge of such a file would add junk rows).
EXTENSION = {"parent_run", "extend_method", "extend_len", "extend_steps"}  # posbench.extension's columns
SIZE = {"d_model", "n_layers", "n_heads", "lr", "non_embedding_params"}  # what a scaling axis reads
SAMPLING = "position_sampling"  # `float` in the rows of an RFS run (posbench.positions)
ADDED_LATER: dict[str, set[str]] = {
    "runs": {"model_flops_per_second", "mfu", "mfu_peak", "compile", "ensemble", "stopped_at", "final_val_accuracy", "plugins",
             "scored_tokens", "padding_tokens", "weights_sha256", *EXTENSION, *MACHINE, *SIZE},
    "extrapolation": {"position_draws", "loss_se", "ppl_lo", "ppl_hi", "key_ppl", "key_share", "key_tokens", SAMPLING,
                      *EXTENSION, *MACHINE, POLICY_SHA},
    "windows": {"params", "position_draws", SAMPLING, *EXTENSION},
    "positions": {"train_len"},
    "probes": {"acc_lo", "acc_hi", "answers", "exact", "exact_match", "em_lo", "em_hi", "chance", SAMPLING,
               *EXTENSION, *MACHINE, POLICY_SHA},
    "effective_length": {"position_draws", "basis", SAMPLING, *EXTENSION, *MACHINE},
    "attention": {SAMPLING},
    "prompts": {"extension"},
    "speed": {"device_name", "compile"},
}

# What a cell of these columns holds, in every table that has them (other columns are text). An
# empty cell is allowed (a failed run has no loss); nan and inf are numbers (a diverged loss).
INTEGERS = {"d_model", "n_layers", "n_heads", "non_embedding_params",
            "seed", "train_len", "steps", "tokens", "n_params", "eval_len", "stride", "position_draws",
            "window", "start", "bucket", "position_start", "position_end", "trials", "hits", "max_len",
            "effective_len", "batch", "heads", "head_dim", "seq_len", "stopped_at", "answers", "exact", "extend_len",
            "extend_steps", "scored_tokens", "padding_tokens", "layer", "head", "windows", "far_from",
            "key_tokens", "prompt"}
NUMBERS = {"lr", "seconds", "final_train_loss", "final_val_loss", "unigram_val_loss", "train_seconds", "tokens_per_second",
           "model_flops_per_second", "mfu", "ratio", "loss", "ppl", "loss_se", "ppl_lo", "ppl_hi",
           "accuracy", "acc_lo", "acc_hi", "reference", "criterion", "median_ms", "iqr_ms", "tflops",
           "peak_mem_mb", "ratio_vs_none", "final_val_accuracy", "exact_match", "em_lo", "em_hi", "chance",
           "entropy", "entropy_norm", "distance", "sink_mass", "far_mass", "key_ppl", "key_share"}


# The `reason` of a pretrained row scored once for two policies (`posbench table pretrained` stars it).
SHARED = "same frequencies as"


def shared_note(label: str) -> str:
    """The `reason` of a row whose policy reads the frequencies of `label` at its length."""
    return f"{SHARED} {label} at this length: scored once"


# A pretrained model's rows are keyed kind:name@sha256 (posbench.pretrained), kind one of these.
MODEL_KINDS = ("hf", "gguf")


def of_model(row: dict) -> bool:
    """Whether a row is a pretrained model's (not a trained run's)."""
    return row["run_id"].partition(":")[0] in MODEL_KINDS


def _check_cell(path: Path, line: int, column: str, value: str) -> None:
    kind = int if column in INTEGERS else float if column in NUMBERS else None
    if kind is None or value == "":
        return
    try:
        kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise PosbenchError(f"{path} is damaged: line {line} has {column} {value!r}, not {what}") from None


def table_path(directory: Path | str, table: str) -> Path:
    return Path(directory) / f"{table}.csv"


def check_folder(directory: Path | str) -> None:
    """A results folder before anything is computed for it (a model loaded, a prompt judged): a
    folder or none yet, under folders, and every table in it readable (one line otherwise), so a
    command that would be refused at its first write is refused at once."""
    directory = Path(directory)
    for place in (directory, *directory.parents):
        if place.exists():
            if not place.is_dir():
                raise PosbenchError(f"{place} exists and is not a directory")
            break
    for table in TABLES:
        read_rows(table_path(directory, table))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if value is None:
        return ""
    return str(value)


@contextlib.contextmanager
def _flock(lock_path: Path, wait: bool = True):
    """Hold an exclusive lock on lock_path; without `wait`, BlockingIOError if another holds it.
    The holder's pid is written into the file for the message of whoever finds it taken."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            with naming(lock_path):
                lock.seek(0)
                lock.truncate()
                lock.write(f"{os.getpid()}\n")
                lock.flush()
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _locked(path: Path):
    with _flock(path.parent / f".{path.name}.lock"):
        remove_stale_temps(path.parent, path.name)
        yield


@contextlib.contextmanager
def claim(directory: Path, what: str, setup: tuple[str, ...] = ()):
    """Hold `directory` for one writer: a second process gets one clear line instead of writing
    into the same files. Temp files a killed writer left there are removed. A directory this call
    created is removed again when the work fails before writing a file into it other than the
    `setup` files (a run's config.json), and so are the folders above it that it made (a runs
    folder named for the first time): a full disk, a folder that cannot be written, bad input,
    Ctrl-C leave no run directory behind."""
    lock_path = directory / ".lock"
    created = not directory.exists()
    made_above = [p for p in directory.parents if not p.exists()]  # nearest first
    try:
        with _flock(lock_path, wait=False):
            remove_stale_temps(directory)
            yield
    except BlockingIOError:
        holder = lock_path.read_text().strip() or "unknown"
        raise PosbenchError(f"{what} is in use by another process (pid {holder}); "
                            "wait for it to finish, then run again with --resume") from None
    except BaseException:
        # the directory may never have been made (a read-only parent): the first error is the one to tell
        if created and directory.is_dir() and {p.name for p in directory.iterdir()} <= {".lock", *setup}:
            for name in (".lock", *setup):
                (directory / name).unlink(missing_ok=True)
            directory.rmdir()
            for parent in made_above:
                if not parent.is_dir() or any(parent.iterdir()):
                    break
                parent.rmdir()
        raise


TEMP_MARK = ".tmp-"


def remove_stale_temps(directory: Path, name: str = "*") -> None:
    """Remove temp files of `name` left in `directory` by a killed writer (call under the lock
    that every writer of those files takes)."""
    for stale in directory.glob(f".{name}{TEMP_MARK}*"):
        stale.unlink(missing_ok=True)


def read_rows(path: Path | str, table: str | None = None, required: Iterable[str] = ()) -> list[dict[str, str]]:
    """The rows of a CSV file ([] when it does not exist).

    A file of one of TABLES (named by `table`, or by its file name, e.g. runs.csv) is checked
    before anything is merged into it or read from it: its header must hold the table's columns
    (but those of ADDED_LATER, which a file an older posbench wrote lacks and which read as empty)
    and `required` ones and no column the table does not declare, every row must have the header's
    number of fields, every number column a number (INTEGERS, NUMBERS), and the file must end with
    a newline (a truncated file usually does not).
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
            rows = list(csv.DictReader(io.StringIO(text), strict=True))  # a quoted cell cut short: an error
    except (UnicodeDecodeError, csv.Error) as e:
        raise PosbenchError(f"{path} is not a readable CSV file: {e}") from None
    table = table or (path.stem if path.stem in TABLES else None)
    if table is None:
        return rows
    if not text.strip():
        raise PosbenchError(f"{path} is empty: not a posbench {table} table")
    columns = TABLES[table]["columns"]
    header = next(csv.reader(io.StringIO(text)))
    core = [c for c in columns if c not in ADDED_LATER.get(table, ())]
    missing = [c for c in dict.fromkeys((*core, *required)) if c not in header]
    foreign = [c for c in header if c not in columns]
    if missing or foreign:
        what = f"lacks columns {', '.join(missing)}" if missing else f"has columns {', '.join(foreign)}"
        raise PosbenchError(f"{path} is not a posbench {table} table: it {what}")
    if text and not text.endswith("\n"):
        raise PosbenchError(f"{path} is truncated: its last line is incomplete")
    for i, row in enumerate(rows, start=2):
        if None in row or None in row.values():
            raise PosbenchError(f"{path} is damaged: line {i} does not have the {len(header)} fields of the header")
        for column, value in row.items():
            _check_cell(path, i, column, value)
    return [{c: row.get(c, "") for c in columns} for row in rows]


def read_probes(directory: Path | str) -> list[dict[str, str]]:
    """probes.csv, with the rows of a passkey.csv written before probes.csv existed (one row per
    run x length x depth, the passkey probe's rows under other names) where probes.csv has none."""
    rows = read_rows(table_path(directory, "probes"))
    have = {tuple(r[k] for k in TABLES["probes"]["key"]) for r in rows}
    for old in read_rows(table_path(directory, "passkey")):
        row = {**old, "probe": "passkey", "spec": "passkey", "variant": f"depth={float(old['depth']):g}"}
        if tuple(row.get(k, "") for k in TABLES["probes"]["key"]) not in have:
            rows.append({c: row.get(c, "") for c in TABLES["probes"]["columns"]})
    return rows


def write_atomic(path: Path, content: str | bytes) -> None:
    """Replace `path` in one rename by a temp file beside it, unique to this process and call; on
    an error the temp is removed and `path` is untouched. The file gets mode 0666 less the umask,
    like any other file the user writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with naming(path), open(tmp, "xb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_figure(fig, path: Path | str, dpi: int) -> Path:
    """A matplotlib figure written as PNG to `path`, then closed; a full disk names the file."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with naming(path):
            fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def merge_rows(directory: Path | str, table: str, rows: Iterable[dict[str, Any]]) -> Path:
    """Insert or replace `rows` (by the table's key) in directory/table.csv."""
    spec = TABLES[table]
    columns, key = spec["columns"], spec["key"]
    path = table_path(directory, table)
    new = [{c: _fmt(row.get(c)) for c in columns} for row in rows]
    unknown = {k for row in rows for k in row} - set(columns)
    assert not unknown, f"columns not declared for {table}: {unknown}"
    with _locked(path):
        merged = {tuple(r.get(k, "") for k in key): r for r in read_rows(path)}
        for row in new:
            merged[tuple(row[k] for k in key)] = row
        write_atomic(path, _to_csv(columns, merged.values()))
    return path


def failed_line(rows: list[dict], table: Path, noun: str = "row",
                place=lambda r: f"{r['run_id']} at {r['eval_len']}", owner: str = "run_id") -> str | None:
    """One line on the rows of `rows` whose status is `failed` (None when none is): how many, the
    first six places (`place` names one: an evaluation row's run and length by default), where they
    are recorded, and the first one's reason under its `owner` column."""
    failed = [r for r in rows if r.get("status") == "failed"]
    if not failed:
        return None
    where = sorted({place(r) for r in failed})
    first = failed[0]
    return (f"{len(failed)} {noun}(s) failed ({', '.join(where[:6])}{', ...' if len(where) > 6 else ''}), recorded as "
            f"failed in {table}; the other {noun}s were written. {first[owner]}: {first.get('reason') or 'non-finite loss'}")


def _to_csv(columns: list[str], rows) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c, "") for c in columns})
    return buf.getvalue()


@functools.cache
def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def read_provenance(directory: Path | str) -> dict:
    """A results folder's provenance.json ({} where it has none, or one that is not a JSON object)."""
    path = Path(directory) / "provenance.json"
    try:
        prov = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}
    return prov if isinstance(prov, dict) else {}


def check_provenance(directory: Path | str) -> None:
    """One line, before anything is merged into `directory`, where its provenance.json exists but is
    not one posbench can add a `merged` entry to (not a JSON object, or its `merged` not a list)."""
    path = Path(directory) / "provenance.json"
    if not path.exists():
        return
    try:
        prov = json.loads(path.read_text())
    except ValueError as e:
        raise PosbenchError(f"{path} is not JSON ({e}); move it aside to merge into {directory}") from None
    if not isinstance(prov, dict) or not isinstance(prov.get("merged", []), list):
        raise PosbenchError(f"{path} is not a provenance record (a JSON object whose `merged` is a list); "
                            f"move it aside to merge into {directory}")


# what a merged folder's provenance.json says made it, kept in the folder it is merged into
MADE_BY = ("command", "task", "shard", "machine", "git_sha", "created", "merged")


def record_merge(directory: Path | str, source: Path | str, rows: dict[str, int]) -> None:
    """Add to directory/provenance.json's `merged` list what `posbench report --merge` brought in:
    the folder as named, what made it (its own provenance.json's command, task, shard, machine
    kind, commit, date and the folders merged into it, where it has them), the rows it brought to
    each table, and when. Checked first by check_provenance."""
    made = read_provenance(source)
    entry = {"folder": str(source), **{k: made[k] for k in MADE_BY if k in made}, "rows": rows,
             "when": stamp()}
    path = Path(directory) / "provenance.json"
    with _locked(path):
        prov = read_provenance(directory)
        prov["merged"] = [*prov.get("merged", []), entry]
        write_atomic(path, json.dumps(prov, indent=1) + "\n")


def write_provenance(directory: Path | str, prov: dict) -> None:
    """directory/provenance.json for a grid run into it: `prov`, with the folders merged into it
    before kept."""
    path = Path(directory) / "provenance.json"
    with _locked(path):
        if "merged" in (before := read_provenance(directory)):
            prov = {**prov, "merged": before["merged"]}
        write_atomic(path, json.dumps(prov, indent=1) + "\n")


def stamp() -> str:
    """Now, in UTC, as result rows and provenance.json write it (2026-12-06T14:48:09Z)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance(device: str, dtype: str, corpus: str = "") -> dict[str, str]:
    import torch

    return {
        "device": device,
        "dtype": dtype,
        "torch": torch.__version__,
        "posbench": posbench.__version__,
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "corpus": corpus,
        "created": stamp(),
        **machine.current(device).columns(),
    }
