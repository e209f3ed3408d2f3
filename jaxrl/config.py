"""Experiment configs: the shared layout, checks that fail before compiling, and saving/loading.

`base_config()` holds the keys every run shares; each algorithm adds its own sections
(`jaxrl.algos.default_config(name)`). Every experiment file's `get_config(arg)` starts from its algorithm's
default config, sets what it needs and returns `finalize(config, arg)`. The result is locked, so a misspelt key (in Python or on the command line) is an
error, and ConfigDict's type checks reject a value of the wrong type.
"""

from __future__ import annotations

import json
from typing import Any

from ml_collections import ConfigDict

from jaxrl import files, knobs
from jaxrl.knobs import Knob, get_value  # noqa: F401  (config.get_value: a dotted key's value)

# What the training loop does with a run whose state or metrics turn non-finite (`jaxrl.run.divergence`).
ON_NONFINITE = ("freeze", "rollback", "stop")
# Where metrics go (`jaxrl.run.loggers`); metrics.jsonl is always written (resuming and the plots read it).
LOG_BACKENDS = ("jsonl", "tensorboard", "wandb")
WANDB_MODES = ("offline", "online")


# The keys every run has. An algorithm's `default_config` (`jaxrl.algos.default_config`) adds its own; sizes and
# choices are static, the knobs declared `traced` are hyperparameters a sweep varies inside one program.
SCHEDULES = ("constant", "linear", "cosine")
GRAD_CLIPS = ("joint", "per_network")  # "per_network": each top-level network clipped apart, as two optimisers would
SHARED_KNOBS = (
    Knob("experiment", "experiment", "the run's name: runs/<experiment>-<time> unless --workdir says otherwise"),
    Knob("algorithm", "", "a name registered in jaxrl.algos (`jaxrl.algos.ALGORITHMS`)"),
    Knob("seed", 0, "the random seed; num_seeds runs draw their keys from it"),
    Knob("num_seeds", 1, "seeds trained at once in one program (vmapped)", minimum=1),
    Knob("total_steps", 100_000, "environment steps (or samples, for text) per seed", minimum=1),
    Knob("xla_options", "", "XLA compile options of the training programs, 'name=value,...', or 'auto' (a speed knob)"),
    Knob("optim.learning_rate", 2.5e-4, "the peak learning rate, when a schedule warms up or decays", traced=True,
         above=0.0),
    Knob("optim.schedule", "linear", "the learning rate over the run: constant, or linear or cosine decay to zero",
         choices=SCHEDULES),
    Knob("optim.warmup_updates", 0, "linear warm-up from 1 / warmup_updates of the peak; 0: none", minimum=0),
    Knob("optim.max_grad_norm", 0.5, "gradients are clipped to this global norm", traced=True, above=0.0),
    Knob("optim.grad_clip", "joint", "max_grad_norm over all parameters, or per_network (each network apart)",
         choices=GRAD_CLIPS),
    Knob("optim.adam_eps", 1e-5, "Adam's epsilon", above=0.0),
    Knob("optim.weight_decay", 0.0, "decoupled weight decay (AdamW); 0 leaves it out of the optimiser", traced=True,
         minimum=0.0),
    Knob("mesh.num_devices", 0, "devices the run uses; 0: every device of every process", minimum=0),
    Knob("mesh.run_devices", 0, "devices along the mesh's runs axis (seeds and sweep settings split over them); "
         "0: as many as divide both the devices and the runs", minimum=0),
    Knob("mesh.model_devices", 1, "devices along a `model` axis that splits a pretrained language model's attention "
         "heads, MLP units and vocabulary within each data group (tensor parallel); 1: none", minimum=1),
    Knob("log.every_steps", 25_000, "environment steps between metrics rows", minimum=1),
    Knob("log.progress_bar", True, "a progress bar on the terminal"),
    Knob("log.artifacts", True, "at the end, the first seed's samples beside the metrics: an evaluation episode's GIF "
         "(environments that render one) or sample completions (text); False: none (a sweep's many runs, tests)"),
    Knob("log.backends", "jsonl", "where metrics go besides metrics.jsonl (always written)", choices=LOG_BACKENDS,
         each_of=True),
    Knob("log.wandb_project", "jaxrl", "the W&B project (log.backends wandb)"),
    Knob("log.wandb_mode", "offline", "offline only writes <workdir>/wandb (`wandb sync` later); online uploads",
         choices=WANDB_MODES),
    Knob("checkpoint.every_steps", 0, "environment steps between checkpoints; 0: at every log interval", minimum=0),
    Knob("checkpoint.keep", 3, "the newest checkpoints kept", minimum=1),
    Knob("checkpoint.keep_best", 0, "also keep this many with the best evaluation, saving one at every "
         "evaluation; 0: none", minimum=0),
    Knob("checkpoint.on_nonfinite", "freeze", "a run whose state turns NaN/inf: freeze it, roll back its chunk with "
         "a new key, or stop the program", choices=ON_NONFINITE),
    Knob("checkpoint.max_rollbacks", 3, "rollbacks of one run before it is frozen", minimum=0),
    Knob("eval.every_steps", 0, "environment steps between greedy evaluations; 0: only at the end", minimum=0),
    Knob("eval.episodes", 32, "episodes (or prompts) per evaluation", minimum=1),
    Knob("eval.max_steps", 0, "the step cap of an evaluation episode; 0: the environment's own", minimum=0),
)


