"""Supervised fine-tuning on a text task's reference answers (`text_sft`): one update, per seed, under `shard_map`
over the `data` axis (prompts split over devices, parameters replicated, gradients averaged):

    sample B training problems -> prompts [B, P], answers [B, A] -> -mean log p(answer token) -> Adam

or OTR's one-token rollouts of the same answers (sft.objective)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from jaxrl import engine, knobs, losses, mesh as mesh_lib, sampling
from jaxrl.algos.registry import Recipe, register
from jaxrl.algos.text.policy import (TextHyperparams, TextPolicy, TextSettings, TextState, check_text_config,
                                     text_algorithm, text_config, text_settings)
from jaxrl.engine import gradient_step
from jaxrl.knobs import knob
from jaxrl.mesh import DATA_AXIS


def sft_batch(policy: TextPolicy, key: jax.Array):
    """This device's share of B training problems: (prompts [b, P], answers [b, A], imitated [b, A]: the answer
    slots learned, a multi-turn demonstration's `imitated_slots`, else every real token)."""
    problems = policy.task.sample(key, policy.settings.num_prompts, "train")
    problems = jax.tree.map(mesh_lib.local_share, problems)
    answers = policy.task.reference_answers(problems, policy.vocab)
    imitated = (policy.task.imitated_slots(answers, policy.vocab) if policy.multi_turn
                else answers != policy.vocab.pad_id)
    return policy.task.prompts(problems, policy.vocab), answers, imitated


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """What SFT learns the reference answers by."""

    objective: str = knob("sft.objective", "likelihood", "likelihood: cross-entropy on the reference tokens; "
                          "one_token_rollout: OTR, each token a one-step rollout of sft.samples draws rewarded by "
                          "matching the reference token (a policy gradient)", choices=("likelihood", "one_token_rollout"))
    samples: int = knob("sft.samples", 8, "one_token_rollout: tokens drawn at each position", minimum=2)


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
    params, opt_state, metrics = gradient_step(functools.partial(sft_loss, policy, sft), optimizer, state.params,
                                               state.opt_state, (*sft_batch(policy, batch_key), loss_key), hp)
    return TextState(params, opt_state, key, state.update_step + 1), metrics


def text_sft(settings: TextSettings, mesh, starts_from: str = "",
             sft: SFTSettings = SFTSettings()) -> engine.Algorithm:
    """Supervised fine-tuning of the small transformer (from scratch) or of a pretrained model (from its parameters,
    those of `starts_from`) on a text task (see the module docstring); `parts`: its policy."""
    policy = TextPolicy(settings, mesh)
    return text_algorithm(settings, mesh, policy, policy.init, functools.partial(sft_update, policy, sft), policy,
                          init_from_params=policy.init, starts_from=starts_from)


def text_sft_config() -> ConfigDict:
    """`text_config()` and the keys of how SFT learns (`SFTSettings`)."""
    return knobs.fill(text_config(), SFTSettings)


def build_text_sft(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The SFT algorithm, starting from config.model.name's pretrained parameters when it names a model (which the
    run layer reads); with `run_dir`, that saved run's (its tokenizer, and no warm start)."""
    settings = text_settings(config, start=run_dir)
    return text_sft(settings, mesh, starts_from="" if run_dir else settings.pretrained,
                    sft=knobs.read(SFTSettings, config))


register("text_sft", Recipe(build_text_sft, TextHyperparams, check=check_text_config, defaults=text_sft_config,
                            rebuild=build_text_sft))
