"""jaxrl PPO against Brax's own PPO trainer (`brax.training.agents.ppo`), same env, backend and settings, one process.

    python benchmarks/brax_ppo.py                                   # halfcheetah, spring backend, 9 seeds, 1.024M steps
    python benchmarks/brax_ppo.py --env ant --backend positional --total-steps 5000000 --update-results

Both train `--seeds` seeds of PPO on the same Brax env (episodes of 1000 steps, auto-reset to the first state,
observation normalisation) with the settings of `experiments/brax_ppo.py` at `--num-envs` envs: each update
rolls out every env for `num_steps` steps, then runs `num_epochs` epochs of `num_minibatches` minibatches.
Brax's trainer gets the same numbers (`batch_size * num_minibatches = num_envs`, so one unroll per training
step; `unroll_length = num_steps`, `num_updates_per_batch = num_epochs`) and the same networks (four layers
of 256 swish units for the policy and the value, a tanh-squashed Gaussian). What still differs, by design of
each trainer: Brax's policy scale is softplus(x) + 0.001 where ours is exp(log_std); Brax trains one seed per
call, jaxrl all seeds in one program (as its users run seeds).

Reported: env steps per second of each, whole calls (compile and the evaluations included) and the ratio;
the greedy return (the mean action) over 16 episodes at the end of each seed's training, at equal env steps.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jaxrl import config as config_lib, train  # noqa: E402
from jaxrl.run.summary import confidence_interval  # noqa: E402
import report  # noqa: E402
from report import markdown_table, per_seed, publish  # noqa: E402

MARKERS = ("<!-- brax_ppo:start -->", "<!-- brax_ppo:end -->")
EVAL_EPISODES = 16
EPISODE_LENGTH = 1000


def jaxrl_config(args):
    """experiments/brax_ppo.py at the benchmark's sizes."""
    config = config_lib.from_file(os.path.join(os.path.dirname(HERE), "experiments", f"brax_ppo.py:{args.env}"))
    return config_lib.set_values(config, {
        "env.kwargs.backend": args.backend, "num_seeds": args.seeds, "seed": args.seed, "total_steps": args.total_steps,
        "num_envs": args.num_envs, "num_steps": args.num_steps, "optim.num_epochs": args.num_epochs,
        "optim.num_minibatches": args.num_minibatches, "log.progress_bar": False,
        "log.every_steps": args.total_steps // args.evals, "eval.every_steps": args.total_steps,
        "eval.episodes": EVAL_EPISODES, "checkpoint.every_steps": args.total_steps})


def run_jaxrl(args, workdir: str) -> dict:
    config = jaxrl_config(args)
    tick = time.perf_counter()
    result = train.run(config, workdir)
    seconds = time.perf_counter() - tick
    last = result.metrics[-1]
    return {"seconds": seconds, "env_steps": last["env_steps"] * args.seeds,
            "eval_return": per_seed(last, "eval_return", args.seeds)}


def supply_device_put_replicated() -> None:
    """Brax 0.14.2's trainer still calls `jax.device_put_replicated`, which this jax only names to refuse it:
    give it the drop-in replacement of JAX's pmap migration guide (stack one copy per device, shard the stack)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def device_put_replicated(tree, devices):
        sharding = NamedSharding(Mesh(np.array(devices), ("devices",)), P("devices"))
        return jax.tree.map(lambda x: jax.device_put(jnp.stack([jnp.asarray(x)] * len(devices)), sharding), tree)

    try:
        jax.device_put_replicated  # noqa: B018  (raises AttributeError where it is gone)
    except AttributeError:
        jax.device_put_replicated = device_put_replicated


def run_brax(args, config) -> dict:
    """Brax's trainer, one call per seed, with the settings `config` trains jaxrl on."""
    supply_device_put_replicated()
    from brax import envs as brax_envs
    from brax.training.agents.ppo import networks as ppo_networks, train as ppo

    import flax.linen as nn

    env = brax_envs.get_environment(args.env, backend=args.backend)
    networks = functools.partial(ppo_networks.make_ppo_networks,
                                 policy_hidden_layer_sizes=tuple(config.network.hidden_sizes),
                                 value_hidden_layer_sizes=tuple(config.network.hidden_sizes), activation=nn.swish)
    returns, seconds, steps = [], 0.0, 0
    for seed in range(args.seed, args.seed + args.seeds):
        tick = time.perf_counter()
        _, _, metrics = ppo.train(
            environment=env, num_timesteps=args.total_steps, num_envs=args.num_envs, episode_length=EPISODE_LENGTH,
            action_repeat=1, learning_rate=config.optim.learning_rate, entropy_cost=config.loss.ent_coef,
            discounting=config.returns.gamma, gae_lambda=config.returns.gae_lambda,
            unroll_length=args.num_steps, batch_size=args.num_envs // args.num_minibatches,
            num_minibatches=args.num_minibatches, num_updates_per_batch=args.num_epochs,
            normalize_observations=True, reward_scaling=config.returns.reward_scale,
            clipping_epsilon=config.loss.clip_low, clipping_epsilon_value=config.loss.value_clip or None,
            max_grad_norm=config.optim.max_grad_norm,
            vf_loss_coefficient=config.loss.vf_coef, network_factory=networks, seed=seed, num_evals=2,
            num_eval_envs=EVAL_EPISODES, deterministic_eval=True)
        seconds += time.perf_counter() - tick
        steps += args.total_steps
        returns.append(float(metrics["eval/episode_reward"]))
    return {"seconds": seconds, "env_steps": steps, "eval_return": returns}


