"""A config key is declared once (`jaxrl.knobs`): its default, checks, traced flag and help come from there, and
docs/config.md is generated from the declarations."""

import dataclasses

import pytest

from jaxrl import algos, config as config_lib, knobs
from jaxrl.knobs import Knob, knob
from jaxrl.run import config_reference, method_table


@dataclasses.dataclass(frozen=True)
class Example:
    size: int = knob("test_knobs.example.size", 4, "a size", minimum=1)
    rate: float = knob("test_knobs.example.rate", 0.5, "a rate", traced=True, minimum=0.0, maximum=1.0)
    decays: bool = knob("test_knobs.example.decay", 0.0, "a decay; > 0 decays", minimum=0.0, convert=lambda v: v > 0)
    mode: str = knob("test_knobs.example.mode", "a", "a mode", choices=("a", "b"))
    derived: int = 0  # not a knob: the builder computes it


def test_defaults_nest_by_the_dots_and_read_converts():
    config = knobs.defaults(Example)
    assert config.test_knobs.example.to_dict() == {"size": 4, "rate": 0.5, "decay": 0.0, "mode": "a"}
    assert Example().decays is False  # the field's default is the converted one
    config.test_knobs.example.decay = 0.1
    settings = knobs.read(Example, config, derived=7)
    assert settings == Example(size=4, rate=0.5, decays=True, mode="a", derived=7)
    assert knobs.traced_keys(Example) == {"rate": "test_knobs.example.rate"}


@pytest.mark.parametrize("key,value,message", [
    ("size", 0, "config.test_knobs.example.size must be a positive integer, got 0"),
    ("rate", 1.5, "config.test_knobs.example.rate must lie in [0, 1], got 1.5"),
    ("rate", float("nan"), "config.test_knobs.example.rate must lie in [0, 1], got nan"),
    ("mode", "c", "unknown config.test_knobs.example.mode 'c'; known: a, b"),
])
def test_check_names_the_key_and_what_it_accepts(key, value, message):
    config = knobs.defaults(Example)
    knobs.check(config, Example)  # the defaults pass
    with config.unlocked():
        config.test_knobs.example[key] = value
    with pytest.raises(ValueError) as error:
        knobs.check(config, Example)
    assert str(error.value) == message


def test_a_key_declared_twice_differently_is_refused():
    Knob("test_knobs.twice", 1, "once")
    Knob("test_knobs.twice", 1, "once")  # the same declaration again (a module imported twice) is the same knob
    with pytest.raises(ValueError, match="declared twice"):
        Knob("test_knobs.twice", 2, "once")
    with pytest.raises(ValueError, match="one line"):
        Knob("test_knobs.two_lines", 1, "first\nsecond")


def test_every_shared_key_is_declared_and_checked_before_compiling():
    config = algos.default_config("ppo")
    for declared in config_lib.SHARED_KNOBS:
        assert knobs.DECLARED[declared.key] is declared
    with config.unlocked():
        config.log.backends = "jsonl,tensorbord"
    with pytest.raises(ValueError, match="unknown config.log.backends 'tensorbord'; known: jsonl, tensorboard, wandb"):
        algos.validate(config)


def test_the_config_reference_is_fresh():
    """docs/config.md is what `python -m jaxrl.run.config_reference` writes (run it after changing a key)."""
    with open(config_reference.DEFAULT_PATH) as f:
        assert f.read() == config_reference.render(), "docs/config.md is stale: python -m jaxrl.run.config_reference"


def test_the_method_table_is_fresh_and_every_entry_holds():
    """docs/methods.md is what `python -m jaxrl.run.method_table` writes from docs/methods.json, and every entry
    holds: a Y has a config line its experiment accepts and tests that exist; the others name their issue."""
    rows = method_table.entries()
    assert method_table.problems(rows) == []
    with open(method_table.DEFAULT_PATH) as f:
        assert f.read() == method_table.render(rows), "docs/methods.md is stale: python -m jaxrl.run.method_table"


def test_the_method_table_catches_a_wrong_entry():
    row = {"name": "X", "status": "Y", "issue": None, "tests": ["tests/test_knobs.py::test_nothing_here"],
           "config": {"experiment": "text_grpo.py:countdown", "keys": {"loss.objective": "ppo", "loss.nothing": 1}}}
    found = method_table.problems([row])
    assert any("--config.loss.objective=ppo: unknown config.loss.objective 'ppo'" in p for p in found), found
    assert any("--config.loss.nothing=1" in p for p in found), found
    assert "X: no test tests/test_knobs.py::test_nothing_here" in found
    assert method_table.problems([dict(row, status="P", config={}, tests=[])]) == [
        "X: marked P without the issue that provides the rest"]


def test_the_config_reference_lists_every_key_of_every_experiment():
    text = config_reference.render()
    experiments = config_reference.experiment_configs()
    assert len(experiments) >= 20
    for name, config in experiments.items():
        assert f"### {name}\n" in text
        for key in config:  # (an env's or task's own kwargs are listed by the experiments that set them)
            assert f"- `{key}` = " in text if ".kwargs." in key else f"| `{key}` |" in text, (name, key)
    assert "| `optim.learning_rate` | `0.00025` (" in text and "| traced | the peak learning rate" in text
    assert config_reference.UNDECLARED not in text  # every key has its declaration: a default and a line of help
