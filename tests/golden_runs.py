"""Short fixed-seed runs of every experiment family, and what they end with: the behaviour a refactor keeps.

    python tests/golden_runs.py --record                  # run them all, measure their drift, write the file
    python tests/golden_runs.py --record --only smax_qmix # re-record some (the others are kept)
    python tests/golden_runs.py                           # run them and compare with tests/golden_runs.json

Each family is an experiment file at small sizes (two seeds in one program; `RUNS`), trained by its algorithm's
chunk program one update at a time (`jaxrl.algos.build`, `init_seeds`, `run_chunk`; the training loop of
`jaxrl.train` runs the same program, which `tests/test_golden_runs.py` checks on one family), then evaluated
greedily as the loop does at the end of a run. Compiled as the test session compiles (cheaply: `conftest.py`;
the script sets the same before it imports jax). Two things are kept per family:

- the first update (`first_update`): per parameter leaf the sum of the update's change (after - before) and
  of its absolute value, and the update's metrics (losses, gradient norm, ...). One update from a fixed
  initialisation on a fixed rollout barely depends on how a CPU rounds, and it names the algorithm's
  gradient step exactly: a learning rate 1% off, another clip range or loss coefficient moves these values
  by far more than their tolerance.
- the short run (`short_run`): after 4 updates (8 for the off-policy learners, whose updates are small), per
  leaf the sum of the parameters, and the last update's metrics with the greedy evaluation's. This covers
  what the first update cannot: later updates (target networks, schedules, the replay buffer's sampling,
  episodes that end and restart, hidden states carried on) and evaluation (in the families that do not share
  it with another: `NOT_EVALUATED`).

Tolerances: measured, not guessed, per value. When recording, each family is run three more times, with a
perturbation the size of rounding: its initial parameters nudged one ulp up (`np.nextafter` towards +inf),
one ulp down, and its training program compiled with the other choice of XLA:CPU's kernels for products and
reductions (YNNPACK's or XLA's own: other summation orders in every product and reduction, as another CPU's
kernels have). How far a value moved in the worst of the three is its `drift`. A value may then differ from
its record by

    allowed = max(SAFETY * drift, FLOOR_ULPS * eps32 * scale)        (SAFETY 10, FLOOR_ULPS 1024)

where `scale` is the sum of the magnitudes that the value adds up: for a parameter leaf, the sum of |change|
over its elements (of the first update, or of the short run: final - initial); for a metric, |value|. The
floor is rounding that the three perturbations do not show: a sum's rounding grows with its terms'
magnitudes, and a CPU with other kernels rounds differently in every step of the training, while a nudge
perturbs only the start (a zero-initialised bias not at all). No absolute floor: a value that is zero on the
recording machine is held to zero, and a small value may move only by its own small scale (1.2e-4 of it
where the floor decides, as for most values of the first update; the chaotic recurrent SMAX MAPPO short run's
values are allowed their measured drift: 8e-3 of the value at the median, 0.14 at most).

Checked against the one comparison of two CPUs at hand: this file's earlier record, made by CI on an Intel
Xeon with AVX-512, against the same code on a 2-core AMD EPYC without AVX-512 (7 families, the same short
runs). Their final leaf sums lay up to 5e-3 relative apart (SMAX MAPPO's `actor.head.kernel`: 1.37253 there,
1.37455 here, where the nudges alone moved it by 1.28e-3 and the allowance is 1.28e-2); the largest ratio to
the nudges' drift was 138 (SMAX IPPO's `actor.hidden.bias`, 1.1e-5 apart while the nudges moved it by
8e-8), which the floor covers (it took 67 ulps of its scale; 112 of |value| for a metric, IPPO's
`approx_kl`, with the nudges' drift alone). Every one of those leaf sums and evaluation metrics lies within
0.16 of its allowance here.

What the allowances still catch (measured on this machine; `tests/test_golden_runs.py` checks the first two on
Pendulum PPO): a learning rate 1% higher moves from 9 (of 37, TD3) to 47 (of 60, QMIX) of the first update's
values beyond their allowance, the largest by 80x (SAC, TD3, DQN, text SFT: the floor) to 600x (Pendulum
PPO; CartPole PPO and GRPO, SMAX MAPPO and QMIX between); PPO's clip range 0.2 -> 0.21 moves 28 of 33
(Pendulum PPO, up to 780x), 21 of 50 (SMAX MAPPO) and 22 of 32 (SMAX GRPO). On CartPole at these learning
rates no ratio reaches the clip range in four updates: a change of it leaves those runs bit for bit as they
were, and no comparison could see it there.

A SHA-256 of the parameters' bytes (after the first update, at the end of the short run) is also kept, with the
machine it was recorded on (`machine()`: CPU model, vector ISA flags, the CPUs the process may use, jax and
jaxlib versions, XLA_FLAGS, the cheap-compile setting): on a machine of that kind the bytes must be equal,
exactly; on another the comparison is skipped, and the test file says so (a skipped test naming both
machines). The CPU count is part of it because XLA:CPU splits its work over them: SMAX MAPPO's bits changed
when the same machine ran it on one CPU (`taskset -c 0`; within the tolerances, as on the Intel Xeon).

Families: every experiment file but brax_ppo, brax_sac and craftax_ppo (brax and craftax are optional
libraries, and every family costs the file a compile of its program: the file's budget is about three minutes
of CPU), and smax_vdn, smax_iql and smax_pqn_vdn, which share their code with smax_qmix (the mixer aside) and
cartpole_pqn. gymnax_ppo runs Pendulum-v1 (PPO with continuous actions and reward normalisation, which no
other family covers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_PATH = os.path.join(ROOT, "tests", "golden_runs.json")

SAFETY = 10.0  # times the measured drift a value may move
FLOOR_ULPS = 1024  # float32 ulps of a value's scale it may always move (see the module docstring)
EPS32 = 2.0 ** -23  # float32's machine epsilon
VARIANTS = ("up", "down", "kernels")  # the perturbations whose drift sets the tolerances (`run_family`)
SECTIONS = ("first_update", "short_run")

_SMALL = {"num_seeds": 2, "eval.every_steps": 0, "eval.episodes": 4, "checkpoint.every_steps": 0,
          "log.progress_bar": False}
# 8 envs x 16 steps, 4 updates (a metrics row logged after each)
_SMALL_ENV_RUN = {**_SMALL, "eval.max_steps": 40, "num_envs": 8, "num_steps": 16, "total_steps": 4 * 8 * 16,
                  "log.every_steps": 8 * 16}
_SMALL_GROUP_RUN = {**_SMALL_ENV_RUN, "num_steps": 40, "total_steps": 4 * 8 * 40, "log.every_steps": 8 * 40,
                    "group.size": 4, "optim.num_minibatches": 2}
_SMALL_TEXT_RUN = {**_SMALL, "num_prompts": 8, "total_steps": 4 * 8, "log.every_steps": 8, "eval.episodes": 8,
                   "eval.pass_k": 2, "model.d_model": 32, "model.num_heads": 2, "model.num_layers": 1}
# The off-policy learners: 8 updates, learning from the first (learning_starts = one update's env steps), a
# buffer of 32 or 64 steps per env
_SMALL_REPLAY_RUN = {**_SMALL, "eval.max_steps": 40}
_SMALL_PENDULUM_RUN = {**_SMALL_REPLAY_RUN, "num_envs": 4, "num_steps": 2, "total_steps": 8 * 8, "log.every_steps": 8,
                       "replay.batch_size": 32, "replay.buffer_size": 4 * 32, "replay.learning_starts": 8}

# family -> (experiment file and argument, overrides by config key)
RUNS = {
    "cartpole_ppo": ("cartpole_ppo.py", _SMALL_ENV_RUN),
    "smax_mappo": ("smax_mappo.py:3m", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
    "smax_ippo": ("smax_ippo.py:3m", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
    "cartpole_grpo": ("cartpole_grpo.py", _SMALL_GROUP_RUN),
    "smax_grpo": ("smax_grpo.py:3m", _SMALL_GROUP_RUN),
    "text_sft": ("text_sft.py:addition", _SMALL_TEXT_RUN),
    "text_grpo": ("text_grpo.py:addition", {**_SMALL_TEXT_RUN, "group.size": 4, "total_steps": 4 * 8 * 4,
                                            "log.every_steps": 8 * 4}),
    "cartpole_dqn": ("cartpole_dqn.py", {**_SMALL_REPLAY_RUN, "num_envs": 8, "num_steps": 2, "total_steps": 8 * 16,
                                         "log.every_steps": 16, "replay.batch_size": 32,
                                         "replay.buffer_size": 8 * 32, "replay.learning_starts": 16,
                                         "target.every": 4}),
    "cartpole_pqn": ("cartpole_pqn.py", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
    "smax_qmix": ("smax_qmix.py:3m", {**_SMALL_REPLAY_RUN, "num_envs": 4, "num_steps": 16, "total_steps": 8 * 64,
                                      "log.every_steps": 64, "replay.batch_size": 8, "replay.buffer_size": 4 * 64,
                                      "replay.learning_starts": 64, "replay.sequence_length": 8,
                                      "replay.gradient_steps": 2, "target.every": 4}),
    "pendulum_sac": ("pendulum_sac.py", _SMALL_PENDULUM_RUN),
    "pendulum_td3": ("pendulum_td3.py", _SMALL_PENDULUM_RUN),
    "pendulum_tqc": ("pendulum_tqc.py", _SMALL_PENDULUM_RUN),
    "gymnax_ppo": ("gymnax_ppo.py:Pendulum-v1", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
}

# Families whose short run ends without the greedy evaluation, which another family's covers (the same
# evaluation code on the same env and policy kind), whose compile is what it would add to the test's time.
NOT_EVALUATED = {"smax_ippo": "smax_mappo's (the same recurrent actor on SMAX)",
                 "smax_grpo": "smax_mappo's (the same recurrent actor on SMAX)",
                 "cartpole_grpo": "cartpole_ppo's (the same actor on CartPole)",
                 "cartpole_pqn": "cartpole_dqn's (greedy in the same Q-network on CartPole)",
                 "pendulum_tqc": "pendulum_sac's (the same squashed Gaussian actor on Pendulum)",
                 "text_grpo": "text_sft's (the same transformer on the same task)"}

# /proc/cpuinfo flags that choose which kernels (and so which rounding) XLA:CPU and its libraries run
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


def experiment_config(spec: str, overrides: dict):
    from jaxrl import config as config_lib

    config = config_lib.from_file(os.path.join(ROOT, "experiments", spec))
    with config.unlocked():
        return config_lib.set_values(config, overrides)


def machine() -> dict:
    """What decides the bits of a run: the CPU (model, vector ISA), how many CPUs the process may use (XLA:CPU
    splits its products over them), jax and jaxlib, and the XLA settings the programs compile with."""
    import platform

    import jax
    import jaxlib

    model, ident, flags = platform.processor() or platform.machine(), "", set()
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        model = fields.get("model name", fields.get("CPU part", model))
        ident = " ".join(fields.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping"))
        flags = set((fields.get("flags") or fields.get("Features") or "").split())
    except OSError:  # not Linux
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": f"{model} ({ident})" if ident else model, "isa": [f for f in _ISA_FLAGS if f in flags],
            "cpus": cpus, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "xla_flags": " ".join(sorted(os.environ.get("XLA_FLAGS", "").split())),
            "cheap_compiles": os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "")}


def _numbers(row: dict) -> dict:
    """The finite numbers of a metrics row, without times and speeds."""
    import math

    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and math.isfinite(v)
            and not k.endswith(("seconds", "_time", "per_second", "_per_s"))}


def _leaves(params) -> list:
    """[(path, the leaf as a numpy array)] in tree order."""
    import jax
    import numpy as np

    return [(jax.tree_util.keystr(path), np.asarray(leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]]


def _sha256(leaves) -> str:
    digest = hashlib.sha256()
    for _, array in leaves:
        digest.update(array.tobytes())
    return digest.hexdigest()


def _changes(before, after, sums: bool) -> tuple[dict, dict]:
    """(values, scales) of the parameters `after` against `before`: per leaf the sum of the change and of its
    magnitude (or with `sums`, of the parameters themselves); the scale of each is the sum of |change|."""
    import numpy as np

    values, scales = {}, {}
    for (key, start), (_, end) in zip(before, after, strict=True):
        change = end.astype(np.float64) - start.astype(np.float64)
        size = float(np.abs(change).sum())
        if sums:
            values[f"sum{key}"], scales[f"sum{key}"] = float(end.astype(np.float64).sum()), size
        else:
            values[f"change{key}"], scales[f"change{key}"] = float(change.sum()), size
            values[f"abs_change{key}"], scales[f"abs_change{key}"] = size, size
    return values, scales


def nudged(params, direction: str):
    """`params` with every floating-point element one ulp up ("up", towards +inf) or down ("down")."""
    import jax
    import numpy as np

    def nudge(x):
        if not np.issubdtype(x.dtype, np.floating):
            return x
        host = np.asarray(x)
        return jax.device_put(np.nextafter(host, np.asarray(np.inf if direction == "up" else -np.inf, host.dtype)),
                              x.sharding)
    return jax.tree.map(nudge, params)


def other_kernels(xla_options: str) -> str:
    """config.xla_options with XLA:CPU's YNNPACK fusions (products, reductions) turned off, or on where they
    were off."""
    from jaxrl import config as config_lib

    options = [o.strip() for o in xla_options.split(",") if o.strip()]
    if config_lib.WITHOUT_YNNPACK in options:
        return ",".join(o for o in options if o != config_lib.WITHOUT_YNNPACK)
    return ",".join([*options, config_lib.WITHOUT_YNNPACK])


def run_family(name: str, variant: str | None = None, overrides: dict | None = None) -> dict:
    """{"first_update": summary, "short_run": summary} of family `name`, each summary {"sha256": of the
    parameters' bytes, "values": {key: float}, "scales": {key: float}} (`_changes`; metrics with scale
    |value|). `variant`: None, or one of VARIANTS: "up"/"down" nudge the initial parameters one ulp, "kernels"
    compiles with the other choice of XLA:CPU kernels (`other_kernels`). `overrides`: config keys set on top."""
    from jaxrl import algos, mesh as mesh_lib, metrics as metrics_lib
    from jaxrl.run import program

    spec, small = RUNS[name]
    config = experiment_config(spec, {**small, **(overrides or {})})
    if variant == "kernels":
        with config.unlocked():
            config.xla_options = other_kernels(config.xla_options)
    elif variant not in (None, "up", "down"):
        raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")
    algos.validate(config)
    config = algos.resolve(config)
    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, num_runs=config.num_seeds))
    state = algo.init_seeds(config.seed, config.num_seeds)
    if variant in ("up", "down"):
        state = state.replace(params=nudged(state.params, variant))
    initial = _leaves(state.params)
    num_updates = algo.settings.num_updates
    summaries = {}
    for update in range(1, num_updates + 1):  # one update per call: the first update's state, each's metrics
        state, metrics = algo.run_chunk(state, hp, 1)
        if update == 1:
            summaries["first_update"] = _summary(initial, _leaves(state.params), metrics_lib.summarize(
                program.fetch(metrics)), sums=False)
    metrics = program.fetch(metrics)
    if name not in NOT_EVALUATED:
        metrics.update(program.fetch(algo.evaluate(state.params, program.evaluation_key(config.seed, num_updates),
                                                config.eval.episodes)))
    row = {"update": num_updates, "env_steps": num_updates * algo.settings.batch_size,
           **metrics_lib.summarize(metrics)}
    summaries["short_run"] = _summary(initial, _leaves(state.params), row, sums=True)
    return summaries


def _summary(before, after, row: dict, sums: bool) -> dict:
    values, scales = _changes(before, after, sums)
    metrics = _numbers(row)
    return {"sha256": _sha256(after), "values": {**values, **metrics},
            "scales": {**scales, **{k: abs(v) for k, v in metrics.items()}}}


def record_family(name: str, log=print) -> dict:
    """The record of family `name`: this machine, and per section its sha256, values, scales and the drift of
    each value under VARIANTS (the largest |variant - value|)."""
    current = run_family(name)
    runs = {}
    for variant in VARIANTS:
        runs[variant] = run_family(name, variant)
        log(f"{name}: ran {variant}")
    record = {"machine": machine()}
    for section in SECTIONS:
        values = current[section]["values"]
        for variant in VARIANTS:
            if set(runs[variant][section]["values"]) != set(values):
                raise ValueError(f"{name}: {section} under {variant} has other values than the run itself "
                                 f"({sorted(set(runs[variant][section]['values']) ^ set(values))})")
        drift = {key: max(abs(runs[v][section]["values"][key] - value) for v in VARIANTS)
                 for key, value in values.items()}
        record[section] = {**current[section], "drift": drift}
    return record


def allowance(section: dict, key: str) -> float:
    return max(SAFETY * section["drift"][key], FLOOR_ULPS * EPS32 * section["scales"][key])


def differences(recorded: dict, current: dict) -> list[str]:
    """What differs beyond rounding, per section: keys that appeared or went missing, and values further from
    their record than `allowance` (SAFETY x the recorded drift, or FLOOR_ULPS float32 ulps of the scale)."""
    problems = []
    for section in SECTIONS:
        want, got = recorded[section]["values"], current[section]["values"]
        if set(want) != set(got):
            problems.append(f"{section} keys differ: missing {sorted(set(want) - set(got))}, "
                            f"new {sorted(set(got) - set(want))}")
        for key in sorted(set(want) & set(got)):
            allowed = allowance(recorded[section], key)
            if not abs(want[key] - got[key]) <= allowed:
                problems.append(f"{section}[{key}]: recorded {want[key]!r}, now {got[key]!r} "
                                f"(allowed +-{allowed:.3g})")
    return problems


def same_machine(recorded: dict, current: dict | None = None) -> bool:
    return recorded.get("machine") == (current or machine())


def bit_differences(recorded: dict, current: dict) -> list[str]:
    """The sections whose parameters' SHA-256 differs from the record (meaningful on the recording machine)."""
    return [f"{section}: sha256 recorded {recorded[section]['sha256'][:16]}, now {current[section]['sha256'][:16]}"
            for section in SECTIONS if recorded[section]["sha256"] != current[section]["sha256"]]


