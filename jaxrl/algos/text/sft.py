"""Supervised fine-tuning on a text task's reference answers (`text_sft`): one update, per seed, under `shard_map`
over the `data` axis (prompts split over devices, parameters replicated, gradients averaged):

    sample B training problems -> prompts [B, P], answers [B, A] -> -mean log p(answer token) -> Adam

or OTR's one-token rollouts of the same answers (sft.objective). On a multi-turn task the answers are demonstration
episodes, some of which the learner may start (sft.roll_in: DAgger)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from envs import text
from envs.text import render
from jaxrl import engine, knobs, losses, mesh as mesh_lib, multi_turn, sampling
from jaxrl.algos.registry import Recipe, register
from jaxrl.algos.text.policy import (INIT_FROM, TextHyperparams, TextPolicy, TextSettings, TextState, check_init_from,
                                     check_text_config, model_source, text_algorithm, text_config, text_settings)
from jaxrl.engine import gradient_step
from jaxrl.knobs import knob
from jaxrl.mesh import DATA_AXIS


def sft_batch(policy: TextPolicy, sft: SFTSettings, params, key: jax.Array):
    """This device's share of B training problems: (prompts [b, P], answers [b, A], imitated [b, A]: the answer
    slots learned, a multi-turn demonstration's `imitated_slots`, else every real token). With `sft.roll_in`, that
    share of the demonstrations starts from the learner's own first turns (`roll_in_episodes`)."""
    problems = policy.task.sample(key, policy.settings.num_prompts, "train")
    problems = jax.tree.map(mesh_lib.local_share, problems)
    prompts = policy.task.prompts(problems, policy.vocab)
    if not policy.multi_turn:
        answers = policy.task.reference_answers(problems, policy.vocab)
        # (not `!= pad`: a model whose padding is its EOS, as SmolLM2's <|im_end|>, would never learn to stop)
        return prompts, answers, render.through_first_eos(answers, policy.vocab.eos_id)
    if sft.roll_in == 0:
        answers = policy.task.reference_answers(problems, policy.vocab)
        return prompts, answers, policy.task.imitated_slots(answers, policy.vocab)
    answers, learner_turns = roll_in_episodes(policy, sft, params, problems, prompts, jax.random.fold_in(key, 1))
    turn_of, _ = policy.task.turn_slots()
    imitated = policy.task.imitated_slots(answers, policy.vocab) & (turn_of >= learner_turns[:, None])
    return prompts, answers, imitated


def roll_in_episodes(policy: TextPolicy, sft: SFTSettings, params, problems, prompts: jax.Array, key: jax.Array):
    """DAgger's roll-in (Ross et al., 2011): on a drawn `sft.roll_in` share of the problems the learner plays the
    first `sft.roll_in_turns` turns (at `sft.roll_in_temperature`, without gradient) and the demonstrator continues
    from the state they reached; the rest are the demonstrator's own. (episodes int32 [b, N], the learner's turns per
    episode int32 [b]: not imitated.)"""
    draw_key, play_key = jax.random.split(key)
    B = policy.settings.num_prompts  # (draws of the whole batch, this device's share taken: as the problems)
    learner = jax.lax.stop_gradient(multi_turn.play(
        policy.model, params, policy.task, policy.vocab, problems, prompts,
        mesh_lib.local_share(jax.random.split(play_key, B)), group_size=1, temperature=sft.roll_in_temperature,
        turns=sft.roll_in_turns).tokens[:, 0])
    rolled_in = mesh_lib.local_share(jax.random.uniform(draw_key, (B,))) < sft.roll_in
    learner_turns = jnp.where(rolled_in, sft.roll_in_turns, 0)
    return policy.task.reference_answers(problems, policy.vocab, learner, learner_turns), learner_turns


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """What SFT learns the reference answers by."""

    objective: str = knob("sft.objective", "likelihood", "likelihood: cross-entropy on the reference tokens; "
                          "one_token_rollout: OTR, each token a one-step rollout of sft.samples draws rewarded by "
                          "matching the reference token (a policy gradient)", choices=("likelihood", "one_token_rollout"))
    samples: int = knob("sft.samples", 8, "one_token_rollout: tokens drawn at each position", minimum=2)
    roll_in: float = knob("sft.roll_in", 0.0, "multi-turn tasks: the share of demonstrations that start from the "
                          "learner's own first sft.roll_in_turns turns, the demonstrator continuing from where they "
                          "led (DAgger): imitation then covers the states the learner's own mistakes reach",
                          minimum=0.0, maximum=1.0)
    roll_in_turns: int = knob("sft.roll_in_turns", 1, "sft.roll_in: the learner's turns before the demonstrator's",
                              minimum=1)
    roll_in_temperature: float = knob("sft.roll_in_temperature", 1.0, "sft.roll_in: the learner's sampling "
                                      "temperature (0: greedy, the states a greedy evaluation reaches)", minimum=0.0)


