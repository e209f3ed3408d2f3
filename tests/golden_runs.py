"""Short fixed-seed runs of every experiment family, and what they end with: the behaviour a refactor keeps.

    python tests/golden_runs.py --record         # run them all and write tests/golden_runs.json
    python tests/golden_runs.py                  # run them and compare with the recorded file
    python tests/golden_runs.py --record --other-machine OLD.json   # also keep how far OLD.json's values lie

Each run is an experiment file with small sizes (two seeds in one program, two log intervals, a checkpoint
and a greedy evaluation at the end) through `jaxrl.train.run`, compiled as the test session compiles (cheaply:
`conftest.py`; the script sets the same before it imports jax). What is kept per run: a SHA-256 of the final
parameters' bytes (equal only on the same CPU, jax and XLA options), per-leaf sums and the last metrics row.

Another CPU rounds differently (other vector widths, other kernels), and a few Adam steps amplify that: the
recurrent SMAX runs' leaf sums moved by up to ~5e-3 of their value between two x86 machines, while the CartPole
and text runs stayed within the 1e-5 tolerance. So each record can keep how far every value lay from the same
commit's record on another machine (`rounding_drift`, from `--other-machine FILE`), and a comparison allows
DRIFT_FACTOR times that, or `rtol` where that is larger: a refactor that changes behaviour moves the values by
more than rounding does. Re-recording without `--other-machine` keeps the drift already recorded.
`tests/test_golden_runs.py` runs the comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_PATH = os.path.join(ROOT, "tests", "golden_runs.json")

_SMALL_ENV_RUN = {"num_seeds": 2, "num_envs": 8, "num_steps": 16, "total_steps": 4 * 8 * 16,
                  "log.every_steps": 2 * 8 * 16, "eval.every_steps": 0, "eval.num_envs": 4, "eval.max_steps": 40,
                  "checkpoint.every_steps": 0, "log.progress_bar": False}
_SMALL_TEXT_RUN = {"num_seeds": 2, "num_prompts": 8, "total_steps": 4 * 8, "log.every_steps": 2 * 8,
                   "eval.every_steps": 0, "eval.num_envs": 8, "eval.pass_k": 2, "checkpoint.every_steps": 0,
                   "log.progress_bar": False, "model.d_model": 32, "model.num_heads": 2, "model.num_layers": 1}

DRIFT_FACTOR = 10.0  # how many times its recorded rounding drift a value may move on another machine

# family -> (experiment file and argument, overrides by config key)
RUNS = {
    "cartpole_ppo": ("cartpole_ppo.py", _SMALL_ENV_RUN),
    "smax_mappo": ("smax_mappo.py:3m", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
    "smax_ippo": ("smax_ippo.py:3m", {**_SMALL_ENV_RUN, "optim.num_minibatches": 2}),
    "cartpole_grpo": ("cartpole_grpo.py", {**_SMALL_ENV_RUN, "num_steps": 40, "total_steps": 4 * 8 * 40,
                                           "log.every_steps": 2 * 8 * 40, "group.size": 4,
                                           "optim.num_minibatches": 2}),
    "smax_grpo": ("smax_grpo.py:3m", {**_SMALL_ENV_RUN, "num_steps": 40, "total_steps": 4 * 8 * 40,
                                      "log.every_steps": 2 * 8 * 40, "group.size": 4, "optim.num_minibatches": 2}),
    "text_sft": ("text_sft.py:addition", _SMALL_TEXT_RUN),
    "text_grpo": ("text_grpo.py:addition", {**_SMALL_TEXT_RUN, "group.size": 4, "total_steps": 4 * 8 * 4,
                                            "log.every_steps": 2 * 8 * 4}),
}


def experiment_config(spec: str, overrides: dict):
    from jaxrl import config as config_lib

    config = config_lib.from_file(os.path.join(ROOT, "experiments", spec))
    with config.unlocked():
        return config_lib.set_values(config, overrides)


def summarise(params, metrics_row: dict) -> dict:
    """{"sha256": hex of every leaf's bytes in path order, "leaf_sums": {path: float}, "metrics": {key: float}}"""
    import jax
    import numpy as np

    digest = hashlib.sha256()
    sums = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        array = np.asarray(leaf)
        digest.update(array.tobytes())
        sums[jax.tree_util.keystr(path)] = float(array.astype(np.float64).sum())
    metrics = {k: float(v) for k, v in metrics_row.items()
               if isinstance(v, (int, float)) and not k.endswith(("seconds", "_time", "per_second", "_per_s"))}
    return {"sha256": digest.hexdigest(), "leaf_sums": sums, "metrics": metrics}


def run_family(name: str) -> dict:
    from jaxrl import train

    spec, overrides = RUNS[name]
    with tempfile.TemporaryDirectory() as workdir:
        result = train.run(experiment_config(spec, overrides), workdir)
    return summarise(result.state.params, result.metrics[-1])


def rounding_drift(summary: dict, other: dict) -> dict:
    """{section: {key: |value - the other machine's value|}} over leaf_sums and metrics (keys both have)."""
    return {section: {key: abs(value - other[section][key]) for key, value in summary[section].items()
                      if key in other[section]}
            for section in ("leaf_sums", "metrics")}


def differences(recorded: dict, current: dict, rtol: float = 1e-5) -> list[str]:
    """What differs beyond rounding: by more than DRIFT_FACTOR x the recorded `rounding_drift` of that value,
    and more than `rtol` (relative to the value, with an absolute floor of rtol)."""
    problems = []
    for section in ("leaf_sums", "metrics"):
        want, got = recorded[section], current[section]
        drift = recorded.get("rounding_drift", {}).get(section, {})
        if set(want) != set(got):
            problems.append(f"{section} keys differ: missing {sorted(set(want) - set(got))}, "
                            f"new {sorted(set(got) - set(want))}")
        for key in sorted(set(want) & set(got)):
            allowed = max(rtol * max(abs(want[key]), 1.0), DRIFT_FACTOR * drift.get(key, 0.0))
            if abs(want[key] - got[key]) > allowed:
                problems.append(f"{section}[{key}]: recorded {want[key]!r}, now {got[key]!r} "
                                f"(allowed +-{allowed:.3g})")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help=f"write {os.path.relpath(GOLDEN_PATH, ROOT)}")
    parser.add_argument("--only", default="", help="comma-separated families (default: all)")
    parser.add_argument("--other-machine", default="", help="with --record: the same commit's golden_runs.json "
                        "recorded on another machine; how far each value lies from it is kept as its rounding drift")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from conftest import CHEAP_COMPILES, OLDER_FUSION_EMITTERS, with_flag

    os.environ[CHEAP_COMPILES] = "1"  # as the test session compiles (before jax reads them)
    os.environ["XLA_FLAGS"] = with_flag(os.environ.get("XLA_FLAGS", ""), OLDER_FUSION_EMITTERS)
    names = args.only.split(",") if args.only else list(RUNS)
    recorded = {}
    if os.path.exists(GOLDEN_PATH):
        with open(GOLDEN_PATH) as f:
            recorded = json.load(f)
    other = {}
    if args.other_machine:
        with open(args.other_machine) as f:
            other = json.load(f)
    failed = False
    for name in names:
        current = run_family(name)
        if args.record:
            previous = recorded.get(name, {})
            drift = rounding_drift(current, other[name]) if name in other else previous.get("rounding_drift")
            if drift:
                current["rounding_drift"] = drift
            recorded[name] = current
            print(f"{name}: recorded {current['sha256'][:16]}", flush=True)
            continue
        problems = differences(recorded[name], current)
        exact = current["sha256"] == recorded[name]["sha256"]
        print(f"{name}: sha256 {'identical' if exact else 'differs'}; "
              + ("within tolerance" if not problems else "; ".join(problems)), flush=True)
        failed |= bool(problems)
    if args.record:
        with open(GOLDEN_PATH, "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