def describe(machine_info: dict) -> str:
    return (f"{machine_info.get('cpu')} [{','.join(machine_info.get('isa', []))}], {machine_info.get('cpus')} "
            f"CPUs, jax {machine_info.get('jax')} / jaxlib {machine_info.get('jaxlib')}, XLA_FLAGS "
            f"{machine_info.get('xla_flags')!r}, cheap compiles {machine_info.get('cheap_compiles')!r}")


def set_up_process() -> None:
    """Compile as the test session does (`conftest.py`), before jax is imported; keep compiled programs in a
    cache for the process (the variants' programs repeat the nominal run's)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import compile_as_the_suite

    compile_as_the_suite(os.environ, cheap=True)
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        import atexit
        import shutil
        import tempfile

        cache = tempfile.mkdtemp(prefix="golden-runs-xla-cache-")
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help=f"write {os.path.relpath(GOLDEN_PATH, ROOT)}")
    parser.add_argument("--only", default="", help="comma-separated families (default: all)")
    args = parser.parse_args(argv)
    set_up_process()
    names = args.only.split(",") if args.only else list(RUNS)
    recorded = {}
    if os.path.exists(GOLDEN_PATH):
        with open(GOLDEN_PATH) as f:
            recorded = json.load(f)
    failed = False
    for name in names:
        if args.record:
            recorded[name] = record_family(name, log=lambda m: print(m, flush=True))
            with open(GOLDEN_PATH, "w") as f:  # after each family: a long recording keeps what it has
                json.dump(recorded, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"{name}: recorded", flush=True)
            continue
        current = run_family(name)
        problems = differences(recorded[name], current)
        bits_differ = bit_differences(recorded[name], current)
        if same_machine(recorded[name]):
            problems += bits_differ
            bits = "sha256 compared"
        else:
            bits = (f"sha256 not compared ({'differs' if bits_differ else 'identical'}; recorded on "
                    f"{describe(recorded[name]['machine'])})")
        print(f"{name}: {bits}; " + ("as recorded" if not problems else "; ".join(problems)), flush=True)
        failed |= bool(problems)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