def sft_loss(policy: TextPolicy, sft: SFTSettings, params, batch, hp: TextHyperparams):
    """-mean log p(answer token) over this batch's answers (averaged over devices), or OTR's loss on them; metrics
    beside it (the negative log-likelihood either way)."""
    prompts, answers, imitated, key = batch
    mask = imitated.astype(jnp.float32)
    # a demonstration episode: learn the model's turns, attend to the environment's too
    attend = answers != policy.vocab.pad_id if policy.multi_turn else None
    logits, _ = sampling.completion_logits(policy.update_model, params, prompts, answers, mask, policy.vocab.pad_id,
                                           attend)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), answers[..., None], axis=-1)[..., 0] * mask
    nll = losses.aggregate(-log_probs, mask, "token", axis_name=DATA_AXIS)
    if sft.objective == "one_token_rollout":
        rollouts = losses.aggregate(losses.one_token_rollouts(logits, answers, key, sft.samples), mask, "token",
                                    axis_name=DATA_AXIS)
        return rollouts, {"loss": nll, "otr_loss": rollouts, "token_accuracy": _token_accuracy(log_probs, mask)}
    return nll, {"loss": nll, "token_accuracy": _token_accuracy(log_probs, mask)}


def _token_accuracy(log_probs: jax.Array, mask: jax.Array) -> jax.Array:
    """p > 1/2 makes the reference token the argmax: a cheap lower bound on teacher-forced accuracy."""
    correct = (log_probs > np.log(0.5)) | (mask == 0)
    return losses.aggregate(correct.astype(jnp.float32), mask, "token", axis_name=DATA_AXIS)


def sft_update(policy: TextPolicy, sft: SFTSettings, state: TextState, hp: TextHyperparams):
    """One SFT update for one seed on this device: one gradient step on a fresh batch."""
    key, batch_key, loss_key = jax.random.split(state.key, 3)
    optimizer = policy.optimizer(hp, state.update_step)
    loss_key = jax.random.fold_in(loss_key, jax.lax.axis_index(DATA_AXIS))  # (each device's own draws)
    batch = sft_batch(policy, sft, state.params, batch_key)
    params, opt_state, metrics = gradient_step(functools.partial(sft_loss, policy, sft), optimizer, state.params,
                                               state.opt_state, (*batch, loss_key), hp)
    return TextState(params, opt_state, key, state.update_step + 1), metrics


def text_sft(settings: TextSettings, mesh, starts_from: str = "",
             sft: SFTSettings = SFTSettings()) -> engine.Algorithm:
    """Supervised fine-tuning of the small transformer (from scratch) or of a pretrained model (from its parameters,
    those of `starts_from`) on a text task (see the module docstring); `parts`: its policy."""
    policy = TextPolicy(settings, mesh)
    return text_algorithm(settings, mesh, policy, policy.init, functools.partial(sft_update, policy, sft), policy,
                          init_from_params=policy.init, starts_from=starts_from)


def check_roll_in(config: ConfigDict) -> None:
    """A roll-in needs a multi-turn task of the small models' own layout (not a pretrained model's chat turns), with
    a turn left after the learner's."""
    if config.sft.roll_in == 0:
        return
    task = config.task.name
    if not getattr(text.TASKS.get(task), "multi_turn", False) or model_source(config, config.init_from):
        raise ValueError(f"sft.roll_in = {config.sft.roll_in}: a roll-in is for the multi-turn tasks of the small "
                         f"models; task.name = {task!r}" + (" is answered in one turn" if task not in
                                                             text.MULTI_TURN_TASKS else " on a pretrained model"))
    max_turns = text.make_task(task, **config.task.kwargs).max_turns
    if config.sft.roll_in_turns >= max_turns:
        raise ValueError(f"sft.roll_in_turns = {config.sft.roll_in_turns} leaves the demonstrator no turn: {task} "
                         f"plays at most {max_turns}")


def text_sft_config() -> ConfigDict:
    """`text_config()`, the keys of how SFT learns (`SFTSettings`) and the run it may continue (init_from)."""
    return knobs.fill(text_config(), SFTSettings, INIT_FROM)


def check_text_sft_config(config: ConfigDict) -> None:
    check_text_config(config)
    check_init_from(config)
    check_roll_in(config)


def build_text_sft(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The SFT algorithm, starting from config.init_from's parameters (a saved text run's), or config.model.name's
    pretrained ones when it names a model (which the run layer reads); with `run_dir`, that saved run's (its
    tokenizer, and no warm start)."""
    settings = text_settings(config, start=run_dir or config.init_from)
    return text_sft(settings, mesh, starts_from="" if run_dir else config.init_from or settings.pretrained,
                    sft=knobs.read(SFTSettings, config))


register("text_sft", Recipe(build_text_sft, TextHyperparams, check=check_text_sft_config, defaults=text_sft_config,
                            rebuild=build_text_sft))
