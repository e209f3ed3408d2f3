"""A program's plan: its settings' configs read once, into what trains and when the host acts between chunks.

    settings = plan.as_trained(settings)                 # validated, derived keys filled in, one program
    plan = plan.make(settings, algo.settings, checkpoint_dir)     # frozen: chunk length, when to log, ...

`jaxrl.run.program` trains a plan (start, step, finish): it reads no config key itself, and hands the settings'
configs on where they are written or checked (the run directories, the loggers, the memory check).
"""

from __future__ import annotations

import dataclasses
import sys

from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, config as config_lib, distributed, knobs
from jaxrl.run import population as population_lib, workdir as workdir_lib


@dataclasses.dataclass
class Setting:
    """One point of a sweep: a config and the directory its metrics, plots and config go to."""

    config: ConfigDict
    workdir: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one compiled program trains, where it saves, and after which chunks it evaluates and saves.

    Runs are settings-major: run r is setting r // num_seeds, seed r % num_seeds. A chunk is `chunk` updates
    (the last may be shorter); every chunk logs a row per setting."""

    settings: tuple[Setting, ...]  # as they train (`as_trained`): they differ only in traced hyperparameters
    checkpoint_dir: str
    kind: str  # what each setting's directory is (`workdir.KINDS`)
    resuming: bool  # the checkpoint directory holds checkpoints to resume (and --overwrite is not given)
    overwrite: bool  # delete what the settings' directories and the checkpoint directory hold, once checked
    experiment: str
    seed: int
    num_seeds: int
    total_steps: int  # as configured: a whole number of updates or not
    batch: int  # env steps (or samples) of one update of one run
    num_updates: int  # of each run, to the end
    chunk: int  # updates per chunk: log.every_steps
    checkpoint_every: int  # chunks between checkpoints
    eval_every: int | None  # chunks between evaluations (None: at the end only)
    eval_episodes: int
    keep: int  # newest checkpoints kept
    keep_best: int  # best-scored checkpoints kept beside them
    on_nonfinite: str  # `divergence.Guard`'s policy: freeze, rollback or stop
    max_rollbacks: int
    progress_bar: bool
    artifacts: bool  # the first seed's samples at the end (log.artifacts)
    tuning: population_lib.Options | None  # PBT or successive halving between chunks (None: a plain program)
    tuned: tuple[population_lib.Tuned, ...] = ()  # the hyperparameters it tunes
    tuned_values: dict = dataclasses.field(default_factory=dict)  # {key: each setting's value} of the tuned

    @property
    def config(self) -> ConfigDict:
        """The first setting's config (every setting shares its static keys)."""
        return self.settings[0].config

    @property
    def num_settings(self) -> int:
        return len(self.settings)

    @property
    def num_runs(self) -> int:
        return self.num_settings * self.num_seeds

    def evaluates_after(self, chunk_index: int, done: bool) -> bool:
        """Whether the program evaluates after its chunk number `chunk_index` (1-based; `done`: the last)."""
        return done or bool(self.eval_every and chunk_index % self.eval_every == 0)

    def saves_after(self, chunk_index: int, evaluated: bool) -> bool:
        """Whether the scheduled checkpoint falls after chunk `chunk_index` (or its evaluation may be the best)."""
        return (evaluated and self.keep_best > 0) or chunk_index % self.checkpoint_every == 0


def every(every_steps: int, chunk_steps: int) -> int:
    """How many chunks between two events that should happen every `every_steps` env steps (>= 1)."""
    return max(1, round(every_steps / chunk_steps))


def make(settings: list[Setting], algo_settings, checkpoint_dir: str, *, kind: str = workdir_lib.RUN,
         progress: bool | None = None, tuning: tuple | None = None, overwrite: bool = False) -> Plan:
    """The plan of `settings` (`as_trained`) for an algorithm whose settings are `algo_settings` (`batch_size`,
    `num_updates`). `progress`: show a progress bar (None: log.progress_bar); `tuning`: (options, tuned) of a
    sweep (grid: no tuning)."""
    config = settings[0].config
    batch, num_updates = algo_settings.batch_size, algo_settings.num_updates
    chunk = max(1, config.log.every_steps // batch)
    checkpoint_every = every(config.checkpoint.every_steps, chunk * batch) if config.checkpoint.every_steps else 1
    options, tuned = tuning if tuning is not None and tuning[0].method != "grid" else (None, ())
    return Plan(
        settings=tuple(settings), checkpoint_dir=checkpoint_dir, kind=kind,
        resuming=checkpoint.has_checkpoints(checkpoint_dir) and not overwrite, overwrite=overwrite,
        experiment=config.experiment, seed=config.seed, num_seeds=config.num_seeds, total_steps=config.total_steps,
        batch=batch, num_updates=num_updates, chunk=chunk,
        checkpoint_every=checkpoint_every,
        eval_every=every(config.eval.every_steps, chunk * batch) if config.eval.every_steps else None,
        eval_episodes=config.eval.episodes, keep=config.checkpoint.keep, keep_best=config.checkpoint.keep_best,
        on_nonfinite=config.checkpoint.on_nonfinite, max_rollbacks=config.checkpoint.max_rollbacks,
        progress_bar=config.log.progress_bar if progress is None else progress,
        artifacts=knobs.declared("log.artifacts").value_or_default(config),  # (a run saved before the key: True)
        tuning=options, tuned=tuple(tuned),
        tuned_values={t.key: [config_lib.get_value(s.config, t.key) for s in settings] for t in tuned})


def as_trained(settings: list[Setting]) -> list[Setting]:
    """`settings` validated, with their configs as they train (`algos.resolve`: derived keys filled in, the
    changes printed by process 0); ValueError when they differ in more than traced hyperparameters (they
    must share one compiled program)."""
    for setting in settings:
        algos.validate(setting.config)
    resolved = [dataclasses.replace(s, config=algos.resolve(s.config)) for s in settings]
    if distributed.is_main_process():
        for given, setting in zip(settings, resolved):
            _print_derived(given.config, setting.config)
    config = resolved[0].config
    for setting in resolved:
        algos.validate(setting.config)  # again: the checks that involve derived keys
        if algos.static_signature(setting.config) != algos.static_signature(config):
            raise ValueError(f"{setting.workdir}: settings of one program may differ only in the hyperparameter "
                             f"keys {', '.join(algos.hyperparam_keys(config))}")
    return resolved


def _print_derived(given: ConfigDict, trained: ConfigDict) -> None:
    derived = config_lib.differences(given, trained)
    if derived:
        print("config as it trains: " + ", ".join(
            f"{k} {config_lib.get_value(given, k)} -> {config_lib.get_value(trained, k)}" for k in derived),
            file=sys.stderr)
