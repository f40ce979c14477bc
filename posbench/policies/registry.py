"""The one registry of eval-time RoPE policies: name -> class. Built-ins (posbench.policies.builtins)
and plug-ins (posbench.plugins) register through the same `register`; a policy is one class that
declares its name, reference, formula, settings (defaults, ranges, help) and the hooks it changes.

A frequency policy needs one hook, `frequencies(self, inv_freq, length, train_len)` (a worked
example: posbench/docs/plugins.md, "Your own eval-time policy"). The other hooks, each with a
default that leaves the model as trained: `rope_base` (the base the frequencies are computed from:
NTK), `temperature` (a factor on cos and sin: YaRN, LongRoPE), `neighbour_window`, `far_queries`
and `far_keys` (a second position map beyond a window: Self-Extend, ReRoPE, DPE), `ready` and
`detect` (settings found at the evaluation length: DPE), `heads` (q and k of some heads replaced
after RoPE: DoPE) and `check` (what the model must offer: LongRoPE's factor count). A policy
instance is immutable and hashable: two with equal settings are equal, and `label` (the `scaling`
column) names its non-default settings.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from posbench import plugins
from posbench.errors import PosbenchError, did_you_mean
from posbench.ranges import check_ranges

POLICIES: dict[str, type["Policy"]] = {}
SETTING_TYPES = (bool, int, float, str, tuple)  # a setting's default is one of these (a tuple: of numbers)


class PolicyFailure(PosbenchError):
    """A policy's hook gave what no model can read (non-finite frequencies): a `failed` row at that
    length, not the end of the command."""


class Policy:
    """An eval-time RoPE policy with its settings `p` (the defaults updated by those given).

    Declared by the class: `name`, `reference`, `formula` (one line), `defaults` and `ranges` of
    its settings (posbench.schemes' Range helpers), `help` (one line per setting), `flags` (setting
    -> the [eval] key and flag that also sets it, e.g. alpha -> yarn_alpha), `interpolates` (it
    takes the factor s of --scaling-factor and leaves every window with s <= 1 as trained),
    `length_free` (its frequencies do not depend on the window's length), `label_all` (its label
    names every setting once any differs from its default), `hf_types` and `hf_fields` (the
    rope_type and fields transformers writes for it in a config.json's rope_scaling)."""

    name: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    formula: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    ranges: ClassVar[dict[str, Any]] = {}
    help: ClassVar[dict[str, str]] = {}
    flags: ClassVar[dict[str, str]] = {}
    interpolates: ClassVar[bool] = False
    length_free: ClassVar[bool] = False
    label_all: ClassVar[bool] = False
    internal: ClassVar[dict[str, Any]] = {}  # state a hook sets, not a setting (DPE's `detected`)
    hf_types: ClassVar[tuple[str, ...]] = ()  # transformers' rope_type(s) of this policy (posbench.policies.hf)
    hf_fields: ClassVar[dict[str, str]] = {}  # a rope_scaling field -> the setting it gives
    plugin_source: ClassVar[plugins.Source | None] = None

    def __init__(self, factor: float = 0.0, **settings: Any):
        unknown = [k for k in settings if k not in self.defaults and k not in self.internal]
        if unknown:
            raise did_you_mean(unknown[0], list(self.defaults) or ["(none)"], f"setting of policy {self.name}")
        p = {**self.defaults, **self.internal}
        for key, value in settings.items():
            p[key] = value if key in self.internal else coerce(self, key, value)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "factor", float(factor) if self.interpolates else 0.0)

    def __setattr__(self, key, value):
        raise AttributeError(f"policy {self.name} is immutable; use replace({key}=...)")

    def __getattr__(self, key: str) -> Any:  # the settings read as attributes: policy.alpha
        p = self.__dict__.get("p", {})
        if key in p:
            return p[key]
        raise AttributeError(f"policy {self.__dict__.get('name', type(self).__name__)!r} has no setting {key!r}")

    def _key(self) -> tuple:
        return (self.name, self.factor, tuple(sorted(self.p.items())))

    def __eq__(self, other) -> bool:
        return isinstance(other, Policy) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Policy({self.label})"

    def replace(self, **changes: Any) -> "Policy":
        """This policy with some settings (or `factor`) changed."""
        factor = changes.pop("factor", self.factor)
        return type(self)(factor, **{**self.p, **changes})

    def provenance(self) -> dict[str, str]:
        """The `policy_sha256` column of a row read under this policy: its plug-in file's sha256,
        "" for a built-in."""
        return {"policy_sha256": self.plugin_source.sha256 if self.plugin_source is not None else ""}

    @property
    def kind(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        """The `scaling` column: the name, the factor when given, and the settings whose value is
        not the default, e.g. yarn:4(alpha=2,beta=32), self-extend(window=16)."""
        label = self.name if self.factor <= 0 else f"{self.name}:{self.factor:g}"
        changed = [k for k in self.defaults if self.p[k] != self.defaults[k] and self.shown(k)]
        shown = list(self.defaults) if changed and self.label_all else changed
        parts = [f"{k}={_text(self.p[k])}" for k in shown]
        return label + (f"({','.join(parts)})" if parts else "")

    def shown(self, key: str) -> bool:
        """Whether a setting's non-default value names the label (a zero never does)."""
        return bool(self.p[key])

    # ---- what the engine asks of every policy --------------------------------------------------

    def scale(self, length: int, train_len: int) -> float:
        """s: the factor given, else L_eval / L_train (at least 1); 1 for a policy that does not
        interpolate."""
        if not self.interpolates:
            return 1.0
        return self.factor if self.factor > 0 else max(1.0, length / train_len)

    @property
    def fixed(self) -> bool:
        """The frequencies do not depend on the window's length (one table serves every length)."""
        return self.length_free or (self.interpolates and self.factor > 0)

    def table_key(self, length: int, train_len: int) -> Any:
        """What the frequencies at `length` depend on beside the policy: windows of equal keys share
        one table of angles."""
        if self.fixed:
            return None
        return self.scale(length, train_len) if self.interpolates else length

    @property
    def merges_maps(self) -> bool:
        """Two position maps merged in one softmax (far_queries and far_keys defined)."""
        return type(self).far_keys is not Policy.far_keys

    @property
    def masks_heads(self) -> bool:
        return type(self).heads is not Policy.heads

    @property
    def detects(self) -> bool:
        return type(self).detect is not Policy.detect

    @property
    def explicit(self) -> bool:
        """It forms the attention logits itself (the explicit attention path)."""
        return self.merges_maps or self.masks_heads

    # ---- hooks -------------------------------------------------------------------------------------

    def rope_base(self, base: float, dim: int, length: int, train_len: int) -> float:
        """The base the inverse frequencies base^(-2t/dim) are computed from (NTK grows it)."""
        return base

    def frequencies(self, inv_freq, length: int, train_len: int):
        """RoPE's inverse frequencies (dim/2,) float64 for windows of `length` tokens. A hook that
        also takes a keyword `base` is given RoPE's base (YaRN's ramp counts rotations by it)."""
        return inv_freq

    def temperature(self, length: int, train_len: int) -> float:
        """A factor on cos and sin, so on the logits squared (YaRN's 0.1 ln s + 1)."""
        return 1.0

    def check(self, pairs: int, train_len: int) -> None:
        """Refuse, in one line, a model this policy cannot read (`pairs` rotary pairs per head)."""

    def neighbour_window(self, train_len: int) -> int:
        """W: relative positions below it keep plain RoPE (a two-map policy)."""
        return max(1, train_len // 4)

    def far_queries(self, q, qpos, inv, window: int):
        """q (..., Tq, D) at positions qpos, unrotated, turned for the map beyond the window."""
        raise NotImplementedError

    def far_keys(self, k, kpos, inv):
        """k (..., Tk, D) at positions kpos, unrotated, turned for the map beyond the window."""
        raise NotImplementedError

    def ready(self, pairs: int, length: int, train_len: int) -> "Policy":
        """The policy as it reads windows of `length` (DPE: its scales set, detected or default)."""
        return self

    def detect(self, loss, pairs: int, length: int, train_len: int) -> "Policy":
        """Settings found at `length` by `loss(policy) -> float` on held-out text (DPE's scales)."""
        return self

    def heads(self, q, k, layer: int):
        """q and k (B, H, T, D) after RoPE, some heads' replaced (DoPE's noisy heads)."""
        return q, k


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return "-".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def coerce(cls, key: str, value: Any) -> Any:
    """A setting's value of its default's type (a string from the command line parsed; a tuple
    from "a-b-c" or a list), checked against its range: one line naming the policy if not."""
    default = cls.defaults[key]
    what = f"policy {cls.name}: setting {key}"
    try:
        if isinstance(default, tuple):
            items = value.split("-") if isinstance(value, str) else value
            value = tuple(float(v) for v in items if str(v).strip())
        elif isinstance(default, bool):
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int) and not (isinstance(value, float) and not value.is_integer()):
            value = int(float(value)) if isinstance(value, str) else int(value)
        elif isinstance(default, float):
            value = float(value)
    except (TypeError, ValueError):
        raise PosbenchError(f"{what} must be a {type(default).__name__}, got {value!r}") from None
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, float) and not math.isfinite(v):
            raise PosbenchError(f"{what} must be a finite number, got {v}")
        allowed = cls.ranges.get(key)
        if allowed is not None and not allowed.holds(v):
            raise PosbenchError(f"{what} must be {allowed.says}, got {v:g}" if isinstance(v, (int, float))
                                else f"{what} must be {allowed.says}, got {v!r}")
    return value


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add a policy to the registry under `cls.name`, refused in one line when its
    declaration is incomplete or clashes with one registered."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PosbenchError(f"policy class {cls.__name__} has no `name` (a string)")
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PosbenchError(f"policy {name!r} must subclass posbench.policies.Policy")
    if any(c in name for c in ",:()= "):
        raise PosbenchError(f"policy name {name!r} holds one of , : ( ) = or a space, which labels use")
    for key, value in cls.defaults.items():
        if type(value) not in SETTING_TYPES:
            raise PosbenchError(f"policy {name!r}: setting {key} has a default of type {type(value).__name__}; "
                                "settings are bool, int, float, str or a tuple of numbers")
    check_ranges(f"policy {name!r}", "settings", cls.defaults, cls.ranges)
    if cls.flags and plugins.loading() is not None:
        raise PosbenchError(f"policy {name!r} declares `flags`, the built-ins' own [eval] keys; a plug-in's settings "
                            f"are written in the spec: --rope-scaling '{name}(KEY=VALUE,...)'")
    return plugins.enter(POLICIES, "policy", name, cls)


