"""Tuning inside one compiled program: population-based training (PBT) and successive halving.

Both act between chunks on the runs of one program (state leaves [R, ...], hyperparameter leaves [R]) and
change only values: a run's state and hyperparameters are replaced by a copy of another run's (a gather
along the run axis, whatever devices and hosts the runs live on) and its swept hyperparameters are set anew,
so the chunk program is never compiled again.

    PBT       every `every_steps` env steps, the `fraction` of runs with the lowest scores copy a run drawn
              from the `fraction` with the highest (exploit) and multiply each swept hyperparameter by a
              factor drawn from `perturb`, clipped to the swept range (explore).
    halving   at each fraction of `total_steps` in `at`, the worse half of the settings still training are
              dropped; their runs continue the better settings' runs (more seeds of the survivors).

A copy takes a new random key (folded with its run index), so two runs never repeat each other's draws.
Scores are each run's headline metric over the chunk before the decision (`score_key`). With `rank`
"predicted" both rank runs instead by the score each run's learning curve (its score after every chunk so
far) predicts for the program's last update (`predict_final`), so a slow starter still rising steeply is
kept over a fast starter that has levelled off (early stopping on predicted final performance, after
Baker et al., "Accelerating neural architecture search using performance prediction"). Decisions are made
on the host with a NumPy generator seeded by (seed, update): every process of a multi-host program makes
the same ones, and a resumed program makes them again.

Every decision is a line of `<checkpoint_dir>/population.jsonl`, the lineage: the update, each run's score,
the run it continues (its parent: itself when kept), its setting and its swept values after the decision.
A resumed program reads its checkpoint's hyperparameters back from it. Ranked by prediction, every chunk's
scores are a line of `<checkpoint_dir>/curves.jsonl` too, from which a resumed program rebuilds the curves.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import files, metrics as metrics_lib

METHODS = ("grid", "pbt", "halving")
RANKS = ("current", "predicted")  # what a decision ranks runs by: the chunk's score, or the final one predicted
LINEAGE_FILE = "population.jsonl"  # in the program's checkpoint directory
CURVES_FILE = "curves.jsonl"  # rank "predicted": {"update", "scores" [R]} after every chunk, runs before its decision
# A curve fit has 3 parameters: from 4 points on a residual chooses its shape, shorter curves rank by their
# current score. (A flat curve's noise spreads a prediction 8 times further on about as much as it spreads one
# chunk's score: standard deviation 1.0 times from 4 to 8 points, 0.8 from 12.)
MIN_CURVE_POINTS = 4
# The shapes `predict_final` tries: power laws' exponents c (0: ln t, the slowest to level off; by 4 a curve
# has levelled off in its first points) and exponentials' rates k, per span scored (1: levelling off over
# about the span scored so far; by 100 within its first point).
POWERS = np.linspace(0.0, 4.0, 401)
RATES = np.geomspace(1.0, 100.0, 201)


@dataclasses.dataclass(frozen=True)
class Tuned:
    """A swept hyperparameter: its config key, the hyperparameter field it is traced as, and its range."""

    key: str
    field: str
    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class Options:
    """How a sweep trains its settings (`--sweep.method=...` and the method's `--sweep.<method>.<name>`)."""

    method: str = "grid"
    every_steps: int = 0  # PBT: env steps per run between decisions (0: 4 decisions in a run)
    fraction: float = 0.25  # PBT: the share of runs replaced (and the share they copy from)
    perturb: tuple[float, ...] = (0.8, 1.25)  # PBT: the factors explore multiplies a hyperparameter by
    at: tuple[float, ...] = ()  # halving: fractions of total_steps (empty: 1/8, 1/4, 1/2)
    score_key: str = ""  # the metric ranked (empty: the env's headline, `default_score_key`)
    rank: str = "current"  # "predicted": rank by the final score each run's curve predicts (`predict_final`)


def check_rank(options: Options) -> None:
    """ValueError naming the flag when `options.rank` is not one of RANKS."""
    if options.rank not in RANKS:
        raise ValueError(f"--sweep.{options.method}.rank: is one of {', '.join(RANKS)}, not {options.rank!r}")


def default_score_key(metric_names) -> str:
    """What a decision ranks runs by: the training win rate where the env reports wins, else the return."""
    for key in ("win_rate", "episode_return", "eval_accuracy"):
        if key in metric_names or f"{key}_sum" in metric_names:
            return key
    raise ValueError("the runs log no win rate, return or accuracy to rank them by; name one with "
                     "--sweep.<method>.score_key=<metric>")


def run_scores(chunk_metrics: dict, key: str) -> np.ndarray:
    """[R] each run's `key` over a chunk (an episode statistic `<key>_sum` / `episodes`); NaN where a run
    finished no episode or is frozen."""
    if f"{key}_sum" in chunk_metrics:
        return metrics_lib.per_episode(chunk_metrics[f"{key}_sum"], chunk_metrics["episodes"])
    if key not in chunk_metrics:
        raise ValueError(f"score_key {key!r} is not a metric of this algorithm; it logs "
                         f"{', '.join(sorted(k.removesuffix('_sum') for k in chunk_metrics))}")
    return np.asarray(chunk_metrics[key], np.float64)


def ranking(scores: np.ndarray) -> np.ndarray:
    """Run indices from the best score to the worst; NaN ranks last, ties keep index order."""
    return np.lexsort((np.arange(len(scores)), -np.nan_to_num(scores, nan=-np.inf)))


def curve_basis(t: np.ndarray) -> np.ndarray:
    """[C, T] the candidate shapes of a learning curve at times t [T] > 0 (in units of the last step scored),
    each 0 at t = 1 and rising to 1/c or 1/k, or without bound: (1 - t^-c) / c for every c of POWERS (its
    limit ln t at c = 0), then (1 - e^-k(t - 1)) / k for every k of RATES."""
    c, k = POWERS[1:, None], RATES[:, None]
    with np.errstate(over="ignore"):
        return np.concatenate([np.log(t)[None], (1 - t ** -c) / c, (1 - np.exp(-k * (t - 1))) / k])


def fit_curve(g: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    """(i, a, b): the least-squares fit y ~ a + b g[i] of a curve's scores y [T] over the shapes g [C, T]:
    a and b in closed form for every shape (simple linear regression), then the shape of the smallest
    squared residual (a grid for the one nonlinear parameter: no start point, nothing to diverge)."""
    centred, deviations = g - g.mean(axis=1, keepdims=True), y - y.mean()
    b = centred @ deviations / (centred ** 2).sum(axis=1)
    i = int(np.argmin(((deviations - b[:, None] * centred) ** 2).sum(axis=1)))
    return i, float(y.mean() - b[i] * g[i].mean()), float(b[i])


def predict_final(steps: np.ndarray, scores: np.ndarray, at: float) -> float:
    """The score a learning curve (`scores` [T] after `steps` [T], increasing; NaN where a chunk had none)
    predicts at step `at`: the least-squares fit (`fit_curve`) of a saturating 3-parameter curve, a power law
    a + b t^-c (ln t at c = 0) or an exponential a + b e^-kt, whichever fits better, evaluated at `at`.
    Fewer than MIN_CURVE_POINTS scores: the last one (what the current rank ranks by).

    Why: within one program no setting has finished, so there are no complete curves to learn a regression
    from (the paper's models need them); a parametric extrapolation needs none. Power laws alone carry a
    curve that has levelled off on by their tail (one at 0.98 of its plateau, predicted 8 times further on:
    1.5 times it); exponentials alone stop a power-law curve short. Neither grows faster than ln t (c >= 0),
    and an exponential gains at most its last slope times the span already scored (k >= 1): with rates
    down to 0.1, near-lines, a flat curve's noise spread the prediction 4 to 6 times as far as one chunk's."""
    finite = np.isfinite(scores)
    if finite.sum() < MIN_CURVE_POINTS:
        return float(scores[-1])
    steps, y = np.asarray(steps, np.float64)[finite], np.asarray(scores, np.float64)[finite]
    g = curve_basis(np.append(steps, at) / steps[-1])
    i, a, b = fit_curve(g[:, :-1], y)
    return a + b * float(g[i, -1])


def predicted_scores(steps: np.ndarray, curves: np.ndarray, at: float) -> np.ndarray:
    """[R] each run's predicted score at step `at` (`predict_final`) from its curve, column r of `curves`
    [T, R] (scores after `steps` [T])."""
    return np.array([predict_final(steps, curves[:, r], at) for r in range(curves.shape[1])])


def truncation_parents(scores: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """[R] the run each run continues: the bottom `fraction` (at least one, at most half) each copy a run
    drawn uniformly from the top `fraction`; the others continue themselves."""
    order = ranking(scores)
    count = min(len(scores) // 2, max(1, int(len(scores) * fraction)))
    parents = np.arange(len(scores))
    if count:
        parents[order[-count:]] = rng.choice(order[:count], size=count)
    return parents


def explore(values: np.ndarray, parents: np.ndarray, factors: tuple[float, ...], low: float, high: float,
            rng: np.random.Generator) -> np.ndarray:
    """[R] swept values after a PBT decision: a run that copied another takes its parent's value times a
    factor drawn from `factors`, clipped to [low, high]; the others keep theirs."""
    copied = parents != np.arange(len(parents))
    drawn = np.asarray(factors)[rng.integers(len(factors), size=len(parents))]
    return np.where(copied, np.clip(values[parents] * drawn, low, high), values)


def halving_parents(scores: np.ndarray, settings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parents [R], settings [R]) after one halving: the settings still training (those of `settings`, the
    setting each run trains) are ranked by their runs' mean score; the worse half (rounded down) is dropped
    and its runs are dealt out over the survivors, best first, each continuing one of that survivor's runs
    in turn."""
    alive = np.unique(settings)
    means = np.array([np.nanmean(scores[settings == s]) if np.isfinite(scores[settings == s]).any() else np.nan
                      for s in alive])
    order = alive[ranking(means)]
    survivors, dropped = order[:len(order) - len(order) // 2], order[len(order) - len(order) // 2:]
    parents, new_settings = np.arange(len(settings)), settings.copy()
    freed = np.flatnonzero(np.isin(settings, dropped))
    dealt = {s: 0 for s in survivors}
    for i, run in enumerate(freed):
        survivor = survivors[i % len(survivors)]
        own = np.flatnonzero(settings == survivor)
        parents[run] = own[dealt[survivor] % len(own)]
        dealt[survivor] += 1
        new_settings[run] = survivor
    return parents, new_settings


@jax.jit
def continue_runs(state, hyperparams, parents: jax.Array):
    """(state, hyperparams) where run r holds a copy of run `parents[r]` (leaves [R, ...]); a run that
    copied another gets that run's key folded with its own index (the state must have a `key` leaf [R, 2])."""
    state, hyperparams = jax.tree.map(lambda x: x[parents], (state, hyperparams))
    runs = jnp.arange(parents.shape[0])
    fresh = jax.vmap(jax.random.fold_in)(state.key, 2_000_003 + runs)
    return state.replace(key=jnp.where((parents != runs)[:, None], fresh, state.key)), hyperparams


class Population:
    """The sweep method of one program: when to decide, what the decision is, and its lineage file.

    `tuned`: the swept hyperparameters; `setting_values`: {key: [settings]} each setting's value; runs are
    settings-major; `num_updates`, `chunk`: the program's length and the updates between decisions' chances;
    `batch`: env steps per update of one run. Swept values are kept on the host in float64 (exact in the
    lineage) and traced as float32."""

    def __init__(self, options: Options, tuned: list[Tuned], setting_values: dict[str, list], num_seeds: int,
                 num_updates: int, chunk: int, batch: int, seed: int, checkpoint_dir: str):
        if options.method not in ("pbt", "halving"):
            raise ValueError(f"Population takes method 'pbt' or 'halving', not {options.method!r}")
        check_rank(options)
        self.options, self.tuned, self.seed = options, tuned, seed
        num_settings = len(next(iter(setting_values.values())))
        self.num_runs = num_settings * num_seeds
        self.path = os.path.join(checkpoint_dir, LINEAGE_FILE)
        self.curves_path = os.path.join(checkpoint_dir, CURVES_FILE)
        self.settings = np.repeat(np.arange(num_settings), num_seeds)
        self.values = {k: np.repeat(np.asarray(v, np.float64), num_seeds) for k, v in setting_values.items()}
        self.decision_updates = decision_updates(options, num_updates, chunk, batch)
        self.num_updates = num_updates  # where a predicted rank predicts the runs' scores
        self.curve_updates: list[int] = []  # rank "predicted": the updates after which the curves were scored
        self.curves = np.zeros((0, self.num_runs))  # [T, R] their scores, run r's curve (its ancestry's) in column r
        self.score_key = options.score_key
        self.batch = batch

    def due(self, update: int) -> bool:
        return update in self.decision_updates

    def groups(self) -> list[np.ndarray]:
        """Per setting, the runs that train it now (empty once it is dropped)."""
        return [np.flatnonzero(self.settings == s) for s in range(self.settings.max() + 1)]

    def _scores(self, chunk_metrics: dict) -> np.ndarray:
        self.score_key = self.score_key or default_score_key(chunk_metrics)
        return run_scores(chunk_metrics, self.score_key)

    def observe(self, update: int, chunk_metrics: dict, main: bool) -> None:
        """Rank "predicted": add the chunk's scores [R] to the runs' curves, and a line to curves.jsonl (main
        process). After every chunk, before its decision."""
        if self.options.rank != "predicted":
            return
        scores = self._scores(chunk_metrics)
        self._extend(update, scores)
        if main:
            with open(self.curves_path, "a") as f:
                f.write(json.dumps({"update": update, "scores": [metrics_lib.finite_or_none(v) for v in scores]})
                        + "\n")

    def _extend(self, update: int, scores: np.ndarray) -> None:
        self.curve_updates.append(update)
        self.curves = np.concatenate([self.curves, scores[None]])

    def _follow(self, parents: np.ndarray) -> None:
        """A run that continues another's state continues its curve too."""
        self.curves = self.curves[:, parents]

    def decide(self, update: int, chunk_metrics: dict) -> dict:
        """The decision at `update` from the chunk's host metrics [R]: a lineage event {"update", "env_steps",
        "score_key", "scores", "parents", "settings", "values"}, and with rank "predicted" the "predicted"
        scores [R] it ranked by (`predict_final` of each run's curve, `observe`d up to this chunk)."""
        scores = self._scores(chunk_metrics)
        predicted = self.options.rank == "predicted"
        ranked = (predicted_scores(np.asarray(self.curve_updates), self.curves, self.num_updates) if predicted
                  else scores)
        rng = np.random.default_rng([self.seed, update])
        values = self.values
        if self.options.method == "pbt":
            parents = truncation_parents(ranked, self.options.fraction, rng)
            settings = self.settings.copy()
            values = {t.key: explore(values[t.key], parents, self.options.perturb, t.low, t.high, rng)
                      for t in self.tuned}
        else:
            parents, settings = halving_parents(ranked, self.settings)
            values = {t.key: values[t.key][parents] for t in self.tuned}
        event = {"update": update, "env_steps": update * self.batch, "score_key": self.score_key,
                 "scores": [metrics_lib.finite_or_none(v) for v in scores],
                 "parents": parents.tolist(), "settings": settings.tolist(),
                 "values": {k: v.tolist() for k, v in values.items()}}
        if predicted:
            event["predicted"] = [metrics_lib.finite_or_none(v) for v in ranked]
        return event

    def apply(self, event: dict, state, hyperparams):
        """(state, hyperparams) after `event`: runs continue their parents, swept fields set to its values."""
        state, hyperparams = continue_runs(state, hyperparams, jnp.asarray(event["parents"], jnp.int32))
        self._take(event)
        self._follow(np.asarray(event["parents"]))
        return state, with_values(hyperparams, self.tuned, self.values)

    def _take(self, event: dict) -> None:
        self.settings = np.asarray(event["settings"])
        self.values = {k: np.asarray(v, np.float64) for k, v in event["values"].items()}

    def record(self, event: dict) -> None:
        """Append `event` to the lineage (main process)."""
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")

    def start(self, main: bool) -> None:
        """Record the runs' initial settings and values (update 0), and start their curves (main process)."""
        if main:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            if self.options.rank == "predicted":
                files.write_lines(self.curves_path, [])
            self.record({"update": 0, "env_steps": 0, "score_key": self.score_key,
                         "scores": [None] * self.num_runs, "parents": list(range(self.num_runs)),
                         "settings": self.settings.tolist(), "values": {k: v.tolist() for k, v in self.values.items()}})

    def resume(self, update: int, hyperparams, main: bool):
        """Hyperparameters as they were at `update` (the restored checkpoint's), from the lineage; the
        events after it are dropped (the resumed program makes them again)."""
        events = [e for e in read_lineage(self.path) if e["update"] <= update]
        if not events:
            raise ValueError(f"{self.path} is missing: the checkpoints of a {self.options.method} program cannot "
                             "be resumed without it")
        if main:
            files.write_lines(self.path, events)
        self._take(events[-1])
        self.score_key = self.score_key or events[-1]["score_key"]
        if self.options.rank == "predicted":
            self._resume_curves(update, events, main)
        return with_values(hyperparams, self.tuned, self.values)

    def _resume_curves(self, update: int, events: list[dict], main: bool) -> None:
        """The runs' curves as they were at `update`: curves.jsonl's lines up to it (the later ones dropped),
        each decision of `events` followed after its chunk's line."""
        rows = [row for row in metrics_lib.read(self.curves_path) if row["update"] <= update]
        if main:
            files.write_lines(self.curves_path, rows)
        decisions = {event["update"]: np.asarray(event["parents"]) for event in events[1:]}
        for row in rows:
            self._extend(row["update"], np.array(row["scores"], dtype=np.float64))  # (None: NaN)
            if row["update"] in decisions:
                self._follow(decisions[row["update"]])


def decision_updates(options: Options, num_updates: int, chunk: int, batch: int) -> set[int]:
    """The updates after which a decision is made: chunk ends (multiples of `chunk`), never the last."""
    ends = list(range(chunk, num_updates, chunk))
    if options.method == "pbt":
        every = (max(1, round(options.every_steps / (chunk * batch))) if options.every_steps
                 else max(1, len(ends) // 4))
        return {u for i, u in enumerate(ends, 1) if i % every == 0}
    at = options.at or tuple(0.5 ** k for k in range(3, 0, -1))
    return {next((u for u in ends if u >= f * num_updates), num_updates) for f in at} - {num_updates}


def with_values(hyperparams, tuned: list[Tuned], values: dict[str, list]):
    """`hyperparams` with each tuned field set to its values [R] (float32)."""
    return hyperparams.replace(**{t.field: jnp.asarray(values[t.key], jnp.float32) for t in tuned})


def read_lineage(path: str) -> list[dict]:
    return metrics_lib.read(path)

