"""Kill -9 at random moments during training, sweeps and checkpoint saves; every directory must resume exactly.

    python benchmarks/fault_injection.py --trials 50 --out benchmarks/fault_injection.json
    python benchmarks/fault_injection.py --trials 1 --scenarios sweep --seed 3   # what tests/test_run_safety.py runs

Three scenarios, taken in turn: a single run that checkpoints every fourth log interval ("train"), one that
checkpoints at every interval so that most kills land in a save ("saves"), and a sweep of two learning rates
in one program ("sweep"), all CartPole PPO with small sizes. Each is first run once to the end without a kill,
keeping every checkpoint (the reference). A trial starts the command and sends SIGKILL at a random moment: after
a number of metrics rows drawn uniformly from the run's (none: at a random time of its start-up) and a random
part of one row's time more (so that kills land anywhere between two rows: in a chunk, a save, an evaluation),
then runs the same command again to the end. It passes when

  * the second command exits 0 and no checkpoint was moved aside (a kill is never taken for damage);
  * the checkpoint it resumed from holds exactly the reference's state at that update (every leaf bitwise);
  * its final checkpoint equals the reference's final one, bitwise (on the CPU a resumed run is the run that
    never stopped);
  * every setting's metrics.jsonl holds exactly the reference's rows: none lost, none repeated (timings aside).

Prints one line per trial and a summary, and writes the trials to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = ["--config=experiments/cartpole_ppo.py", "--config.num_envs=8", "--config.num_steps=16",
            "--config.log.every_steps=256", "--config.eval.episodes=4", "--config.eval.max_steps=50",
            "--config.log.progress_bar=false"]
SCENARIOS = {  # name -> (module, flags)
    "train": ("jaxrl.train", [*CARTPOLE, "--config.total_steps=12800", "--config.checkpoint.every_steps=1024"]),
    "saves": ("jaxrl.train", [*CARTPOLE, "--config.total_steps=6400", "--config.checkpoint.every_steps=256"]),
    "sweep": ("jaxrl.sweep", [*CARTPOLE, "--config.total_steps=6400", "--config.checkpoint.every_steps=512",
                              "--sweep.lr=1e-3,3e-3"]),
}
TIMING_KEYS = ("wall_time", "steps_per_second", "compile_seconds")


def command_env(cache_dir: str) -> dict:
    """Compile cheaply, as the test suite does (the numbers compared are all made under the same setting), and
    once: every command after the first takes its programs from a compilation cache."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import compile_as_the_suite
    env = dict(os.environ)
    compile_as_the_suite(env, cheap=True)
    env["JAX_COMPILATION_CACHE_DIR"] = env.get("JAX_COMPILATION_CACHE_DIR", cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def command(scenario: str, workdir: str, keep: int = 3) -> list[str]:
    module, flags = SCENARIOS[scenario]
    return [sys.executable, "-m", module, *flags, f"--config.checkpoint.keep={keep}", f"--workdir={workdir}"]


def metric_dirs(scenario: str, workdir: str) -> list[str]:
    if scenario == "sweep":
        return [os.path.join(workdir, name) for name in ("learning_rate=0.001", "learning_rate=0.003")]
    return [workdir]


def checkpoint_dir(scenario: str, workdir: str) -> str:
    return os.path.join(workdir, "checkpoints", "0") if scenario == "sweep" else os.path.join(workdir, "checkpoints")


def rows_without_timings(path: str) -> list[dict]:
    from jaxrl import metrics
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in metrics.read(path)]


def saved_steps(directory: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def load_step(directory: str, step: int) -> list[np.ndarray]:
    """Every leaf of checkpoint `step`, as saved (no target: the arrays orbax recorded)."""
    import orbax.checkpoint as ocp
    with ocp.StandardCheckpointer() as reader:
        tree = reader.restore(os.path.join(os.path.abspath(directory), str(step), "default"))
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def same_leaves(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b))


def reference(scenario: str, root: str, env: dict) -> dict:
    """The run without a kill, every checkpoint kept: its rows, steps and how long its start-up and rows took."""
    workdir = os.path.join(root, f"reference-{scenario}")
    rows_path = os.path.join(metric_dirs(scenario, workdir)[0], "metrics.jsonl")
    tick = time.monotonic()
    proc = subprocess.Popen(command(scenario, workdir, keep=100000), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_for_rows(proc, rows_path, 1)
    first_row = time.monotonic() - tick
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"reference run of {scenario} failed:\n{err[-3000:]}")
    rows_logged = len(open(rows_path).read().splitlines())
    training = time.monotonic() - tick - first_row
    return {"workdir": workdir, "seconds": time.monotonic() - tick, "seconds_to_first_row": first_row,
            "seconds_per_row": training / max(1, rows_logged),
            "rows": [rows_without_timings(os.path.join(d, "metrics.jsonl")) for d in metric_dirs(scenario, workdir)],
            "steps": saved_steps(checkpoint_dir(scenario, workdir))}


