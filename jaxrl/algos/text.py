"""Token-level training of the transformer policy on verifiable text tasks (envs/text).

`TextSFT` is the supervised warm start: teacher forcing on the tasks' reference solutions. It follows
`jaxrl.engine.Algorithm`, so `python -m jaxrl.train --config=experiments/text_sft.py:addition` runs it with
the same logging, checkpoints, resume and seeds as the RL algorithms; the run directory also gets
the `tokenizer.json` the model was trained with (`write_files`).

One update, per seed, under `shard_map` over the `data` axis (prompts split over devices, parameters
replicated, gradients averaged):

    sample B training problems -> prompts [B, P], answers [B, A] -> -mean log p(answer token) -> Adam

Evaluation is greedy decoding (temperature 0) on a fixed held-out set: `eval_accuracy` (pass@1) and
`eval_well_formed`, and `eval_pass@k` from k samples per problem at temperature 1. Shapes: S seeds,
B prompts per update (b on one device), P prompt and A answer tokens.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from ml_collections import ConfigDict

from envs import text
from jaxrl import config as config_lib, files, knobs, losses, mesh as mesh_lib, rollout, sampling
from jaxrl.algos import text_rollout  # noqa: F401  (registers the built-in rollout strategies)
from jaxrl.algos.group import (ADVANTAGE, CRITIC_WEIGHT, GROUP_SIZE, advantage_options,
                               group_relative_keys)
from jaxrl.algos.registry import Recipe, register
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import (ChunkRunner, global_mean, gradient_step, make_optimizer, optimise,
                          scheduled_learning_rate, seed_keys, standardise)
from jaxrl.jitting import jit_method
from jaxrl.knobs import Knob, knob
from jaxrl.mesh import DATA_AXIS
from jaxrl.transformer import TransformerConfig, TransformerLM


TASK_NAME = Knob("task.name", "addition", "a verifiable text task (envs.text.TASKS)", choices=lambda: sorted(text.TASKS))
TASK_KWARGS = Knob("task.kwargs", {}, "the task's own arguments, e.g. {max_digits: 3}")
MODEL_KNOBS = (
    Knob("model.num_layers", 2, "the transformer's layers", minimum=1),
    Knob("model.d_model", 128, "the transformer's width (a multiple of num_heads)", minimum=1),
    Knob("model.num_heads", 4, "attention heads", minimum=1),
    Knob("model.d_ff", 0, "the MLP's hidden size; 0: 4 * d_model", minimum=0),
    Knob("model.max_len", 48, "positions: prompt and answer tokens (RL on longer problems needs room)", minimum=1),
)
INIT_FROM = Knob("init_from", "", "a text_sft run directory to start from (its newest checkpoint and tokenizer.json); "
                 "'': from scratch")


@struct.dataclass
class TextHyperparams:
    """Traced numbers (a sweep may vary them)."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """Static sizes and choices."""

    task: str = "addition"
    task_kwargs: tuple[tuple[str, Any], ...] = ()
    num_prompts: int = knob("num_prompts", 64, "prompts per update (B), split over devices", minimum=1)
    num_updates: int = 1  # over the run, for the learning-rate schedule
    schedule: str = "cosine"  # engine.SCHEDULES
    warmup_updates: int = 0
    adam_eps: float = 1e-8
    weight_decay: bool = False  # the optimiser decays weights (by the traced hp.weight_decay)
    grad_clip: str = "joint"  # engine.GRAD_CLIPS
    model_kwargs: tuple[tuple[str, Any], ...] = ()  # TransformerConfig fields (the vocabulary comes from the tokenizer)
    tokenizer_corpus: int = 2000  # problems per split the tokenizer is trained on
    tokenizer_path: str | None = None  # load this tokenizer.json instead of training one (RL from an SFT run)
    pass_k: int = knob("eval.pass_k", 8, "held-out samples per problem for eval_pass@k; 0: greedy evaluation only",
                       minimum=0)
    xla_options: tuple[tuple[str, str | bool], ...] | str = ()  # the training programs' XLA options, or "auto"

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


def text_optimizer(hp: TextHyperparams, settings: TextSettings, step: jax.Array):
    """Adam (AdamW with weight decay) with global-norm clipping, the learning rate on `settings.schedule`."""
    learning_rate = scheduled_learning_rate(hp.learning_rate, step, settings.schedule, settings.warmup_updates,
                                            settings.num_updates)
    return make_optimizer(learning_rate, hp.max_grad_norm, settings.adam_eps, settings.grad_clip,
                          hp.weight_decay if settings.weight_decay else None)


class _TextAlgorithm(ChunkRunner):
    """What the text algorithms share: task, tokenizer, model, state, the chunk loop, held-out evaluation.

    Subclasses define `_update(state, hp) -> (state, metrics)` for one seed on this device's prompts (run
    by `run_chunk` as one compiled loop).
    """

    def __init__(self, settings: TextSettings, mesh=None, init_params=None, eval_seed: int = 1234):
        self.settings = settings
        self.start_params = init_params  # [S', ...] or None: seed s starts from seed s mod S' of these
        self.task = text.make_task(settings.task, **dict(settings.task_kwargs))
        self.tokenizer = (text.load_tokenizer(settings.tokenizer_path) if settings.tokenizer_path else
                          text.train_tokenizer(text.corpus([self.task], settings.tokenizer_corpus)))
        self.vocab = text.Vocab.from_tokenizer(self.tokenizer)
        self.model = TransformerLM(TransformerConfig(vocab_size=self.vocab.size, **dict(settings.model_kwargs)))
        needed = self.task.prompt_length + self.task.answer_length
        if self.model.config.max_len < needed:
            raise ValueError(f"model.max_len={self.model.config.max_len} cannot hold this task's prompt and "
                             f"answer ({self.task.prompt_length} + {self.task.answer_length} tokens)")
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        mesh_lib.check_divisible("num_prompts", settings.num_prompts, self.mesh)
        self.eval_seed = eval_seed
        self.agent_env = None  # nothing to render

    def write_files(self, workdir: str) -> None:
        """The tokenizer beside the checkpoints: a run is reloadable from its directory alone."""
        files.write_atomic(os.path.join(workdir, "tokenizer.json"), self.tokenizer.to_str())

    def write_artifacts(self, workdir: str, params, seed: int, sample: bool = False, num: int = 16) -> list[str]:
        """`sample_completions.txt`: the first run's answers (params leaves [R, ...]) to `num` held-out
        problems, greedy or sampled at temperature 1, each with the reference answer and its rewards."""
        problems = self.task.heldout(num, seed=self.eval_seed)
        actor = self.actor(jax.tree.map(lambda x: x[0], params))
        key = jax.random.PRNGKey(seed) if sample else None
        completions = actor(self.task.prompts(problems, self.vocab), key)
        rewards = np.asarray(self.task.jax_rewards(problems, completions, self.vocab))
        lines = [f"# {num} held-out problems, {'sampled at temperature 1' if sample else 'greedy'}; rewards: "
                 + ", ".join(self.task.reward_names)]
        for (prompt, answer), completion, reward in zip(self.task.texts(problems),
                                                        text.decode(self.tokenizer, completions), rewards):
            lines.append(f"{prompt!r} -> {completion!r} (reference {answer!r}; rewards "
                         + ", ".join(f"{r:g}" for r in reward) + ")")
        path = os.path.join(workdir, "sample_completions.txt")
        files.write_atomic(path, "\n".join(lines) + "\n")
        return [path]

    def actor(self, params) -> "TextActor":
        """One run's model as a jitted function of prompts (`TextActor`)."""
        return TextActor(self, params)

    # ----------------------------------------------------------------------------------------------
    # State

    def init_params(self, key: jax.Array):
        tokens = jnp.zeros((1, self.model.config.max_len), jnp.int32)
        return self.model.init(key, tokens, jnp.zeros_like(tokens), jnp.ones_like(tokens, bool))

    def init(self, key: jax.Array, params=None) -> TextState:
        """A fresh state for one seed, from `params` when given (a warm start) else a new initialisation."""
        param_key, state_key = jax.random.split(key)
        params = self.init_params(param_key) if params is None else params
        optimizer = text_optimizer(TextHyperparams(), self.settings, jnp.int32(0))
        return TextState(params, optimizer.init(params), state_key, jnp.int32(0))

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1) -> TextState:
        """TextState with a leading run axis [R = num_settings * num_seeds] (see `seed_keys`), on the mesh."""
        params, num_runs = None, num_settings * num_seeds
        if self.start_params is not None:
            available = jax.tree.leaves(self.start_params)[0].shape[0]
            params = jax.tree.map(lambda x: x[jnp.arange(num_runs) % num_seeds % available], self.start_params)
        mesh_lib.check_runs(num_runs, self.mesh)
        state = self._init_runs(seed_keys(seed, num_seeds, num_settings), params)
        return jax.device_put(state, self.state_shardings(state))

    @jit_method
    def _init_runs(self, keys: jax.Array, params) -> TextState:
        """One state per key [R, 2], from params [R, ...] or fresh (compiled once per run count)."""
        return jax.vmap(self.init)(keys, params)

    # ----------------------------------------------------------------------------------------------
    # Held-out evaluation

    @jit_method(static_argnums=(3, 4))
    def _heldout_rewards(self, params, key: jax.Array, num: int, sample: bool = False):
        """Every seed's answers [S, ...] to `num` fixed held-out problems: greedy, or one sample at temperature
        1 with `sample` (rewards [S, num, K], lengths [S, num]), and `pass_k` samples at temperature 1
        (rewards [S, num, k, K]; k may be 0)."""
        problems = self.task.heldout(num, seed=self.eval_seed)
        prompts = self.task.prompts(problems, self.vocab)
        decoding = dict(max_new_tokens=self.task.answer_length, eos_id=self.vocab.eos_id, pad_id=self.vocab.pad_id)
        rewards = lambda completions: self.task.jax_rewards(problems, completions, self.vocab)

        def one_seed(params):
            greedy = sampling.sample(self.model, params, prompts, key, temperature=1.0 if sample else 0.0,
                                     **decoding)
            if not self.settings.pass_k:
                return rewards(greedy.tokens), greedy.lengths, jnp.zeros((num, 0, len(self.task.reward_names)))
            sampled = sampling.sample_groups(self.model, params, prompts, key, group_size=self.settings.pass_k,
                                             temperature=1.0, **decoding)
            return (rewards(greedy.tokens), greedy.lengths,
                    jax.vmap(rewards, in_axes=1, out_axes=1)(sampled.tokens))

        return jax.vmap(one_seed)(params)

    def evaluate(self, params, key: jax.Array, num: int, sample: bool = False) -> dict[str, np.ndarray]:
        """Answers to `num` fixed held-out problems, per seed [S]: greedy decoding (or one sample at
        temperature 1, with `sample`) gives eval_accuracy (pass@1), eval_well_formed and eval_length (tokens
        generated); with settings.pass_k = k > 0, `eval_pass@k` is the fraction of problems that at least one
        of k samples at temperature 1 solves (k samples per problem: the unbiased estimate with n = k)."""
        greedy, lengths, sampled = jax.device_get(self._heldout_rewards(params, key, num, sample))
        correct = self.task.reward_names.index("correct")
        out = {"eval_accuracy": greedy[..., correct].mean(-1),
               "eval_well_formed": greedy[..., self.task.reward_names.index("well_formed")].mean(-1),
               "eval_length": lengths.mean(-1)}
        if self.settings.pass_k:
            out[f"eval_pass@{self.settings.pass_k}"] = sampled[..., correct].max(-1).mean(-1)
        return out