def get_policy(name: str) -> type[Policy]:
    if name not in POLICIES:
        raise did_you_mean(name, POLICIES, "rope scaling")
    return POLICIES[name]


def make(name: str = "none", factor: float = 0.0, **settings: Any) -> Policy:
    """The policy `name` with a factor and settings; settings it does not take are ignored when
    they are None."""
    return get_policy(name)(factor, **{k: v for k, v in settings.items() if v is not None})


def where(cls, hook: str = "frequencies") -> str:
    """'plugin FILE: line N: ' of a plug-in policy's hook (its def line), '' for a built-in."""
    if cls.plugin_source is None:
        return ""
    code = getattr(getattr(cls, hook, None), "__code__", None)  # the def line, not the linecache's copy
    if code is None:
        return f"plugin {cls.plugin_source.path}: "
    return f"plugin {cls.plugin_source.path}: line {code.co_firstlineno}: "


def parse_spec(spec: str) -> tuple[str, float | None, dict[str, str]]:
    """'yarn:4(alpha=2,beta=16)' -> ('yarn', 4.0, {'alpha': '2', 'beta': '16'}): a policy written as
    its label writes it. The factor is None where not given."""
    text = spec.strip()
    settings: dict[str, str] = {}
    if text.endswith(")") and "(" in text:
        text, _, inner = text[:-1].partition("(")
        for part in inner.split(","):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise PosbenchError(f"rope scaling {spec!r}: settings are KEY=VALUE inside the parentheses, "
                                    f"got {part!r}")
            settings[key.strip()] = value.strip()
    name, colon, factor = text.partition(":")
    try:
        value = float(factor) if colon else None
    except ValueError:
        raise PosbenchError(f"rope scaling {spec!r}: the factor after ':' must be a number, got {factor!r}") from None
    return name.strip(), value, settings
