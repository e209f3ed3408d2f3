"""Run one of JaxMARL's own SMAX baseline scripts from a copy of its repository and record its curve: the
recurrent MAPPO, IPPO, QMIX, VDN or IQL script (`--algorithm mappo`, `ippo`, `qmix`, `vdn`, `iql`).

JaxMARL's PyPI package does not ship its baselines, so the script is loaded by path from a checkout of the
repository (`--repo`). Nothing of it is copied here: this file only sets the script's config (its own YAML,
with the scenario, seed and step budget changed), replaces its `wandb.log` with a recorder, calls its
`make_train`, and writes what it logged per update as JSON.

    python benchmarks/jaxmarl_reference.py --repo PATH/TO/JaxMARL --scenario 3m --seed 0 \\
        --total-steps 1000000 --out ref.json
    python benchmarks/jaxmarl_reference.py --repo PATH/TO/JaxMARL --algorithm qmix --out qmix.json

Needs the scripts' own dependencies: jaxmarl, distrax, flashbax, hydra-core, omegaconf, wandb
(`pip install -e ".[bench]"`). The JSON holds `rows` (one per update: env_steps, win_rate, returns, wall_time
since the call began; for the Q-learning scripts also the greedy test win rate where the script tested) and
`wall`, the seconds of the whole `jit(train)(key)` call, compilation included.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

# algorithm -> (the script, its YAML configs in the order the script merges them)
SCRIPTS = {
    "mappo": (os.path.join("baselines", "MAPPO", "mappo_rnn_smax.py"),
              [os.path.join("baselines", "MAPPO", "config", "mappo_homogenous_rnn_smax.yaml")]),
    "ippo": (os.path.join("baselines", "IPPO", "ippo_rnn_smax.py"),
             [os.path.join("baselines", "IPPO", "config", "ippo_rnn_smax.yaml")]),
}
# QMIX, VDN and IQL: one script each, sharing the QLearning configs (its YAML says "valid for iql, vdn, qmix")
SCRIPTS.update({
    algorithm: (os.path.join("baselines", "QLearning", f"{algorithm}_rnn.py"),
                [os.path.join("baselines", "QLearning", "config", "config.yaml"),
                 os.path.join("baselines", "QLearning", "config", "alg", "ql_rnn_smax.yaml")])
    for algorithm in ("qmix", "vdn", "iql")})


PPO_SCRIPTS = ("mappo", "ippo")  # they log and count steps alike; the Q-learning scripts differ

DEPENDENCIES = ("jaxmarl", "distrax", "flashbax", "hydra", "omegaconf", "wandb")  # what the scripts import


def check_reference(repo: str, *algorithms: str) -> str | None:
    """Why the reference scripts of `algorithms` cannot run (the first one's file missing from `repo`, else the
    modules they import that are not installed), or None."""
    for algorithm in algorithms:
        path = os.path.join(repo, SCRIPTS[algorithm][0])
        if not os.path.exists(path):
            return f"{path} not found: the path given must be a checkout of the JaxMARL repository"
    missing = [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]
    if missing:
        return f"JaxMARL's script needs {', '.join(missing)}: pip install -e \".[bench]\""
    return None


def load_script(repo: str, algorithm: str = "mappo"):
    """The reference script as a module, imported from the repository checkout."""
    problem = check_reference(repo, algorithm)
    if problem:
        raise SystemExit(f"error: {problem}")
    path = os.path.join(repo, SCRIPTS[algorithm][0])
    spec = importlib.util.spec_from_file_location(f"jaxmarl_{algorithm}_rnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_config(repo: str, algorithm: str, scenario: str, seed: int, total_steps: int) -> dict:
    """The script's own YAML config with the scenario, seed and budget set (everything else untouched;
    the Q-learning scripts' callback, which our recorder replaces, runs only when wandb is not "disabled")."""
    from omegaconf import OmegaConf

    config = {}
    for path in SCRIPTS[algorithm][1]:
        config.update(OmegaConf.to_container(OmegaConf.load(os.path.join(repo, path))))
    config.update(MAP_NAME=scenario, SEED=seed, TOTAL_TIMESTEPS=total_steps,
                  WANDB_MODE="disabled" if algorithm in PPO_SCRIPTS else "offline")
    return config