def section(args, ours: dict, brax: dict, machine: str, command: str) -> str:
    speed = {name: r["env_steps"] / r["seconds"] for name, r in (("jaxrl", ours), ("brax", brax))}
    rows = []
    for name, label, r in (("brax", "Brax's PPO trainer, one call per seed", brax),
                           ("jaxrl", "jaxrl PPO, the seeds in one program", ours)):
        returns = np.asarray(r["eval_return"], float)
        mean, low, high = confidence_interval(returns)
        rows.append([label, f"{speed[name]:,.0f}", f"{speed[name] / speed['brax']:.2f}x", f"{r['seconds']:.0f}",
                     f"{mean:.0f} [{low:.0f}, {high:.0f}]", f"{returns.min():.0f} .. {returns.max():.0f}",
                     ", ".join(f"{x:.0f}" for x in returns)])
    header = ["", "env steps/s, whole calls", "x Brax", "wall s, all seeds",
              f"greedy return after {args.total_steps:,} steps, mean [95% interval]", "seeds' range", "per seed"]
    return "\n".join([
        f"- Date: {time.strftime('%Y-%m-%d')}. Machine: {machine}. Command: `{command}`.",
        f"- {args.env}, backend {args.backend}, {args.seeds} seeds, {args.num_envs} envs x {args.num_steps} steps per "
        f"update, {args.num_epochs} epochs of {args.num_minibatches} minibatches; the greedy return is the mean of "
        f"{EVAL_EPISODES} episodes of {EPISODE_LENGTH} steps per seed.",
        "", f"Speed: jaxrl / Brax = **{speed['jaxrl'] / speed['brax']:.2f}x**.", "",
        markdown_table(header, rows)])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="halfcheetah")
    parser.add_argument("--backend", default="spring", help="Brax backend (spring is the fastest on a CPU)")
    parser.add_argument("--seeds", type=int, default=9,
                        help="seeds per side (one halfcheetah seed's greedy return at 1M steps may land anywhere "
                             "from 2,000 to 3,800: 3 seeds cannot tell the trainers apart)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the first seed: Brax trains seeds SEED.., jaxrl its runs from config.seed = SEED")
    parser.add_argument("--only", choices=("brax", "jaxrl"), help="run one side alone (e.g. more seeds of it)")
    parser.add_argument("--total-steps", type=int, default=1_024_000, help="env steps per seed (whole updates)")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--num-steps", type=int, default=20)
    parser.add_argument("--num-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=8)
    parser.add_argument("--evals", type=int, default=10, help="jaxrl's log rows over the run")
    parser.add_argument("--update-results", action="store_true")
    args = parser.parse_args()
    batch = args.num_envs * args.num_steps
    if args.only and args.update_results:
        raise SystemExit("error: --update-results records both sides; leave out --only")
    if args.num_envs % args.num_minibatches or args.total_steps % batch:
        raise SystemExit(f"error: --num-envs must be a multiple of --num-minibatches, and --total-steps of "
                         f"num_envs * num_steps = {batch}")
    command = "python benchmarks/brax_ppo.py " + " ".join(sys.argv[1:])
    machine = report.machine()
    with tempfile.TemporaryDirectory() as workdir:
        brax = run_brax(args, jaxrl_config(args)) if args.only != "jaxrl" else None
        ours = run_jaxrl(args, workdir) if args.only != "brax" else None
    if args.only:
        side = brax or ours
        returns = np.asarray(side["eval_return"], float)
        print(f"{args.only}: {side['env_steps'] / side['seconds']:,.0f} env steps/s; greedy return after "
              f"{args.total_steps:,} steps, seeds {args.seed}..{args.seed + args.seeds - 1}: "
              f"{np.round(returns, 1).tolist()}, mean {returns.mean():.1f}")
        return
    publish(section(args, ours, brax, machine, command.strip()), args.update_results, MARKERS,
            "PPO on Brax against Brax's own PPO trainer (issue 18)")


if __name__ == "__main__":
    main()
