"""What `--resume` keeps of a pretrained model's probe: its cells in probes.csv and its prompts'
verdicts in prompts.csv, each prompt merged as it is judged.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path


from posbench import results
from posbench.progress import Bar
from posbench.probing import kept_rows, same_prompts

__all__ = ["judge_prompt", "kept_prompts", "kept_rows", "prompt_sha"]


def prompt_sha(item) -> str:
    """A fingerprint of one prompt as judged (its text or tokens and its answers)."""
    return hashlib.sha256(repr(item).encode()).hexdigest()[:16]


def judge_prompt(out: Path, where: dict, index: int, item, verdicts, done: dict[tuple, dict], bar: Bar) -> list[bool]:
    """The verdicts on prompt `index` of the cell `where` (its prompts.csv columns): kept from
    `done` (`kept_prompts`) when it holds this very prompt, else judged and merged into
    out/prompts.csv at once, so that an interruption loses at most the prompt in progress."""
    sha, label = prompt_sha(item), where["variant"]
    old = done.get((where["scaling"], where["eval_len"], label, index))
    kept = old is not None and old["prompt_sha"] == sha
    if kept:
        said = [v == "y" for v in old["verdicts"]]
    else:
        began = time.perf_counter()
        said = verdicts(item)
        results.merge_rows(out, "prompts", [{
            **where, "prompt": index, "prompt_sha": sha, "answers": len(said), "hits": sum(said),
            "verdicts": "".join("y" if v else "n" for v in said), "seconds": round(time.perf_counter() - began, 1),
            "created": results.stamp()}])
    bar.step(f"{label} {sum(said)}/{len(said)} right{', kept' if kept else ''}".strip())
    return said


def kept_prompts(out: Path, base_row: dict) -> dict[tuple, dict]:
    """out/prompts.csv's rows of this model, probe, prompt spec and seed, by (policy, length,
    variant, prompt index): the prompts `--resume` does not judge again (if the prompt is the same)."""
    return {(r["scaling"], int(r["eval_len"]), r["variant"], int(r["prompt"])): r
            for r in results.read_rows(results.table_path(out, "prompts")) if same_prompts(r, base_row)}
