"""Layouts (posbench/docs/layouts.md): what each layer of the model does: its scheme (with its parameters),
its attention span and its temperature. A pattern of layers repeats to the model's depth (and is
cut where the depth ends). The model asks the layout; it knows no particular scheme.

A layout is named by a scheme (the one-scheme layout: today's model), by a preset, or by a spec:

    spec    := layer ("/" layer)*
    layer   := SCHEME (":" KEY "=" VALUE)* ["@" span] ("+" extra)* ["*" N]
    extra   := (TEMPERATURE | MODIFIER) (":" KEY "=" VALUE)*   (at most one temperature; each
               modifier, sink or gate (posbench.modifiers), at most once)
    span    := "full" | "w" [SIZE] | "c" [SIZE]      (window / chunk; no SIZE: train_len / 4)

or by a preset followed by modifiers (``rnope-swa+gate``), which every layer of the preset takes.

e.g. ``rope@w*3/none`` (3 RoPE layers with a sliding window, then 1 NoPE layer), ``none+logn``,
``rope+sink``, ``rope:base=10000@w16*5/rope:base=1000000``. Commas never occur in a spec, so a comma-separated
list still lists several schemes or layouts. The canonical form (parameters at their defaults
left out, repeated layers written with *N, a pattern that repeats a shorter one reduced to it)
names the layout in result rows; the same form with every size resolved enters the run_id.

Distinct (scheme, parameters) entries are built once and shared by the layers that use them.
Schemes with input or mixer hooks (absolute ones) act once, at the input; a layout may hold at
most one of them, since two input encodings would not be a layout of the model but a new scheme.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posbench import attention
from posbench.attention import FULL, Span
from posbench.errors import PosbenchError, did_you_mean
from posbench.modifiers import MODIFIERS, OutputGate, Sink
from posbench.schemes import SCHEMES, Dims, Scheme, get_scheme
from posbench.schemes.base import MAX_INT, check_number, coerce_params
from posbench.temperature import TEMPERATURES, Temperature

SPAN_FRACTION = 4  # default window and chunk: train_len // 4
MAX_LAYERS = 4096  # layers a spec may write out (repeats included): deeper than any model here
SPEC_CHARS = "/@+*:"  # a name with any of these is a spec
INPUT_HOOKS = {"input", "mixer"}

# name -> (spec, reference, what the tiny-model scaling does). Sizes left out of a spec are a
# quarter of the training length.
PRESETS: dict[str, tuple[str, str, str]] = {
    "rnope-swa": (
        "rope@w*3/none", "Yang et al. 2025, arXiv:2501.18795 (Cohere Command A)",
        "3 RoPE sliding-window layers, then 1 NoPE full layer; window train_len/4"),
    "irope": (
        "rope@c*3/none+llama4", "Llama 4 (HF modeling_llama4.py, no_rope_layers)",
        "3 RoPE chunked layers, every 4th NoPE full with the llama4 temperature; chunk and "
        "temperature floor train_len/4 (8192 each in Llama 4)"),
    "swan": (
        "none+logn/rope@w*3", "Puvvada et al. 2025, arXiv:2504.08719 (SWAN-GPT)",
        "1 NoPE full layer with logn scaling, then 3 RoPE sliding-window layers; window "
        "train_len/4"),
    "gemma3-local-global": (
        "rope@w*3/rope:base=1000000", "Gemma 3 (Gemma Team 2025, arXiv:2503.19786)",
        "Gemma 3's 5 local : 1 global becomes 3 : 1, so that a 4-layer model has a global layer; "
        "local RoPE base 1e4 with window train_len/4, global base 1e6"),
    "none+logn": ("none+logn", "Qwen; Chiang & Cholak 2022, arXiv:2202.12172",
                  "NoPE, queries scaled by max(1, log(p+1)/log(train_len))"),
    "none+ssmax": ("none+ssmax", "Nakanishi 2025, arXiv:2501.19399",
                   "NoPE, queries scaled by s_h log(n), s_h learned, 0.43 at init"),
    "rope+logn": ("rope+logn", "Qwen; Chiang & Cholak 2022, arXiv:2202.12172",
                  "RoPE, queries scaled by max(1, log(p+1)/log(train_len))"),
    "rope+ssmax": ("rope+ssmax", "Nakanishi 2025, arXiv:2501.19399",
                   "RoPE, queries scaled by s_h log(n), s_h learned, 0.43 at init"),
}


def _fmt(value: Any) -> str:
    """A value as a spec writes it: '+' separates a temperature, so 1e+20 is written 1e20."""
    return repr(value).replace("e+", "e") if isinstance(value, float) else str(value)


def _fmt_params(params: tuple[tuple[str, Any], ...]) -> str:
    return "".join(f":{k}={_fmt(v)}" for k, v in params)


@dataclass(frozen=True)
class LayerSpec:
    scheme: str
    params: tuple[tuple[str, Any], ...] = ()  # those that differ from the scheme's defaults
    span: str = "full"
    size: int = 0  # window or chunk; 0: train_len // SPAN_FRACTION
    temperature: str = "none"
    temp_params: tuple[tuple[str, Any], ...] = ()  # those that differ from the defaults
    # (name, parameters that differ from the defaults), in the order of MODIFIERS
    modifiers: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def __str__(self) -> str:
        out = self.scheme + _fmt_params(self.params)
        if self.span != "full":
            out += f"@{self.span[0]}{self.size or ''}"
        if self.temperature != "none":
            out += "+" + self.temperature + _fmt_params(self.temp_params)
        return out + "".join(f"+{name}{_fmt_params(params)}" for name, params in self.modifiers)

    def modifier(self, name: str) -> dict[str, Any] | None:
        """The modifier's parameters, defaults filled in; None when the layer has none."""
        for given, params in self.modifiers:
            if given == name:
                return {**MODIFIERS[name], **dict(params)}
        return None

    def resolve(self, train_len: int) -> LayerSpec:
        """Every size given: the defaults (a quarter of the training length) filled in."""
        quarter = max(1, train_len // SPAN_FRACTION)
        temp = dict(self.temp_params)
        if self.temperature == "llama4" and not temp.get("floor"):
            temp["floor"] = quarter
        size = self.size or (quarter if self.span != "full" else 0)
        return dataclasses.replace(self, size=size, temp_params=tuple(sorted(temp.items())))

    @property
    def span_of(self) -> Span:
        return Span(self.span, self.size) if self.span != "full" else FULL


@dataclass(frozen=True)
class Layout:
    name: str  # a scheme, a preset, or the canonical spec
    pattern: tuple[LayerSpec, ...]

    def __str__(self) -> str:
        return canonical(self.pattern)

    def resolve(self, train_len: int) -> Layout:
        return Layout(self.name, tuple(layer.resolve(train_len) for layer in self.pattern))

    def layers(self, depth: int) -> list[LayerSpec]:
        return [self.pattern[i % len(self.pattern)] for i in range(depth)]

    def plain(self) -> tuple[str, dict[str, Any]] | None:
        """(scheme, params) when this is the one-scheme layout of today's model."""
        if len(self.pattern) == 1:
            layer = self.pattern[0]
            if layer.span == "full" and layer.temperature == "none" and not layer.modifiers:
                return layer.scheme, dict(layer.params)
        return None


def canonical(pattern: tuple[LayerSpec, ...]) -> str:
    parts, i = [], 0
    while i < len(pattern):
        n = 1
        while i + n < len(pattern) and pattern[i + n] == pattern[i]:
            n += 1
        parts.append(str(pattern[i]) + (f"*{n}" if n > 1 else ""))
        i += n
    return "/".join(parts)


def is_spec(name: str) -> bool:
    return any(c in name for c in SPEC_CHARS)


def parse(name: str) -> Layout:
    """A scheme name, a preset name or a spec -> its Layout; one-line PosbenchError if malformed."""
    name = name.strip()
    if name in PRESETS:
        return Layout(name, _parse_spec(PRESETS[name][0]).pattern)
    preset, plus, extras = name.partition("+")
    if plus and preset in PRESETS:
        return _preset_with_modifiers(preset, extras)
    if not is_spec(name):
        if not name:
            raise PosbenchError("empty scheme name")
        try:
            get_scheme(name)
        except PosbenchError:
            raise did_you_mean(name, [*SCHEMES, *PRESETS], "scheme or layout") from None
        return Layout(name, (LayerSpec(name),))
    layout = _parse_spec(name)
    return Layout(str(layout), layout.pattern)


def _parse_spec(spec: str) -> Layout:
    pattern: list[LayerSpec] = []
    for part in spec.split("/"):
        layer, count = _parse_layer(part.strip(), spec)
        if len(pattern) + count > MAX_LAYERS:
            raise PosbenchError(f"layout {spec!r} writes out more than {MAX_LAYERS} layers")
        pattern += [layer] * count
    pattern = _shortest_period(pattern)
    inputs = sorted({lay.scheme for lay in pattern if INPUT_HOOKS & set(get_scheme(lay.scheme).hooks)})
    if len(inputs) > 1:
        raise PosbenchError(f"layout {spec!r} mixes input schemes {', '.join(inputs)}: "
                            "at most one scheme may act at the input")
    return Layout(spec, tuple(pattern))


def _preset_with_modifiers(preset: str, text: str) -> Layout:
    """A preset whose every layer takes the modifiers of `text` (``gate``, ``sink:init=-2+gate``)."""
    where = f"in layout {preset + '+' + text!r}"
    temperature, _, modifiers = _parse_extras(text.split("+"), where)
    if temperature != "none":
        raise PosbenchError(f"a temperature follows a layer, not a preset, {where}: write the preset's "
                            f"spec ({PRESETS[preset][0]}) with the temperature where it belongs")
    pattern = []
    for layer in _parse_spec(PRESETS[preset][0]).pattern:
        clash = {m for m, _ in layer.modifiers} & {m for m, _ in modifiers}
        if clash:
            raise PosbenchError(f"preset {preset!r} already has {', '.join(sorted(clash))} {where}")
        merged = tuple(sorted(layer.modifiers + modifiers, key=lambda m: list(MODIFIERS).index(m[0])))
        pattern.append(dataclasses.replace(layer, modifiers=merged))
        _check_modifiers(pattern[-1], where)
    name = preset + "".join(f"+{m}{_fmt_params(p)}" for m, p in modifiers)
    return Layout(name, tuple(pattern))


def _shortest_period(pattern: list[LayerSpec]) -> list[LayerSpec]:
    """a/b/a/b and a/b repeat to the same layers at every depth: keep the shorter."""
    n = len(pattern)
    for p in range(1, n):
        if n % p == 0 and pattern == pattern[:p] * (n // p):
            return pattern[:p]
    return pattern


LAYER = re.compile(r"^(?P<body>[^*]*?)(?:\*(?P<count>[^*]*))?$")
SPAN = re.compile(r"^(?:(?P<full>full)|(?P<kind>[wc])(?P<size>\d*))$")


def _parse_layer(text: str, spec: str) -> tuple[LayerSpec, int]:
    where = f"in layout {spec!r}"
    if not text:
        raise PosbenchError(f"empty layer {where} (layers are separated by single '/')")
    m = LAYER.match(text)
    if m is None:
        raise PosbenchError(f"layer {text!r} {where} has more than one '*'")
    count = 1
    if m["count"] is not None:
        if not m["count"].isdigit() or int(m["count"]) < 1:
            raise PosbenchError(f"repeat count {m['count']!r} {where} must be a positive integer")
        count = int(m["count"])
    body, *extras = m["body"].split("+")
    head, at, span_text = body.partition("@")
    if "@" in span_text:
        raise PosbenchError(f"layer {text!r} {where} has more than one span")
    scheme, params = _name_and_params(head, where)
    try:
        cls = get_scheme(scheme)
    except PosbenchError:
        raise PosbenchError(f"{did_you_mean(scheme, SCHEMES, 'scheme')} {where}") from None
    resolved = coerce_params(cls, params)
    kept = tuple(sorted((k, v) for k, v in resolved.items() if v != cls.defaults[k]))
    span, size = "full", 0
    if at:
        s = SPAN.match(span_text)
        if s is None or (s["size"] and not 1 <= int(s["size"]) <= MAX_INT):
            raise PosbenchError(f"span {span_text!r} {where}: use full, w[SIZE] or c[SIZE] "
                                f"(window or chunk of 1 <= SIZE <= {MAX_INT} tokens; no SIZE: train_len/4)")
        if not s["full"]:
            span, size = {"w": "window", "c": "chunk"}[s["kind"]], int(s["size"] or 0)
    temperature, temp_kept, modifiers = _parse_extras(extras, where)
    layer = LayerSpec(scheme, kept, span, size, temperature, temp_kept, modifiers)
    _check_modifiers(layer, where)
    return layer, count


def _parse_extras(texts: list[str], where: str):
    """What follows a layer's '+'s: (temperature, its parameters, modifiers), each parameter tuple
    holding those that differ from the defaults, the modifiers in the order of MODIFIERS."""
    temperature, temp_kept, modifiers = "none", (), {}
    for text in texts:
        name, given = _name_and_params(text, where)
        if name in TEMPERATURES:
            if temperature != "none":
                raise PosbenchError(f"{text!r} {where}: more than one temperature in a layer "
                                    f"(it already has {temperature!r})")
            temperature, temp_kept = name, _typed_params("temperature", name, TEMPERATURES[name], given, where)
        elif name in MODIFIERS:
            if name in modifiers:
                raise PosbenchError(f"{text!r} {where}: a layer takes the {name} modifier once")
            modifiers[name] = _typed_params("modifier", name, MODIFIERS[name], given, where)
        else:
            raise PosbenchError(f"{did_you_mean(name, [*TEMPERATURES, *MODIFIERS], 'temperature or modifier')} "
                                f"{where}")
    ordered = tuple((m, modifiers[m]) for m in MODIFIERS if m in modifiers)
    return temperature, temp_kept, ordered


def _typed_params(kind: str, name: str, defaults: dict[str, Any], given: dict[str, str],
                  where: str) -> tuple[tuple[str, Any], ...]:
    """`given` cast to the types of `defaults` (one-line error for an unknown key or a bad value);
    those that differ from the defaults, sorted."""
    out = {}
    for key, value in given.items():
        if key not in defaults:
            raise PosbenchError(f"{kind} {name!r} {where} has no parameter {key!r}"
                                + (f" (it takes {', '.join(defaults)})" if defaults else ""))
        what = f"parameter {key} of {kind} {name!r} {where}"
        if isinstance(defaults[key], bool):
            if value.lower() not in ("true", "false"):
                raise PosbenchError(f"{what} must be true or false, got {value!r}")
            out[key] = value.lower() == "true"
            continue
        try:
            out[key] = check_number(type(defaults[key])(check_number(float(value), what)), what)
        except ValueError:
            raise PosbenchError(f"parameter {key}={value!r} of {kind} {name!r} {where} must be a number") from None
    return tuple(sorted((k, v) for k, v in out.items() if v != defaults[k]))


def _check_modifiers(layer: LayerSpec, where: str) -> None:
    if layer.modifier("sink") is not None and "weights" in get_scheme(layer.scheme).hooks:
        raise PosbenchError(f"a sink is one more softmax column, and {layer.scheme!r} {where} replaces the "
                            "softmax (its weights hook): it takes no sink")


def _name_and_params(text: str, where: str) -> tuple[str, dict[str, str]]:
    name, *pairs = text.split(":")
    if not name:
        raise PosbenchError(f"a scheme or temperature name is missing {where}")
    params: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key or not value:
            raise PosbenchError(f"parameter {pair!r} of {name!r} {where} must be KEY=VALUE")
        params[key] = value
    return name, params


def check(name: str) -> str:
    """Raise the one-line error of a bad scheme/preset/spec; return its canonical name."""
    return parse(name).name


def recorded(name: str) -> str:
    """The name a run of `name` records in its rows and run_id: the scheme of a one-scheme spec
    (``rope:base=500`` is `rope` with a parameter), else the preset or canonical spec."""
    layout = parse(name)
    plain = layout.plain()
    return plain[0] if plain is not None else layout.name


def without_rope(name: str) -> str:
    """The scheme or layout `name` with every RoPE-family layer (rope, p-rope, resonance, rope-pp: those
    that take a RoPE scaling) replaced by NoPE, its span, temperature and modifiers kept: the
    child of a DroPE extension (posbench.extending). The recorded name: ``none`` for ``rope``."""
    parsed = parse(name)
    pattern = tuple(dataclasses.replace(lay, scheme="none", params=())
                    if hasattr(get_scheme(lay.scheme), "set_scaling") else lay for lay in parsed.pattern)
    return recorded(canonical(tuple(_shortest_period(list(pattern)))))


def run_prefix(name: str) -> str:
    """The run_id prefix of a scheme, preset or spec: itself where it is a safe file name."""
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", name)


def takes_rope_scaling(name: str) -> bool:
    """Whether a layer of scheme, preset or spec `name` takes an eval-time RoPE scaling (its scheme
    has `set_scaling`: rope, p-rope, resonance, rope-pp)."""
    return any(hasattr(get_scheme(lay.scheme), "set_scaling") for lay in parse(name).pattern)


def relative(layout: Layout) -> bool:
    """Outputs unchanged when every position shifts: relative schemes, and temperatures that do
    not read positions."""
    return all(get_scheme(lay.scheme).relative and lay.temperature in ("none", "ssmax")
               for lay in layout.pattern)


# --- the built layout ---------------------------------------------------------------------


@dataclass
class LayerPlan:
    """What one layer does in one forward: its scheme, the context shared by the layers of the
    same (scheme, span, path), the factor its queries are multiplied by (None: none), its sink
    logits (H,) and its output gate (None: none). A hook that reads the layer's input x (a
    per-token gate, the output gate) is called by the layer itself."""

    scheme: Scheme
    ctx: attention.AttnContext
    factor: torch.Tensor | None
    sink: torch.Tensor | None = None
    out_gate: OutputGate | None = None


class ModelLayout(nn.Module):
    """A layout built for a model: the distinct schemes (`schemes`, shared by their layers), one
    temperature per layer, and the modifiers of the layers that have them (`sinks`, `gates`, keyed
    by the layer's index)."""

    def __init__(self, layout: Layout, dims: Dims):
        super().__init__()
        self.spec = layout.resolve(dims.train_len)
        layers = self.spec.layers(dims.n_layers)
        keys = list(dict.fromkeys((lay.scheme, lay.params) for lay in layers))
        self.schemes = nn.ModuleList(
            get_scheme(name)(dataclasses.replace(dims, params=dict(params))) for name, params in keys)
        self.layer_scheme = [keys.index((lay.scheme, lay.params)) for lay in layers]
        self.spans = [lay.span_of for lay in layers]
        self.temperatures = nn.ModuleList(
            Temperature(lay.temperature, {**TEMPERATURES[lay.temperature], **dict(lay.temp_params)},
                        dims.n_heads, dims.train_len) for lay in layers)
        self.sinks = nn.ModuleDict({str(i): Sink(dims.n_heads, p["init"]) for i, lay in enumerate(layers)
                                    if (p := lay.modifier("sink")) is not None})
        self.gates = nn.ModuleDict({str(i): OutputGate(dims.d_model, dims.n_heads, p["elementwise"])
                                    for i, lay in enumerate(layers) if (p := lay.modifier("gate")) is not None})
        inputs = [i for i, s in enumerate(self.schemes) if INPUT_HOOKS & set(s.hooks)]
        self.input = inputs[0] if inputs else None
        for i, lay in enumerate(layers):
            if str(i) in self.gates and self.heads(i) > 1:
                raise PosbenchError(f"an output gate has one unit per head of the model, and {lay.scheme!r} attends "
                                    f"with {self.heads(i)} x n_heads heads (its heads hook): it takes no gate")

    def heads(self, layer: int) -> int:
        """m of the layer's scheme's heads hook (m H attention heads, output projection m d -> d); 1
        without it."""
        scheme = self.schemes[self.layer_scheme[layer]]
        return scheme.attention_heads() if "heads" in scheme.hooks else 1

    @property
    def owns_token_embedding(self) -> bool:
        return self.input is not None and self.schemes[self.input].owns_token_embedding

    @property
    def takes_positions(self) -> bool:
        return all(s.takes_positions for s in self.schemes)

    def embed(self, tok: nn.Embedding | None, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token embeddings (unless the input scheme builds its own), then its input and mixer
        hooks: what the first block sees, (B, T, d)."""
        for scheme in self.schemes:
            scheme.check_positions(pos)
        x = tok(idx) if tok is not None else None
        if self.input is not None:
            scheme = self.schemes[self.input]
            if "input" in scheme.hooks:
                x = scheme.embed(x, idx, pos)
            if "mixer" in scheme.hooks:
                x = scheme.mix(x)
        return x

    def backend(self, layer: int, device, forced: str | None = None) -> str:
        return forced or attention.choose_backend(self.schemes[self.layer_scheme[layer]], device,
                                                  self.spans[layer], sink=str(layer) in self.sinks)

    def backends(self, device, forced: str | None = None) -> str:
        """The paths of the layers, as result rows record them: one, or several joined by +."""
        return "+".join(dict.fromkeys(self.backend(i, device, forced) for i in range(len(self.spans))))

    def plan(self, pos: torch.Tensor, forced: str | None = None) -> list[LayerPlan]:
        """Per layer, for one forward; contexts built once per distinct (scheme, span, path): a
        sink can send a layer down another path than its neighbours of the same scheme and span."""
        shared: dict[int, Any] = {}
        contexts: dict[tuple[int, Span, str], attention.AttnContext] = {}
        plans = []
        for layer, (s, span) in enumerate(zip(self.layer_scheme, self.spans)):
            scheme = self.schemes[s]
            if s not in shared:
                shared[s] = scheme.prepare(pos)
            key = (s, span, self.backend(layer, pos.device, forced))
            if key not in contexts:
                contexts[key] = attention.prepare(scheme, pos, key[2], span, shared[s])
            factor = self.temperatures[layer].factor(pos, span)
            sink = self.sinks[str(layer)].logit if str(layer) in self.sinks else None
            gate = self.gates[str(layer)] if str(layer) in self.gates else None
            plans.append(LayerPlan(scheme, contexts[key], factor, sink, gate))
        return plans

    # What the evaluation asks of a run's schemes, answered for all of them.

    @property
    def extensions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e for s in self.schemes for e in s.extensions))

    def set_extension(self, name: str) -> None:
        if name != "none" and name not in self.extensions:
            raise PosbenchError(f"layout {self.spec.name!r} has no extension {name!r}")
        for s in self.schemes:
            s.set_extension(name if name in s.extensions else "none")

    @property
    def scalable(self) -> bool:
        """Whether any scheme takes an eval-time RoPE scaling (`set_scaling`)."""
        return any(hasattr(s, "set_scaling") for s in self.schemes)

    def set_scaling(self, scaling) -> None:
        for s in self.schemes:
            if hasattr(s, "set_scaling"):
                s.set_scaling(scaling)

    def set_trained_scaling(self, scaling) -> None:
        """The rescaling a fine-tuned child trained with (posbench.extension): its schemes that take
        a scaling apply it in training and whenever an evaluation asks for none."""
        for s in self.schemes:
            if hasattr(s, "set_trained_scaling"):
                s.set_trained_scaling(scaling)

    def position_limit(self) -> int | None:
        limits = [s.position_limit() for s in self.schemes if s.position_limit() is not None]
        return min(limits) if limits else None

    def describe(self) -> str:
        """The params column: the scheme's parameter values, or the layout with every size."""
        if self.spec.plain() is not None:
            return self.schemes[0].describe()
        return str(self.spec)


def build(name: str, dims: Dims) -> ModelLayout:
    """The layout named by a scheme, preset or spec, for a model of `dims`; a plain scheme's
    parameters come from dims.params, a layout's from its spec."""
    layout = parse(name)
    plain = layout.plain()
    if plain is not None:
        scheme, params = plain
        given = tuple(sorted({**params, **dims.params}.items()))
        return ModelLayout(Layout(layout.name, (LayerSpec(scheme, given),)), dataclasses.replace(dims, params={}))
    if dims.params:
        raise PosbenchError(f"layout {layout.name!r} takes its parameters inside its spec "
                            "(e.g. rope:base=500000@w16), not as --param")
    return ModelLayout(layout, dims)