def run(repo: str, scenario: str, seed: int, total_steps: int, algorithm: str = "mappo") -> dict:
    import jax

    module = load_script(repo, algorithm)
    config = reference_config(repo, algorithm, scenario, seed, total_steps)
    rows: list[dict] = []
    start = time.perf_counter()

    def record(metrics: dict) -> None:  # stands in for wandb.log, called once per update by the script
        if algorithm in PPO_SCRIPTS:
            row = {"env_steps": int(metrics["env_step"]), "win_rate": float(metrics["win_rate"]),
                   "episode_return": float(metrics["returns"])}
        else:  # the last finished episode's outcome per env and step, averaged (SMAXLogWrapper)
            row = {"env_steps": int(metrics["env_step"]), "win_rate": float(metrics["returned_won_episode"]),
                   "episode_return": float(metrics["returned_episode_returns"]),
                   "test_win_rate": float(metrics["test_returned_won_episode"])}
        rows.append({**row, "wall_time": time.perf_counter() - start})

    module.wandb.log = record
    if algorithm in PPO_SCRIPTS:
        train = jax.jit(module.make_train(config))
    else:
        env, _ = module.env_from_config(config)
        train = jax.jit(module.make_train(config, env))
    out = train(jax.random.PRNGKey(seed))
    jax.block_until_ready(out)
    wall = time.perf_counter() - start
    if algorithm in PPO_SCRIPTS:
        # The PPO scripts log env_step = update index * batch; count steps taken, as ours does, from the end of
        # each update (the Q-learning scripts count them so already).
        batch = config["NUM_ENVS"] * config["NUM_STEPS"]
        for row in rows:
            row["env_steps"] += batch
    return {"scenario": scenario, "seed": seed, "total_steps": total_steps, "wall": wall,
            "env_steps": rows[-1]["env_steps"] if rows else 0, "config": config, "rows": rows}


def run_in_subprocess(repo: str, algorithm: str, scenario: str, seed: int, total_steps: int, every: int,
                      xla_flags: str = "") -> dict:
    """`run` in a Python process of its own (with `xla_flags` added to XLA_FLAGS), so that the script's imports
    and compile caches stay out of the caller's. Its per-update rows are averaged over windows of `every`
    updates, as a jaxrl run averages the updates between two logs: {"rows": [{env_steps, wall_time, win_rate}
    at each window's end], "wall", "env_steps", "last": the last per-update row}."""
    import statistics
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ)
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ref.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--repo", repo, "--algorithm", algorithm,
                        "--scenario", scenario, "--seed", str(seed), "--total-steps", str(total_steps),
                        "--out", out], check=True, env=env)
        with open(out) as f:
            result = json.load(f)
    per_update = result["rows"]
    rows = [{"env_steps": window[-1]["env_steps"], "wall_time": window[-1]["wall_time"],
             "win_rate": statistics.mean(r["win_rate"] for r in window)}
            for window in (per_update[end - every:end] for end in range(every, len(per_update) + 1, every))]
    return {"rows": rows, "wall": result["wall"], "env_steps": result["env_steps"], "last": per_update[-1]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="a checkout of the JaxMARL repository")
    parser.add_argument("--algorithm", choices=sorted(SCRIPTS), default="mappo")
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--out", required=True, help="where to write the JSON")
    args = parser.parse_args(argv)
    result = run(args.repo, args.scenario, args.seed, args.total_steps, args.algorithm)
    with open(args.out, "w") as f:
        json.dump(result, f, default=str)  # (a Q-learning config holds the scenario object its script made)
    script = os.path.basename(SCRIPTS[args.algorithm][0])
    print(f"jaxmarl {script} {args.scenario} seed {args.seed}: {result['env_steps']:,} env steps in "
          f"{result['wall']:.0f} s ({result['env_steps'] / result['wall']:,.0f}/s incl. compile); final training "
          f"win rate {result['rows'][-1]['win_rate']:.2f}")


if __name__ == "__main__":
    main()
