"""Token-level training of the transformer policy on verifiable text tasks (envs/text).

`TextSFT` is the supervised warm start: teacher forcing on the tasks' reference solutions. It offers
the algorithm interface of `jaxrl.algos` (init_seeds, state_shardings, run_chunk, evaluate, settings,
compile_seconds), so `python -m jaxrl.train --config=experiments/text_sft.py:addition` runs it with
the same logging, checkpoints, resume and seeds as the RL algorithms; the run directory also gets
the `tokenizer.json` the model was trained with (`write_files`).

One update, per seed, under `shard_map` over the `data` axis (prompts split over devices, parameters
replicated, gradients averaged):

    sample B training problems -> prompts [B, P], answers [B, A] -> -mean log p(answer token) -> Adam

Evaluation is greedy decoding (temperature 0) on a fixed held-out set: `eval_accuracy` (pass@1) and
`eval_well_formed`. Shapes: S seeds, B prompts per update (b on one device), P prompt and A answer
tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

from envs import text
from jaxrl import losses, mesh as mesh_lib, sampling
from jaxrl.mesh import DATA_AXIS
from jaxrl.transformer import TransformerConfig, TransformerLM


@struct.dataclass
class TextHyperparams:
    """Traced numbers (a sweep may vary them)."""

    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """Static sizes and choices."""

    task: str = "addition"
    task_kwargs: tuple[tuple[str, Any], ...] = ()
    num_prompts: int = 64  # B, over all devices
    num_updates: int = 1  # over the run, for the learning-rate schedule
    warmup_updates: int = 0
    adam_eps: float = 1e-8
    model_kwargs: tuple[tuple[str, Any], ...] = ()  # TransformerConfig fields (vocab and length come from the task)
    tokenizer_corpus: int = 2000  # problems per split the tokenizer is trained on

    @property
    def batch_size(self) -> int:
        """Samples (prompt and answer pairs) per update, over all devices."""
        return self.num_prompts


@struct.dataclass
class TextState:
    """Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    key: jax.Array
    update_step: jax.Array


def make_optimizer(hp: TextHyperparams, settings: TextSettings, step: jax.Array):
    """AdamW with global-norm clipping, linear warm-up then cosine decay; built inside the trace."""
    warm = jnp.minimum(1.0, (step + 1) / max(settings.warmup_updates, 1))
    progress = jnp.clip(step / max(settings.num_updates, 1), 0.0, 1.0)
    learning_rate = hp.learning_rate * warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                       optax.scale_by_adam(eps=settings.adam_eps),
                       optax.add_decayed_weights(hp.weight_decay),
                       optax.scale(-learning_rate))