def wait_for_rows(proc: subprocess.Popen, rows_path: str, rows: int) -> None:
    """Until `rows_path` holds `rows` whole rows, or `proc` ends."""
    while proc.poll() is None and not (os.path.exists(rows_path) and open(rows_path).read().count("\n") >= rows):
        time.sleep(0.005)


def kill_at(proc: subprocess.Popen, rows_path: str, rows: int, jitter: float, start_up: float) -> bool:
    """SIGKILL `proc` `jitter` seconds after `rows_path` holds `rows` rows (rows 0: `start_up` seconds after it
    started, before any row); False when it ended first."""
    if rows == 0:
        deadline = time.monotonic() + start_up
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
    else:
        wait_for_rows(proc, rows_path, rows)
        time.sleep(jitter)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def trial(number: int, scenario: str, ref: dict, root: str, env: dict, rng: random.Random) -> dict:
    """Kill the command at a random moment: after a random number of its first setting's metrics rows (0: during
    start-up) and a random fraction of a chunk more, so that kills fall evenly over the run, saves included."""
    workdir = os.path.join(root, f"trial-{number}")
    rows = rng.randrange(len(ref["rows"][0]))
    jitter = rng.uniform(0.0, ref["seconds_per_row"])
    start_up = rng.uniform(0.0, ref["seconds_to_first_row"])
    proc = subprocess.Popen(command(scenario, workdir), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    killed = kill_at(proc, os.path.join(metric_dirs(scenario, workdir)[0], "metrics.jsonl"), rows, jitter, start_up)
    delay = f"start-up +{start_up:.2f} s" if rows == 0 else f"row {rows} +{jitter:.3f} s"
    ckpt_dir = checkpoint_dir(scenario, workdir)
    in_save = os.path.isdir(ckpt_dir) and any("tmp" in name for name in os.listdir(ckpt_dir))
    steps = saved_steps(ckpt_dir)
    restored_ok = None
    if steps:  # the checkpoint the next command resumes from must hold the reference's state at that update
        restored_ok = steps[-1] in ref["steps"] and same_leaves(load_step(ckpt_dir, steps[-1]),
                                                                 load_step(checkpoint_dir(scenario, ref["workdir"]),
                                                                           steps[-1]))
    again = subprocess.run(command(scenario, workdir), cwd=ROOT, env=env, capture_output=True, text=True)
    result = {"trial": number, "scenario": scenario, "killed_at": delay, "killed": killed,
              "during_save": in_save, "resumed_from": steps[-1] if steps else None, "exit": again.returncode,
              "checkpoint_equal": restored_ok}
    if again.returncode != 0:
        result["error"] = again.stderr.strip().splitlines()[-1] if again.stderr.strip() else ""
        return {**result, "ok": False}
    final = ref["steps"][-1]
    final_equal = same_leaves(load_step(ckpt_dir, final), load_step(checkpoint_dir(scenario, ref["workdir"]), final))
    rows = [rows_without_timings(os.path.join(d, "metrics.jsonl")) for d in metric_dirs(scenario, workdir)]
    moved = [n for n in os.listdir(ckpt_dir) if n.endswith(".corrupt")]
    result.update(final_equal=final_equal, rows_equal=rows == ref["rows"], moved_aside=moved)
    result["ok"] = final_equal and rows == ref["rows"] and not moved and restored_ok is not False
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="write the trials as JSON here")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, taken in turn")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="jaxrl-faults-") as root:
        env = command_env(os.path.join(root, "xla-cache"))
        chosen = args.scenarios.split(",")
        unknown = set(chosen) - set(SCENARIOS)
        if unknown:
            parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
        scenarios = [chosen[i % len(chosen)] for i in range(args.trials)]
        if args.trials > len(chosen):  # fills the compilation cache, so that the references time runs alone
            for name in dict.fromkeys(scenarios):
                reference(name, os.path.join(root, "warm-up"), env)
        refs = {name: reference(name, root, env) for name in dict.fromkeys(scenarios)}
        for name, ref in refs.items():
            print(f"reference {name}: {ref['seconds']:.1f} s, checkpoints {ref['steps'][0]}..{ref['steps'][-1]}, "
                  f"{sum(len(r) for r in ref['rows'])} metrics rows", flush=True)
        for number, name in enumerate(scenarios):
            result = trial(number, name, refs[name], root, env, rng)
            results.append(result)
            print(json.dumps(result), flush=True)
    passed = sum(r["ok"] for r in results)
    killed = sum(r["killed"] for r in results)
    print(f"\n{passed} of {len(results)} trials passed ({killed} killed mid-run, "
          f"{sum(r['during_save'] for r in results)} during a save, "
          f"{sum(r['resumed_from'] is None for r in results)} before their first complete checkpoint)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