# The minibatch loop's keys, of the algorithms that take epochs over an update's batch
NUM_EPOCHS = Knob("optim.num_epochs", 4, "passes over an update's batch", minimum=1)
NUM_MINIBATCHES = Knob("optim.num_minibatches", 4, "minibatches per epoch", minimum=1)


def base_config() -> ConfigDict:
    """The keys every run has, with defaults (`SHARED_KNOBS`). What a run does with a seed whose state or
    metrics turn NaN/inf (`checkpoint.on_nonfinite`, `jaxrl.run.divergence`): "freeze" keeps its last finite
    state while the others go on, "rollback" restarts its chunk with a new random key (at most max_rollbacks
    times, then freezes it); both keep each chunk's input state until it is checked. "stop" ends the program
    at the chunk (saved checkpoints stay) and in return holds the training state once, not twice: for a state
    near memory's size."""
    return knobs.defaults(*SHARED_KNOBS)


def finalize(config: ConfigDict, arg: str | None = None) -> ConfigDict:
    """Reject a config argument the experiment does not take, then lock the config."""
    if arg:
        raise ValueError(f"experiment {config.experiment!r} takes no config argument, got {arg!r}")
    config.lock()
    return config


def set_value(config: ConfigDict, key: str, value) -> None:
    """Set a dotted key, e.g. set_value(config, "optim.learning_rate", 1e-3)."""
    section, _, name = key.rpartition(".")
    (get_value(config, section) if section else config)[name] = value


def make_siblings_importable(path: str) -> None:
    """Experiment files import their siblings as `experiments.<name>`: put the folder above the one holding the
    config file `path` on sys.path, so that this works from any working directory."""
    import os
    import sys

    project_root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if project_root not in sys.path:
        sys.path.append(project_root)


def from_file(spec: str) -> ConfigDict:
    """An experiment file's config, named as on the command line: "path/to/file.py" or "path/to/file.py:arg"
    gives the file's `get_config(arg)` (locked)."""
    import importlib.util
    import os

    path, _, arg = spec.partition(":")
    make_siblings_importable(path)
    module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def set_values(config: ConfigDict, values: dict) -> ConfigDict:
    """Set several dotted keys ({"optim.learning_rate": 1e-3, ...}); returns the config."""
    for key, value in values.items():
        set_value(config, key, value)
    return config


