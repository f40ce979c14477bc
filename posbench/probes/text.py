"""The probes that read text through a pretrained model's tokenizer (`posbench probe --model`): the
natural-language passkey test and RULER's synthetic tasks. They are listed beside the symbolic
probes, which are written in posbench's symbol vocabulary for the models it trains; each probe's
`reads` says which, and a probe paired with the other kind of model is one line derived from it
(`find`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posbench import ruler
from posbench.errors import PosbenchError
from posbench.probes.base import PROBES, parse_probe, probe_name

SYMBOLS, TEXT = "symbols", "text"
READS = {SYMBOLS: "symbols, for trained runs", TEXT: "text through the model's tokenizer, for --model"}
PREFER = {SYMBOLS: "leave --model out", TEXT: "add --model"}  # what a probe that reads this asks of the command


@dataclass(frozen=True)
class TextProbe:
    """A probe a pretrained model reads as text: its name, what it asks, its reference and settings;
    `read` writes its probes.csv rows (posbench.pretrained)."""

    name: str
    summary: str
    reference: str
    settings: str
    reads: ClassVar[str] = TEXT

    def read(self, model: str, cfg, eval_cfg, lengths: tuple[int, ...], out, task: str, progress: bool, base,
             resume: bool, device, dtype: str) -> list[dict]:
        raise NotImplementedError


class NaturalPasskey(TextProbe):
    def read(self, model, cfg, eval_cfg, lengths, out, task, progress, base, resume, device, dtype):
        from posbench import pretrained

        return pretrained.passkey(model, cfg, eval_cfg, lengths, out, task, progress, base, resume, device, dtype)


class RulerTask(TextProbe):
    def read(self, model, cfg, eval_cfg, lengths, out, task, progress, base, resume, device, dtype):
        from posbench import pretrained

        return pretrained.ruler_probe(self.name, model, cfg, eval_cfg, lengths, out, task, progress, base, resume,
                                      device, dtype)


def ruler_summary(t: ruler.Task) -> str:
    """What one of RULER's tasks asks, from its declaration."""
    if t.family == "niah":
        article = "an" if t.haystack == "essay" else "a"
        return (f"needles in {article} {t.haystack} haystack: {t.keys} key(s) of {t.key}, {t.values} value(s) of "
                f"{t.value} each, {t.queries} asked for; greedy output holds every value")
    return {"vt": "variable tracking: every variable bound to a value through a chain of assignments",
            "cwe": f"common words: the {ruler.COMMON} most common words of a list",
            "fwe": "frequent words: the 3 most frequent coded words of a Zipf-distributed text"}[t.family]


TEXT_PROBES: dict[str, TextProbe] = {
    "passkey": NaturalPasskey(
        "passkey", "a 5-digit key in a key sentence at a depth of natural-language filler, asked for at the end; "
                   "greedy decoding; depths 0, 0.25, 0.5, 0.75, 1",
        "Mohtashami & Jaggi 2023; the passkey test of LongLM and YaRN", "trials, seed"),
    **{f"{ruler.PREFIX}{name}": RulerTask(f"{ruler.PREFIX}{name}", ruler_summary(t),
                                          "Hsieh et al. 2024 (RULER), scripts/synthetic.yaml", "trials, seed, ruler_essay")
       for name, t in ruler.TASKS.items()},
}


def entries(name: str) -> list:
    """The probes of that name, symbolic and text (the passkey is both); one line for a name that
    is neither, with the nearest names."""
    if ruler.is_ruler(name):
        ruler.task_of(name)
    found = [PROBES[probe_name(name)]] if probe_name(name) in PROBES else []
    found += [TEXT_PROBES[name]] if name in TEXT_PROBES else []
    if not found:
        parse_probe(name)  # did you mean ...
    return found


def find(name: str, model: bool):
    """The probe `name` for a pretrained model (`model`) or for trained runs; one line, from what
    the probe reads, when it is not for that kind of model."""
    wanted = TEXT if model else SYMBOLS
    found = entries(name)
    for entry in found:
        if entry.reads == wanted:
            if entry.reads == SYMBOLS:
                parse_probe(name)  # its options
            return entry
    other = found[0].reads
    kind = ", ".join(e.name for e in listing() if e.reads == wanted)
    raise PosbenchError(f"{name} reads {READS[other]}: {PREFER[other]}, or take a probe that reads {wanted}: {kind}")


def listing() -> list:
    """Every probe: the symbolic ones (their classes) by name, then the text ones."""
    return [*(PROBES[name] for name in sorted(PROBES)), *TEXT_PROBES.values()]
