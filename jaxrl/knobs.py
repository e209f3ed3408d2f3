"""A config key declared once: its dotted key, default, one line of help, whether a sweep may trace it, and
the values it accepts. Everything else is read from the declaration:

    class ReplaySettings:
        buffer_size: int = knob("replay.buffer_size", 50_000, "env steps kept per run, over all its envs",
                                minimum=1)

- `defaults(*declarations)`: the config section with every declared key at its default (`fill`: the keys a
  config lacks);
- `read(cls, config, **derived)`: a settings (or hyperparameters) object, each field from its key;
- `check_config(config)`: every declared key the config holds, its bounds and choices: one ValueError naming
  the key, before anything compiles (`jaxrl.algos.validate`; `check(config, *declarations)` for some only);
- `traced_keys(cls)`: the keys a sweep varies inside one compiled program (the hyperparameters');
- `DECLARED`: key -> its declaration, for `docs/config.md` (`python -m jaxrl.run.config_reference`).

A declaration is a `Knob` (a value: module-level when several classes read the same key) or the dataclass field
that `knob(...)` / `Knob.field()` makes. One key, one declaration: declaring a key twice with different
defaults, help or bounds is an error at import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable

from ml_collections import ConfigDict

FIELD_METADATA = "jaxrl_knob"


@dataclasses.dataclass(frozen=True)
class Knob:
    """One config key. `minimum`/`maximum` are inclusive bounds, `above`/`below` exclusive ones; `choices` the
    accepted values (for a comma-separated list: `each_of`); `accepts` any other check, `rule` its words;
    `convert` turns the config value into the field's (e.g. a weight decay > 0 into the static choice to decay)."""

    key: str
    default: Any
    help: str
    traced: bool = False
    choices: tuple | Callable[[], Iterable] = ()  # a callable: a registry's names as they are when checked
    each_of: bool = False  # the value is a comma-separated list of `choices`
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    rule: str = ""  # what `accepts` checks, in words ("positive integers, e.g. (64, 64)")
    accepts: Callable[[Any], bool] | None = dataclasses.field(default=None, compare=False)
    convert: Callable[[Any], Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not self.help or "\n" in self.help:
            raise ValueError(f"knob {self.key!r}: help must be one line")
        if (self.accepts is None) != (not self.rule):
            raise ValueError(f"knob {self.key!r}: a rule needs both its check (accepts) and its words (rule)")
        _register(self)

    def field(self, convert: Callable[[Any], Any] | None = None):
        """A dataclass field that reads this knob (with `convert` when this class holds it otherwise)."""
        return _field(dataclasses.replace(self, convert=convert) if convert else self)

    def only(self, value: Any, why: str) -> "Only":
        """A family's narrower rule on this shared key: it takes `value` alone, for the reason `why`."""
        return Only(self, value, why)

    def value_of(self, config: ConfigDict) -> Any:
        """The config's value of this key, as a settings field holds it."""
        value = get_value(config, self.key)
        return self.convert(value) if self.convert else value

    def value_or_default(self, config: ConfigDict) -> Any:
        """`value_of`, or the default where `config` lacks the key (a run's config saved before it was declared)."""
        section, name = _holder(config, self.key)
        value = section[name] if section is not None and name in section else self.default
        return self.convert(value) if self.convert else value

    def check(self, value: Any) -> None:
        """Raise ValueError naming the key unless `value` is one this knob accepts."""
        known = self.known()
        if known:
            for item in ([v.strip() for v in value.split(",")] if self.each_of else [value]):
                if item not in known:
                    raise ValueError(f"unknown config.{self.key} {item!r}; known: {', '.join(map(str, known))}")
        if _is_int(self.default) and not _is_int(value):
            raise ValueError(f"config.{self.key} must be an integer, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isnan(value) or not self._in_bounds(value):
                bounds = self.bounds()
                verb = "lie" if bounds.startswith("in ") else "be"
                raise ValueError(f"config.{self.key} must {verb} {bounds}, got {value!r}")
        if self.accepts is not None and not self.accepts(value):
            raise ValueError(f"config.{self.key} must be {self.rule}, got {value!r}")

    def known(self) -> tuple:
        """The accepted values (of a registry, as it is now), or () when any value of the type is."""
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def _in_bounds(self, value: float) -> bool:
        return ((self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)
                and (self.above is None or value > self.above) and (self.below is None or value < self.below))

    def bounds(self) -> str:
        """The accepted values in words, e.g. "in [0, 1]" or "> 0"; "" when any value of the type is."""
        if self.rule:
            return self.rule
        if self.known():
            return ("a comma-separated list of " if self.each_of else "one of ") + ", ".join(map(str, self.known()))
        if _is_int(self.default) and self.minimum == 1 and self.maximum is None:
            return "a positive integer"
        low = self.minimum if self.minimum is not None else self.above
        high = self.maximum if self.maximum is not None else self.below
        if low is not None and high is not None:
            return f"in {'[' if self.above is None else '('}{low:g}, {high:g}{']' if self.below is None else ')'}"
        if self.above is not None:
            return f"> {self.above:g}"
        if self.minimum is not None:
            return f">= {self.minimum:g}"
        if self.maximum is not None:
            return f"<= {self.maximum:g}"
        if self.below is not None:
            return f"< {self.below:g}"
        return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


DECLARED: dict[str, Knob] = {}


def _identity(declared: Knob) -> tuple:
    """What two declarations of one key must share: everything but how a class converts the value."""
    return tuple(getattr(declared, f.name) for f in dataclasses.fields(declared) if f.name != "convert")


def _register(declared: Knob) -> None:
    known = DECLARED.get(declared.key)
    if known is not None and _identity(known) != _identity(declared):
        raise ValueError(f"config key {declared.key!r} is declared twice, differently: {known} and {declared}")
    DECLARED.setdefault(declared.key, declared)


def _field(declared: Knob):
    default = declared.default
    if isinstance(default, (list, dict, set)):
        raise TypeError(f"knob {declared.key!r}: a mutable default; use a tuple")
    if declared.convert is not None:
        default = declared.convert(default)
    return dataclasses.field(default=default, metadata={FIELD_METADATA: declared})


def knob(key: str, default: Any, help: str, **accepts) -> Any:
    """Declare config key `key` as a dataclass field (see `Knob` for `accepts`: traced, choices, minimum,
    maximum, above, below, convert)."""
    return _field(Knob(key, default, help, **accepts))


def knobs_of(*declarations: Knob | type) -> dict[str, Knob]:
    """key -> Knob for knobs and for every knob field of dataclasses (settings, hyperparameters), in order."""
    found: dict[str, Knob] = {}
    for item in declarations:
        for declared in [item] if isinstance(item, Knob) else fields_of(item).values():
            found.setdefault(declared.key, declared)
    return found


def fields_of(cls: type) -> dict[str, Knob]:
    """field name -> the Knob it reads, for a dataclass's knob fields."""
    return {f.name: f.metadata[FIELD_METADATA] for f in dataclasses.fields(cls) if FIELD_METADATA in f.metadata}


def get_value(config: ConfigDict, key: str) -> Any:
    """The value of a dotted key, e.g. get_value(config, "optim.learning_rate")."""
    for part in key.split("."):
        config = config[part]
    return config


def defaults(*declarations: Knob | type) -> ConfigDict:
    """A config holding every declared key at its default (nested by the dots of the keys)."""
    return fill(ConfigDict(), *declarations)


def _holder(config: ConfigDict, key: str, create: bool = False) -> tuple[ConfigDict | None, str]:
    """(the section that holds `key`'s last part, that part); the section is None where the config lacks one
    (`create`: made, empty)."""
    *parents, name = key.split(".")
    section = config
    for parent in parents:
        if create and parent not in section:
            section[parent] = ConfigDict()
        section = section.get(parent) if isinstance(section, ConfigDict) else None
    return (section if isinstance(section, ConfigDict) else None), name


def _config_value(default: Any) -> Any:
    return ConfigDict(default) if isinstance(default, dict) else default


def fill(config: ConfigDict, *declarations: Knob | type) -> ConfigDict:
    """Add every declared key that `config` lacks, at its default; the keys it has keep their values (a family's
    own defaults, set before). Returns `config`."""
    with config.unlocked():
        for key, declared in knobs_of(*declarations).items():
            section, name = _holder(config, key, create=True)
            if name not in section:
                section[name] = _config_value(declared.default)
    return config


def read(cls: type, config: ConfigDict, **derived):
    """`cls(...)` with each knob field read from `config` (converted as declared) and the other fields from
    `derived` (or their defaults)."""
    values = {name: declared.value_of(config) for name, declared in fields_of(cls).items()}
    return cls(**values, **derived)


def check(config: ConfigDict, *declarations: Knob | type) -> None:
    """Every declared key's value accepted (`Knob.check`), in declaration order; ValueError naming the first
    that is not."""
    for key, declared in knobs_of(*declarations).items():
        declared.check(get_value(config, key))


def check_config(config: ConfigDict) -> None:
    """Every declared key that `config` holds accepted (`Knob.check`); ValueError naming the first that is not.
    A key has one declaration, so whichever family's config holds it, the same rule applies."""
    for key, declared in DECLARED.items():
        section, name = _holder(config, key)
        if section is not None and name in section:
            declared.check(section[name])


def traced_keys(cls: type) -> dict[str, str]:
    """field name -> config key of a hyperparameter class's traced knobs (a sweep varies them in one program)."""
    return {name: declared.key for name, declared in fields_of(cls).items() if declared.traced}


def declared(key: str) -> Knob:
    """The declaration of `key` (to read it into a field of another class: `declared(key).field()`)."""
    if key not in DECLARED:
        raise KeyError(f"config key {key!r} is not declared (jaxrl.knobs)")
    return DECLARED[key]


@dataclasses.dataclass(frozen=True)
class Only:
    """A shared key that one family takes at one value alone (`Knob.only`: env GRPO's groups never auto-reset,
    so its env.reset_ratio stays 1), declared beside the family's keys; the family's check applies it."""

    knob: Knob
    value: Any
    why: str

    def check(self, config: ConfigDict) -> None:
        value = get_value(config, self.knob.key)
        if value != self.value:
            raise ValueError(f"config.{self.knob.key} = {value!r}: {self.why} (leave it {self.value!r})")