def positive(config: ConfigDict, *keys: str) -> None:
    for key in keys:
        value = get_value(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config.{key} must be a positive integer, got {value!r}")


# config.xla_options that turns off XLA:CPU's YNNPACK fusions (products and reductions then run as XLA's own,
# multi-threaded kernels). Which programs gain is measured per algorithm or experiment, where it is set.
WITHOUT_YNNPACK = "xla_cpu_experimental_ynn_fusion_type="
# config.xla_options "auto": on the CPU, the training program is compiled with each of XLA_AUTO_CHOICES and the run
# keeps the faster, timed on its first state, when the states they reach are bitwise equal (`engine.Algorithm`):
# for settings that help on one machine and hurt on another (YNNPACK's fusions made benchmarks/grpo_tokens.py's
# step 1.45x faster on a 2-core AMD EPYC and 1.15x slower on a 2-core Intel Xeon, with equal states). Not a
# default: it costs a compile, and the programs of experiments/text_grpo.py and text_sft.py reach different
# states, so that it keeps XLA's defaults there.
XLA_AUTO = "auto"


def _parse_xla_options(text: str) -> tuple[tuple[str, str | bool], ...]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    options = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().startswith("xla_"):
            raise ValueError(f"config.xla_options: {item!r} is not name=value with an XLA option name "
                             "(e.g. xla_cpu_enable_fast_math=false)")
        value = value.strip()
        options.append((name.strip(), {"true": True, "false": False}.get(value.lower(), value)))
    return tuple(sorted(options))


XLA_AUTO_CHOICES = ((), _parse_xla_options(WITHOUT_YNNPACK))


def xla_options(config: ConfigDict) -> tuple[tuple[str, str | bool], ...] | str:
    """config.xla_options "name=value,..." -> ((name, value), ...), sorted, true/false as bools (as XLA_FLAGS
    spells them; XLA's option parser wants Python bools), or XLA_AUTO for "auto"; ValueError if an item is not
    `name=value` with an XLA option name (they start with "xla_")."""
    if config.xla_options.strip() == XLA_AUTO:
        return XLA_AUTO
    return _parse_xla_options(config.xla_options)


def xla_candidates(options: tuple[tuple[str, str | bool], ...] | str) -> tuple:
    """The compile options a training program may take, given `xla_options(config)`: those options, or for XLA_AUTO
    on the CPU XLA_AUTO_CHOICES (elsewhere, and where jax compiles without most optimisations, as tests do,
    timings would not tell the programs apart: XLA's defaults alone)."""
    import jax

    if options != XLA_AUTO:
        return (options,)
    if jax.default_backend() != "cpu" or jax.config.values.get("jax_disable_most_optimizations"):
        return ((),)
    return XLA_AUTO_CHOICES


def log_backends(config: ConfigDict) -> tuple[str, ...]:
    """config.log.backends "jsonl,tensorboard" -> ("jsonl", "tensorboard"): the names, stripped, in order."""
    return tuple(name.strip() for name in config.log.backends.split(","))


def _check_xla_options(config: ConfigDict) -> None:
    """Compile a trivial program with the options, so that one this XLA does not know fails here, not after
    the training program's compile."""
    import jax

    for options in filter(None, xla_candidates(xla_options(config))):
        try:
            jax.jit(lambda x: x + 1).lower(0.0).compile(dict(options))
        except Exception as error:  # XLA raises its runtime error type; the message names the option
            raise ValueError(f"config.xla_options {config.xla_options!r}: {str(error).splitlines()[0]}") from None


def validate_shared(config: ConfigDict) -> None:
    """Check every declared key the config holds (`knobs.check_config`: the shared ones and the algorithm's)
    and the XLA options; `jaxrl.algos.validate` adds the algorithm's checks that span keys."""
    knobs.check_config(config)
    _check_xla_options(config)


def one_of(value: str, known, key: str) -> None:
    if value not in known:
        raise ValueError(f"unknown config.{key} {value!r}; known: {', '.join(known)}")


def to_dict(config: ConfigDict) -> dict[str, Any]:
    """A JSON-ready plain dict (tuples become lists)."""
    return json.loads(config.to_json())


def save(config: ConfigDict, path) -> None:
    """Write the config as JSON, atomically (`jaxrl.files`)."""
    files.write_atomic(path, config.to_json(indent=2, sort_keys=True))


# Keys that moved, old -> new, in the order they moved: a saved config is read with its old keys under their new
# names (`load`), so that every saved run still resumes and evaluates. A key is never reused for another meaning.
RENAMED_KEYS = {
    "temperature.learning_rate": "optim.temperature_learning_rate",  # 2026-11-29: every learning rate in optim
    "normalize.reward_scale": "returns.reward_scale",  # 2026-11-29: one name for every family
    "eval.num_envs": "eval.episodes",  # 2026-11-29: episodes or held-out problems, whatever runs them
    "critic_weight": "loss.critic_weight",  # 2026-11-29: every loss weight in loss
    # 2026-11-29: one estimator key and registry for PPO and the GRPO family, its options beside it
    "returns.advantage": "advantage.estimator", "advantage": "advantage.estimator",
    **{f"advantage_options.{option}": f"advantage.{option}"
       for option in ("scale", "eps", "clip", "max_reward", "renormalize")},
}


def flat_keys(tree: dict, prefix: str = "") -> dict:
    """{dotted key: value} of a nested dict's leaves (an empty section, such as kwargs, is a leaf)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat_keys(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def nested(flat: dict) -> dict:
    """The nested dict of {dotted key: value} (`flat_keys`'s inverse)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, name = key.split(".")
        section = out
        for parent in parents:
            section = section.setdefault(parent, {})
        section[name] = value
    return out


def migrate(saved: dict, renamed: dict[str, str] = RENAMED_KEYS) -> dict:
    """A saved config (a plain dict) with its old keys under their new names (`RENAMED_KEYS`); a section left
    empty by a move goes. ValueError when a config holds a key under both names."""
    flat = flat_keys(saved)
    for old, new in renamed.items():
        if old in flat:
            if new in flat:
                raise ValueError(f"the saved config holds both {old} and {new} (which replaced it)")
            flat[new] = flat.pop(old)
    return nested(flat)


def load(path) -> ConfigDict:
    """The config a run saved, its old keys renamed (`migrate`), locked like a fresh one."""
    with open(path) as f:
        config = ConfigDict(migrate(json.load(f)))
    config.lock()
    return config


def differences(a: ConfigDict, b: ConfigDict, prefix: str = "", *, added: bool = True) -> list[str]:
    """Dotted keys whose values differ between two configs. `added=False` leaves out the keys that only `b`
    has (what a newer jaxrl added to a config saved by an older one)."""
    da, db = (to_dict(a), to_dict(b)) if not prefix else (a, b)
    keys = sorted(set(da) | set(db) if added else set(da))
    out = []
    for key in keys:
        va, vb = da.get(key), db.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differences(va, vb, f"{prefix}{key}.", added=added)
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out