class TextActor:
    """One trained model, ready to answer: `actor(prompts [B, P], key=None) -> completions [B, N]` (token ids,
    jitted; greedy without `key`, else sampled at temperature 1), and `actor.complete(texts)` for strings.

        actor = jaxrl.load_policy("runs/text_grpo-addition-...")
        actor.complete(["12+30="])                                  # ['42']
    """

    def __init__(self, algorithm: "_TextAlgorithm", params):
        self.params, self.task, self.tokenizer = params, algorithm.task, algorithm.tokenizer
        vocab = algorithm.vocab
        decoding = dict(max_new_tokens=self.task.answer_length, eos_id=vocab.eos_id, pad_id=vocab.pad_id)
        self._greedy = jax.jit(lambda params, prompts: sampling.sample(
            algorithm.model, params, prompts, jax.random.PRNGKey(0), temperature=0.0, **decoding).tokens)
        self._sampled = jax.jit(lambda params, prompts, key: sampling.sample(
            algorithm.model, params, prompts, key, temperature=1.0, **decoding).tokens)

    def __call__(self, prompts: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return self._greedy(self.params, prompts) if key is None else self._sampled(self.params, prompts, key)

    def complete(self, texts: list[str], key: jax.Array | None = None) -> list[str]:
        """The answers to prompt strings (laid out as the task's prompts: BOS, text, padded on the left)."""
        prompts = text.encode(self.tokenizer, texts, self.task.prompt_length)
        return text.decode(self.tokenizer, self(jnp.asarray(prompts), key))


def restore_text_params(workdir: str, settings: TextSettings, mesh, step: int | None = None):
    """Parameters [S', ...] of the text run in `workdir` (an SFT run to start from), from its newest
    checkpoint or the one saved at update `step`; `settings` must describe the same model. A differently
    shaped model is a CheckpointError."""
    from jaxrl import checkpoint, config as config_lib

    saved = config_lib.load(os.path.join(workdir, "config.json"))
    model_kwargs = tuple((k, False if k == "value_head" else v) for k, v in settings.model_kwargs)  # SFT has none
    sft = TextSFT(dataclasses.replace(settings, tokenizer_path=os.path.join(workdir, "tokenizer.json"),
                                      model_kwargs=model_kwargs), mesh)
    abstract = jax.eval_shape(lambda: sft.init_seeds(saved.seed, saved.num_seeds))
    _, state = checkpoint.restore_from(os.path.join(workdir, "checkpoints"),
                                       checkpoint.abstract_state(abstract, mesh_lib.replicated(sft.mesh)), step)
    return state.params


def _overlay(fresh, loaded):
    """`fresh` parameters (nested dicts) with every leaf that `loaded` also has replaced by its value."""
    if not isinstance(fresh, dict):
        return loaded
    return {k: _overlay(v, loaded[k]) if k in loaded else v for k, v in fresh.items()}


class TextSFT(_TextAlgorithm):
    """Supervised warm start of a `TransformerLM` on a text task (see the module docstring)."""

    def _batch(self, key: jax.Array):
        """This device's share of B training problems: (prompts [b, P], answers [b, A])."""
        problems = self.task.sample(key, self.settings.num_prompts, "train")
        problems = jax.tree.map(mesh_lib.local_share, problems)
        return self.task.prompts(problems, self.vocab), self.task.reference_answers(problems, self.vocab)

    def _loss(self, params, batch, hp):
        prompts, answers = batch
        mask = (answers != self.vocab.pad_id).astype(jnp.float32)
        log_probs, _, _ = sampling.score(self.model, params, prompts, answers, mask, self.vocab.pad_id)
        nll = losses.aggregate(-log_probs, mask, "token", axis_name=DATA_AXIS)
        # p > 1/2 makes the reference token the argmax: a cheap lower bound on teacher-forced accuracy
        correct = (log_probs > np.log(0.5)) | (mask == 0)
        return nll, {"loss": nll, "token_accuracy": losses.aggregate(correct.astype(jnp.float32), mask, "token",
                                                                    axis_name=DATA_AXIS)}

    def _update(self, state: TextState, hp: TextHyperparams):
        key, batch_key = jax.random.split(state.key)
        optimizer = text_optimizer(hp, self.settings, state.update_step)
        params, opt_state, metrics = gradient_step(self._loss, optimizer, state.params, state.opt_state,
                                                   self._batch(batch_key), hp)
        return TextState(params, opt_state, key, state.update_step + 1), metrics


# ---------------------------------------------------------------------------------------------------
# GRPO on tokens


KL_COEF = Knob("loss.kl_coef", 0.0, "> 0: a KL penalty to the frozen starting policy, of this weight", traced=True,
               minimum=0.0)


@struct.dataclass
class TextGRPOHyperparams(TextHyperparams):
    """Traced numbers of the RL update (a sweep may vary them)."""

    clip_low: float = losses.CLIP_LOW.field()
    clip_high: float = losses.CLIP_HIGH.field()
    kl_coef: float = KL_COEF.field()
    ent_coef: float = losses.ENT_COEF.field()
    vf_coef: float = losses.VF_COEF.field()  # (of the value head, when critic_weight > 0)
    critic_weight: float = CRITIC_WEIGHT.field()  # advantages = (1 - w) * group + w * standardised (reward - value)
    temperature: float = knob("sampling.temperature", 1.0, "the sampling temperature (0: greedy)", traced=True,
                              minimum=0.0)
    top_p: float = knob("sampling.top_p", 1.0, "nucleus sampling: the smallest set of tokens holding this much "
                        "probability", traced=True, above=0.0, maximum=1.0)


@dataclasses.dataclass(frozen=True)
class TextGRPOSettings(TextSettings):
    """TextSettings plus the group, estimator and loss choices (static)."""

    group_size: int = GROUP_SIZE.field()
    oversample: int = knob("group.oversample", 1, "candidate prompts per slot, of which a selecting Control "
                           "strategy keeps one", minimum=1)
    # Rollout strategies per stage, in the order they run: ((stage, (name, ...)), ...) (jaxrl.rollout)
    rollout: tuple[tuple[str, tuple[str, ...]], ...] = (("generate", ("independent",)),
                                                        ("control", ("dynamic_sampling",)))
    rollout_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # (strategy, ((key, value), ...))
    pool_size: int = 0  # > 0: train on a fixed pool of this many problems (memory per problem); 0: fresh ones
    top_k: int = knob("sampling.top_k", 0, "sample among the k most likely tokens; 0: all", minimum=0)
    advantage: str = ADVANTAGE.field()
    advantage_options: tuple[tuple[str, Any], ...] = ()
    reward_weights: tuple[float, ...] = knob("reward_weights", (1.0, 0.1), "the weight of each reward component "
                                             "(correct, well_formed)", rule="two weights (correct, well_formed)",
                                             accepts=lambda weights: len(weights) == 2, convert=tuple)
    ratio: str = losses.RATIO.field()
    aggregate: str = losses.AGGREGATE.field()
    dual_clip: float | None = losses.DUAL_CLIP.field(convert=lambda bound: bound or None)
    kl: str = knob("loss.kl", "k3", "the KL estimator of the penalty to the starting policy",
                   choices=tuple(losses.KL_ESTIMATORS))
    use_kl: bool = KL_COEF.field(convert=lambda kl_coef: kl_coef > 0)  # keep a frozen copy of the starting policy
    num_epochs: int = NUM_EPOCHS.field()
    num_minibatches: int = NUM_MINIBATCHES.field()

    @property
    def batch_size(self) -> int:
        """Completions per update, over all devices (B prompts x G)."""
        return self.num_prompts * self.group_size


@struct.dataclass
class TextGRPOState(TextState):
    ref_params: Any = None  # the frozen reference policy (None without a KL term)
    memory: Any = None  # {strategy name: its memory} of the rollout strategies that keep one


class TextGRPO(_TextAlgorithm):
    """GRPO and its variants on a text task, starting from `init_params` (an SFT run's) when given.

    One update, per seed, on this device's share of the B prompt slots:
      B x oversample candidate problems (fresh ones, or from a fixed pool with `pool_size`)
      -> the rollout strategies' stages (`jaxrl.rollout`): hints, G completions each with rewards [.., G, K]
      from the task's verifier, memory updates, filters, B groups kept (by default DAPO's dynamic sampling:
      per slot, the first candidate whose rewards vary), replayed samples
      -> group advantages (jaxrl.advantages) -> epochs x minibatches of `losses.policy_loss`.

    With `critic_weight` w > 0 the model gets a value head (a fresh one on a warm start) that regresses
    every prefix onto the completion's weighted reward; the per-token advantage becomes
    (1 - w) * group advantage + w * standardised (reward - value), as in env GRPO (w = 1: PPO on tokens
    with a learned baseline, no group needed for the baseline).
    """

    def __init__(self, settings: TextGRPOSettings, mesh=None, init_params=None, eval_seed: int = 1234):
        super().__init__(settings, mesh, init_params, eval_seed)
        from jaxrl import advantages
        self.estimator = advantages.get(settings.advantage)
        self.strategies = [rollout.get(stage, name) for stage, chosen in settings.rollout for name in chosen]
        # Any plan change may set hint lengths: the generator then forces reference-answer prefixes.
        self.forces_hints = any(strategy.before for strategy in self.strategies)
        self.generator, = (s for s in self.strategies if s.generate)
        # Slots of candidates whose decoding stops once each holds a finished group (0: never stop early).
        self.stop_slots = settings.oversample if any(s.stops_early for s in self.strategies) else 0
        # Filters' bonuses (Groups.bonus) reach the advantages of groups whose verifier rewards tie.
        self.uses_bonus = any(strategy.stage == "filter" and strategy.after for strategy in self.strategies)
        # The training pool: problem i is the same for every seed and device (a dataset, drawn once).
        self.pool = (jax.jit(lambda key: self.task.sample(key, settings.pool_size, "train"))(jax.random.key(0))
                     if settings.pool_size else None)
        # Minibatches deal whole groups (the loss scores a group's prompt once): each device's prompts must
        # split evenly.
        local_prompts = settings.num_prompts // self.mesh.shape[DATA_AXIS]
        if local_prompts % settings.num_minibatches:
            raise ValueError(f"the {local_prompts} prompts (groups) on each device cannot be split into "
                             f"num_minibatches={settings.num_minibatches} equal minibatches: prompts per device "
                             f"must be a multiple of {settings.num_minibatches}")

    @property
    def use_critic(self) -> bool:
        return self.model.config.value_head

    def init(self, key: jax.Array, params=None) -> TextGRPOState:
        if params is not None and self.use_critic:  # a warm start without a value head: a fresh one
            params = _overlay(self.init_params(jax.random.fold_in(key, 1)), params)
        state = super().init(key, params)
        ref = state.params if self.settings.use_kl else None
        memory_key = jax.random.fold_in(key, 2)
        memory = {s.name: s.init(self, memory_key) for s in self.strategies if s.init}
        return TextGRPOState(state.params, state.opt_state, state.key, state.update_step, ref, memory)

    def strategy_options(self, name: str) -> dict:
        """The options of rollout strategy `name` (its registered defaults, overridden by the config)."""
        strategy, = (s for s in self.strategies if s.name == name)
        return rollout.options_of(strategy, self.settings.rollout_options)

    # ----------------------------------------------------------------------------------------------

    def _plan(self, key: jax.Array) -> rollout.Plan:
        """This device's share of the B x oversample candidate problems, from the pool when there is one.
        Drawn from their global index, so every device count plans the same problems."""
        s = self.settings
        num = s.num_prompts * s.oversample
        if s.pool_size:
            ids = mesh_lib.local_share(jax.random.randint(key, (num,), 0, s.pool_size))
            problems = self.pool[ids]
        else:
            problems = jax.tree.map(mesh_lib.local_share, self.task.sample(key, num, "train"))
            ids = jnp.full(problems.target.shape, -1, jnp.int32)
        return rollout.Plan(ids, problems, jnp.zeros(ids.shape, jnp.int32), jnp.full(ids.shape, -1.0),
                            jnp.zeros(ids.shape, jnp.int32))

    def _rollout(self, state: TextGRPOState, hp: TextGRPOHyperparams, key: jax.Array):
        """The stages of `jaxrl.rollout` for one seed on this device: (memory, Groups [b, G, ...], metrics)."""
        plan_key, sample_key = jax.random.split(key)
        memory, metrics = dict(state.memory), {}
        hook_key = lambda i: jax.random.fold_in(sample_key, i + 1)
        plan = self._plan(plan_key)
        for i, strategy in sorted(enumerate(self.strategies), key=lambda item: not item[1].draws):
            if strategy.before:
                plan, m = strategy.before(self, memory.get(strategy.name), plan, hook_key(i))
                metrics.update(m)
        groups = self.generator.generate(self, state.params, hp, plan, sample_key)
        metrics["sampled_tokens"] = jax.lax.psum(jnp.sum(groups.generated), DATA_AXIS)  # every candidate's
        for strategy in self.strategies:
            if strategy.observe:
                memory[strategy.name], m = strategy.observe(self, memory[strategy.name], groups, state.params)
                metrics.update(m)
        for i, strategy in enumerate(self.strategies):
            if strategy.after:
                groups, m = strategy.after(self, memory.get(strategy.name), groups, state.params, hook_key(i))
                metrics.update(m)
        local_prompts = self.settings.num_prompts // jax.lax.axis_size(DATA_AXIS)
        if groups.tokens.shape[0] != local_prompts:
            raise ValueError(f"the rollout strategies {[s.name for s in self.strategies]} left {groups.tokens.shape[0]} "
                             f"groups on a device that trains {local_prompts}")
        return memory, groups, metrics

    def _loss(self, params, batch, hp: TextGRPOHyperparams):
        """batch: whole groups, prompts [m, P] and the rest [m, G, ...]."""
        s = self.settings
        scored = sampling.score_groups(self.model, params, batch["prompts"], batch["tokens"], batch["mask"],
                                       self.vocab.pad_id)
        # One row per completion [m*G, N] from here on.
        log_probs, entropy, values = (None if x is None else x.reshape(-1, x.shape[-1]) for x in scored)
        batch = {k: v if k == "prompts" else v.reshape(-1, *v.shape[2:]) for k, v in batch.items()}
        total, aux = losses.policy_loss(
            log_probs, batch["log_probs"], batch["advantages"], batch["mask"] * batch["weight"],
            clip_low=hp.clip_low, clip_high=hp.clip_high, dual_clip=s.dual_clip, ratio=s.ratio,
            aggregate=s.aggregate, constant_length=self.task.answer_length,
            ref_log_prob=batch.get("ref_log_probs"), kl=s.kl, kl_coef=hp.kl_coef, entropy=entropy,
            ent_coef=hp.ent_coef, axis_name=DATA_AXIS)
        if self.use_critic:
            errors = losses.value_loss(values, None, batch["returns"], None)
            value_mask = batch.get("value_mask", batch["mask"])
            value_loss = losses.aggregate(errors, value_mask, "token", axis_name=DATA_AXIS)
            total, aux = total + hp.vf_coef * value_loss, dict(aux, value_loss=value_loss)
        return total, aux

    # ----------------------------------------------------------------------------------------------
    # One update: sampling (rollouts, rewards, advantages), then learning (reference scores, epochs x
    # minibatches), in the chunk's one program.

    def _group_advantages(self, groups: rollout.Groups):
        """Per-token advantages and loss weights [b, G, N] of the kept groups, and which groups' verifier
        rewards all tie [b]. A filter's bonus enters as one more reward component (weight 1) where they tie."""
        s = self.settings
        rewards, weights = groups.rewards, s.reward_weights
        tied = jnp.all(rewards == rewards[:, :1], axis=(1, 2))
        if self.uses_bonus:
            rewards = jnp.concatenate([rewards, (groups.bonus * tied[:, None])[..., None]], axis=-1)
            weights = (*weights, 1.0)
        if self.generator.advantages:  # structured samples (trees) score their tokens themselves
            advantages, weight = self.generator.advantages(self, groups, rewards @ jnp.asarray(weights))
            return advantages, weight, tied
        group = self.estimator(rewards, None, reward_weights=weights, **dict(s.advantage_options))
        return jnp.broadcast_to(group.advantages[..., None], groups.tokens.shape), group.weight[..., None], tied

    def _sample_batch(self, state: TextGRPOState, hp: TextGRPOHyperparams):
        """For one seed on this device: (state with its key and rollout memory advanced, (units: prompts
        [b, P] and the rest [b, G, ...], epoch key), sampling metrics)."""
        s = self.settings
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        memory, groups, metrics = self._rollout(state, hp, rollout_key)
        advantages, weight, tied = self._group_advantages(groups)
        if self.uses_bonus:
            metrics["ranked"] = global_mean(tied.astype(jnp.float32))
        b, G, N = groups.tokens.shape
        units = {"prompts": groups.prompts, "tokens": groups.tokens, "mask": groups.mask,
                 "log_probs": groups.log_probs, "weight": weight * groups.weight}
        if self.use_critic:  # the value head predicts the completion's weighted reward from each prefix
            returns = jnp.broadcast_to((groups.rewards @ jnp.asarray(s.reward_weights))[..., None], (b, G, N))
            critic = standardise(returns - groups.values, groups.mask)
            advantages = (1.0 - hp.critic_weight) * advantages + hp.critic_weight * critic
            units["returns"] = returns
            if groups.pruned is not None:  # a pruned member's reward is not its prefix's value: not a target
                units["value_mask"] = groups.mask * ~groups.pruned[..., None]
        units["advantages"] = advantages
        metrics.update({f"reward_{name}": global_mean(groups.rewards[..., i])
                        for i, name in enumerate(self.task.reward_names)})
        metrics.update(completion_length=global_mean(groups.lengths),
                       zero_variance_fraction=global_mean(tied.astype(jnp.float32)),
                       tokens=jax.lax.psum(jnp.sum(groups.mask), DATA_AXIS))
        return state.replace(key=key, memory=memory), (units, epoch_key), metrics

    def _learn(self, state: TextGRPOState, batch, hp: TextGRPOHyperparams):
        """For one seed on this device: the optimisation of `_sample_batch`'s batch; (state, metrics)."""
        s = self.settings
        units, epoch_key = batch
        if s.use_kl:
            ref, _, _ = sampling.score_groups(self.model, state.ref_params, units["prompts"], units["tokens"],
                                              units["mask"], self.vocab.pad_id)
            units = dict(units, ref_log_probs=ref)
        optimizer = text_optimizer(hp, s, state.update_step)
        groups = jax.tree.map(lambda x: x[:, None], units)  # one unit per prompt: minibatches deal whole groups
        params, opt_state, aux = optimise(self._loss, optimizer, state.params, state.opt_state, groups, hp, epoch_key,
                                          s.num_epochs, s.num_minibatches)
        state = state.replace(params=params, opt_state=opt_state, update_step=state.update_step + 1)
        return state, jax.tree.map(jnp.mean, aux)

    def _update(self, state: TextGRPOState, hp: TextGRPOHyperparams):
        """One update for one seed on this device: `_sample_batch`, then `_learn` on its batch."""
        state, batch, sample_metrics = self._sample_batch(state, hp)
        state, learn_metrics = self._learn(state, batch, hp)
        return state, {**sample_metrics, **learn_metrics}


# -------------------------------------------------------------------------------------------------
# From a config


def text_config() -> ConfigDict:
    """`config.base_config()` plus the keys of a token-level run: a transformer policy on a verifiable text task
    (envs/text), trained by supervised fine-tuning on the task's reference answers."""
    config = config_lib.base_config()
    config.update(ConfigDict({
        "experiment": "text",
        "algorithm": "text_sft",
        "total_steps": 200_000,  # samples (prompt and completion pairs) per seed
        "log": {"every_steps": 6_400},
        "eval": {"num_envs": 512},  # held-out problems
    }))
    config.optim.update({"learning_rate": 1e-3, "schedule": "cosine", "warmup_updates": 50, "max_grad_norm": 1.0,
                         "adam_eps": 1e-8})
    return knobs.fill(config, TASK_NAME, TASK_KWARGS, TextSettings, *MODEL_KNOBS)


def text_grpo_config() -> ConfigDict:
    """`text_config()` for RL on tokens from a warm start: group, estimator, loss and sampling choices."""
    config = text_config()
    config.algorithm = "text_grpo"
    config.update(group_relative_keys())
    config.rollout = rollout_keys()
    config.optim.update({"num_epochs": 1, "num_minibatches": 1})
    return knobs.fill(config, TextGRPOHyperparams, TextGRPOSettings, INIT_FROM)


def rollout_keys() -> ConfigDict:
    """The rollout strategies per stage (`rollout.STAGE_KNOBS`), the training pool, and every registered strategy's
    options."""
    config = knobs.defaults(*rollout.STAGE_KNOBS).rollout
    config.options = rollout.option_keys("tokens")
    return config


def rollout_settings(config: ConfigDict) -> dict:
    """The settings fields of `config.rollout`."""
    r = config.rollout
    chosen = ((stage, rollout.names(r[stage])) for stage in rollout.STAGES)
    return dict(rollout=tuple((stage, names) for stage, names in chosen if names),
                rollout_options=rollout.configured_options(r.options), pool_size=r.pool_size)


def check_rollout_config(config: ConfigDict) -> None:
    """Names each unknown strategy, a stage without its one Generate strategy, and what a strategy needs."""
    r = config.rollout
    chosen = {stage: rollout.names(r[stage]) for stage in rollout.STAGES}
    for stage, names in chosen.items():
        for name in names:
            try:
                rollout.get(stage, name)
            except ValueError as error:
                raise ValueError(f"config.rollout.{stage}: {error}") from None
        if len(set(names)) != len(names):
            raise ValueError(f"config.rollout.{stage} names a strategy twice: {r[stage]!r}")
    if len(chosen["generate"]) != 1:
        raise ValueError(f"config.rollout.generate must name exactly one strategy, got {r.generate!r}")
    strategies = [rollout.get(stage, name) for stage, names in chosen.items() for name in names]
    for strategy in strategies:
        missing = [name for name in strategy.requires if not any(name in names for names in chosen.values())]
        if missing:
            raise ValueError(f"rollout strategy {strategy.stage}/{strategy.name} needs {', '.join(missing)} in "
                             f"config.rollout too")
        if strategy.needs_pool and not r.pool_size:
            raise ValueError(f"rollout strategy {strategy.stage}/{strategy.name} keeps memory per training problem: "
                             f"set config.rollout.pool_size > 0")
        given = r.options.get(strategy.name, ConfigDict()).to_dict()
        unknown = set(given) - {k for k, _ in strategy.options}
        if unknown:
            raise ValueError(f"config.rollout.options.{strategy.name} has unknown keys {sorted(unknown)}; known: "
                             f"{sorted(k for k, _ in strategy.options)}")
    selecting = [s.name for s in strategies if s.selects]
    drawing = [s.name for s in strategies if s.draws]
    if len(drawing) > 1:
        raise ValueError(f"config.rollout names {len(drawing)} strategies that redraw the problems ({', '.join(drawing)}); "
                         f"at most one")
    if "tree" in chosen["generate"]:
        branches = r.options.tree.branches
        if branches < 1 or config.group.size % branches or config.group.size == branches:
            raise ValueError(f"config.rollout.options.tree.branches = {branches} must divide config.group.size = "
                             f"{config.group.size} into branches of two or more members")
        if "partial" in chosen["control"]:
            raise ValueError("rollout.generate=tree with rollout.control=partial: a resumed group does not keep its "
                             "branch points; use generate=independent with partial")
        if config.advantage not in ("grpo", "dr_grpo"):
            raise ValueError(f"rollout.generate=tree scores tokens with per-branch baselines (grpo or dr_grpo "
                             f"scaling); config.advantage={config.advantage!r} is not one of them")
    if "prune" in chosen["control"] and not config.critic_weight > 0:
        raise ValueError("rollout strategy control/prune stops members by the value head's prediction: set "
                         f"config.critic_weight > 0 (a value head), got {config.critic_weight}")
    stopping = [s.name for s in strategies if s.stops_early]
    if stopping and config.group.oversample < 2:
        raise ValueError(f"rollout strategy {stopping[0]} starts more groups than it trains: set "
                         f"config.group.oversample >= 2 (candidates per slot), got {config.group.oversample}")
    if config.group.oversample > 1 and len(selecting) != 1:
        raise ValueError(f"config.group.oversample = {config.group.oversample} needs exactly one selecting Control "
                         f"strategy in config.rollout.control (e.g. dynamic_sampling), got {selecting or 'none'}")


def text_settings(config: ConfigDict, settings_cls, value_head: bool = False, **extra):
    """`settings_cls` with its knob fields read from `config` (`jaxrl.knobs`), the rest derived here or `extra`."""
    o = config.optim
    model = dict(config.model.to_dict(), d_ff=config.model.d_ff or None, value_head=value_head)
    samples_per_prompt = config.group.size if "group_size" in knobs.fields_of(settings_cls) else 1
    return knobs.read(
        settings_cls, config, task=config.task.name, task_kwargs=tuple(sorted(config.task.kwargs.to_dict().items())),
        num_updates=config.total_steps // (config.num_prompts * samples_per_prompt),
        schedule=o.schedule, warmup_updates=o.warmup_updates, adam_eps=o.adam_eps, weight_decay=o.weight_decay > 0,
        grad_clip=o.grad_clip, model_kwargs=tuple(sorted(model.items())), xla_options=config_lib.xla_options(config),
        **extra)


def build_text_sft(config: ConfigDict, mesh, run_dir: str | None = None) -> TextSFT:
    """The SFT algorithm; with `run_dir`, that saved run's (its tokenizer.json)."""
    tokenizer = os.path.join(run_dir, "tokenizer.json") if run_dir else None
    return TextSFT(text_settings(config, TextSettings, tokenizer_path=tokenizer), mesh)


def build_text_grpo(config: ConfigDict, mesh, run_dir: str | None = None) -> TextGRPO:
    """The GRPO algorithm, warm-started from `config.init_from`; with `run_dir`, that saved run's (its
    tokenizer.json, and no warm start: its checkpoints hold the parameters)."""
    start = run_dir or config.init_from
    tokenizer = os.path.join(start, "tokenizer.json") if start else None
    settings = text_settings(config, TextGRPOSettings, value_head=config.critic_weight > 0,
                             advantage_options=advantage_options(config), tokenizer_path=tokenizer,
                             **rollout_settings(config))
    init_params = restore_text_params(config.init_from, settings, mesh) if config.init_from and not run_dir else None
    return TextGRPO(settings, mesh, init_params)


def check_text_config(config: ConfigDict) -> None:
    if config.model.d_model % config.model.num_heads:
        raise ValueError(f"config.model.d_model = {config.model.d_model} is not divisible by "
                         f"config.model.num_heads = {config.model.num_heads}")
    if config.total_steps < config.num_prompts:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update (num_prompts = "
                         f"{config.num_prompts})")


def check_text_grpo_config(config: ConfigDict) -> None:
    check_text_config(config)
    check_rollout_config(config)
    if config.init_from and not os.path.exists(os.path.join(config.init_from, "tokenizer.json")):
        raise ValueError(f"config.init_from={config.init_from!r} is not a text run directory (no tokenizer.json)")


register("text_sft", Recipe(build_text_sft, TextHyperparams, check=check_text_config, defaults=text_config,
                            rebuild=build_text_sft))
register("text_grpo", Recipe(build_text_grpo, TextGRPOHyperparams, check=check_text_grpo_config,
                             defaults=text_grpo_config, rebuild=build_text_grpo,
                             static_of=lambda config: (config.critic_weight > 0, config.loss.kl_coef > 0)))
