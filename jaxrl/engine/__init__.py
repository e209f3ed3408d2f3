"""The engine every algorithm stands on: the Algorithm record (an algorithm as a value), the one chunk compiler, seeding, the
optimiser and its schedules, minibatch gradient steps, statistics over the global batch, and (`engine.acting`, imported
by its users) acting in auto-resetting envs and learning from a replay buffer, as the off-policy learners share them.

    config -> algorithm (algos/) -> compile_per_run(repeat_updates(update)) -> run_chunk -> jaxrl.train
                                    update = rollout -> advantages -> loss -> optimise (gradient_step)

Leaf modules (advantages, losses, networks, distributions, transformer, sampling, mesh) sit below the
engine; algorithms above it; the host loop (`jaxrl.train`, `jaxrl.sweep`) on top.
"""

from jaxrl.engine.algorithm import Algorithm
from jaxrl.engine.chunks import (chunk_metrics, compile_chunk, compile_per_run, describe_xla_choice,
                                 repeat_updates, seed_keys)
from jaxrl.engine.minibatches import deal_minibatches, gradient_step, minibatch_block_size, optimise
from jaxrl.engine.optim import (GRAD_CLIPS, SCHEDULES, clip_each_network, float32_master, make_optimizer,
                                scheduled_learning_rate, OptimizerSettings)
from jaxrl.engine.stats import global_mean, normalize, standardise

__all__ = ["Algorithm", "GRAD_CLIPS", "SCHEDULES", "chunk_metrics",
           "clip_each_network", "compile_chunk", "compile_per_run", "deal_minibatches", "describe_xla_choice",
           "float32_master", "global_mean", "gradient_step", "make_optimizer", "minibatch_block_size", "normalize", "optimise",
           "repeat_updates", "scheduled_learning_rate", "OptimizerSettings", "seed_keys", "standardise"]