class TextSFT:
    """Supervised warm start of a `TransformerLM` on a text task (see the module docstring)."""

    def __init__(self, settings: TextSettings, mesh=None, eval_seed: int = 1234):
        self.settings = settings
        self.task = text.make_task(settings.task, **dict(settings.task_kwargs))
        self.tokenizer = text.train_tokenizer(text.corpus([self.task], settings.tokenizer_corpus))
        self.vocab = text.Vocab.from_tokenizer(self.tokenizer)
        self.model = TransformerLM(TransformerConfig(
            vocab_size=self.vocab.size, max_len=self.task.prompt_length + self.task.answer_length,
            **dict(settings.model_kwargs)))
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        mesh_lib.check_divisible("num_prompts", settings.num_prompts, self.mesh)
        self.eval_seed = eval_seed
        self.agent_env = None  # nothing to render
        self._chunk_fn = None
        self.compile_seconds = 0.0

    def write_files(self, workdir: str) -> None:
        """The tokenizer beside the checkpoints: a run is reloadable from its directory alone."""
        text.save_tokenizer(self.tokenizer, os.path.join(workdir, "tokenizer.json"))

    # ----------------------------------------------------------------------------------------------
    # State

    def init(self, key: jax.Array) -> TextState:
        param_key, state_key = jax.random.split(key)
        length = self.task.prompt_length + self.task.answer_length
        tokens = jnp.zeros((1, length), jnp.int32)
        params = self.model.init(param_key, tokens, jnp.zeros_like(tokens), jnp.ones_like(tokens, bool))
        optimizer = make_optimizer(TextHyperparams(), self.settings, jnp.int32(0))
        return TextState(params, optimizer.init(params), state_key, jnp.int32(0))

    def init_seeds(self, seed: int, num_seeds: int) -> TextState:
        keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.arange(num_seeds))
        state = jax.jit(jax.vmap(self.init))(keys)
        return jax.device_put(state, self.state_shardings(state))

    def state_shardings(self, state: TextState) -> TextState:
        return jax.tree.map(lambda _: mesh_lib.replicated(self.mesh), state)

    # ----------------------------------------------------------------------------------------------
    # One update (inside shard_map, one seed)

    def _batch(self, key: jax.Array):
        """This device's share of B training problems: (prompts [b, P], answers [b, A])."""
        problems = self.task.sample(key, self.settings.num_prompts, "train")
        problems = jax.tree.map(mesh_lib.local_share, problems)
        return self.task.prompts(problems, self.vocab), self.task.reference_answers(problems, self.vocab)

    def _loss(self, params, prompts, answers):
        mask = (answers != self.vocab.pad_id).astype(jnp.float32)
        log_probs, _, _ = sampling.score(self.model, params, prompts, answers, mask, self.vocab.pad_id)
        nll = losses.aggregate(-log_probs, mask, "token", axis_name=DATA_AXIS)
        correct = (log_probs > np.log(0.5)) | (mask == 0)  # the reference token is the argmax
        return nll, {"loss": nll, "token_accuracy": losses.aggregate(correct.astype(jnp.float32), mask, "token",
                                                                    axis_name=DATA_AXIS)}

    def _update(self, state: TextState, hp: TextHyperparams):
        key, batch_key = jax.random.split(state.key)
        prompts, answers = self._batch(batch_key)
        grads, metrics = jax.grad(self._loss, has_aux=True)(mesh_lib.per_device(state.params), prompts, answers)
        grads, metrics = jax.lax.pmean((grads, metrics), DATA_AXIS)
        optimizer = make_optimizer(hp, self.settings, state.update_step)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
        return TextState(optax.apply_updates(state.params, updates), opt_state, key, state.update_step + 1), metrics

    def _run_updates(self, state: TextState, hp: TextHyperparams, num_updates: jax.Array):
        _, shapes = jax.eval_shape(self._update, state, hp)
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        def body(_, carry):
            state, totals = carry
            state, metrics = self._update(state, hp)
            return state, jax.tree.map(jnp.add, totals, metrics)

        state, totals = jax.lax.fori_loop(0, num_updates, body, (state, zeros))
        return state, jax.tree.map(lambda x: x / num_updates, totals)

    def run_chunk(self, state: TextState, hp: TextHyperparams, num_updates: int):
        """`num_updates` updates for every seed; returns (state, metrics with leaves [S])."""
        num_updates = jnp.int32(num_updates)
        if self._chunk_fn is None:
            local = jax.vmap(self._run_updates, (0, None, None))
            sharded = jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P(), P()), out_specs=(P(), P()))
            replicated = mesh_lib.replicated(self.mesh)
            jitted = jax.jit(sharded, out_shardings=(self.state_shardings(state), replicated), donate_argnums=0)
            tick = time.perf_counter()
            self._chunk_fn = jitted.lower(state, hp, num_updates).compile()
            self.compile_seconds = time.perf_counter() - tick
        return self._chunk_fn(state, hp, num_updates)

    # ----------------------------------------------------------------------------------------------
    # Held-out evaluation

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def _greedy(self, params, num: int):
        problems = self.task.heldout(num, seed=self.eval_seed)
        prompts = self.task.prompts(problems, self.vocab)
        samples = sampling.sample(self.model, params, prompts, jax.random.PRNGKey(0),
                                  max_new_tokens=self.task.answer_length, eos_id=self.vocab.eos_id,
                                  pad_id=self.vocab.pad_id, temperature=0.0)
        return problems, samples

    def evaluate(self, params, key: jax.Array, num: int) -> dict[str, np.ndarray]:
        """Greedy answers to `num` fixed held-out problems, per seed: eval_accuracy (pass@1),
        eval_well_formed, eval_length (tokens generated) [S]."""
        del key  # the held-out set and greedy decoding are deterministic
        num_seeds = jax.tree.leaves(params)[0].shape[0]
        out = {"eval_accuracy": [], "eval_well_formed": [], "eval_length": []}
        for s in range(num_seeds):
            problems, samples = self._greedy(jax.tree.map(lambda x: x[s], params), num)
            rewards = np.asarray(self.task.rewards(problems, samples.tokens, self.vocab))  # host or device
            names = self.task.reward_names
            out["eval_accuracy"].append(rewards[:, names.index("correct")].mean())
            out["eval_well_formed"].append(rewards[:, names.index("well_formed")].mean())
            out["eval_length"].append(float(np.asarray(samples.lengths).mean()))
        return {k: np.asarray(v) for k, v in out.items()}
