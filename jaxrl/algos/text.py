"""Token-level training of the transformer policy on verifiable text tasks (envs/text): supervised fine-tuning
(`text_sft`) and GRPO on tokens (`text_grpo`), each an `engine.Algorithm` made by its registered builder.

Both act through one `TextPolicy`: the task, its tokenizer and vocabulary, the model, evaluation on held-out
problems, the actor and the run directory's files (`tokenizer.json`: a run reloads from its directory alone).
One SFT update, per seed, under `shard_map` over the `data` axis (prompts split over devices, parameters
replicated, gradients averaged):

    sample B training problems -> prompts [B, P], answers [B, A] -> -mean log p(answer token) -> Adam

Evaluation is greedy decoding (temperature 0) on a fixed held-out set: `eval_accuracy` (pass@1) and
`eval_well_formed`, and `eval_pass@k` from k samples per problem at temperature 1. Shapes: S seeds,
B prompts per update (b on one device), P prompt and A answer tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from envs import text
from jaxrl import (advantages, config as config_lib, corrections, engine, files, knobs, losses, mesh as mesh_lib,
                   multi_turn, reward_models as reward_models_lib, rollout, sampling)
from jaxrl.advantages import process_returns
from jaxrl.algos.group import (CRITIC_WEIGHT, GROUP_SIZE, advantage_options, check_group_estimator, check_objective,
                               group_relative_keys)
from jaxrl.algos import registry
from jaxrl.algos.registry import Recipe, register
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import OptimizerSettings, global_mean, gradient_step, optimise, staleness, standardise
from jaxrl.jitting import jit_method
from jaxrl.knobs import Knob, knob
from jaxrl.mesh import DATA_AXIS, MODEL_AXIS, RUN_AXIS
from jaxrl.models import hf as hf_files, lora, sharding as model_sharding
from jaxrl.models.config import LORA_TARGETS
from jaxrl.models.decoder import Decoder, is_adapter
from jaxrl.models.lm import is_pretrained, read_spec
from jaxrl.transformer import TransformerConfig, TransformerLM


TASK_NAME = Knob("task.name", "addition", "a verifiable text task (envs.text.TASKS), or dataset: a file's questions "
                 "and numeric answers (task.kwargs.path; pretrained models)", choices=lambda: sorted([*text.TASKS, "dataset"]))
TASK_KWARGS = Knob("task.kwargs", {}, "the task's own arguments, e.g. {max_digits: 3}")
PRETRAINED_NAME = Knob("model.name", "", "a pretrained model by name (smollm2-135m-instruct) or path (a Hugging Face "
                       "directory, a .gguf file); '': the small transformer of model.num_layers etc., from scratch")
MODEL_KNOBS = (
    Knob("model.num_layers", 2, "the transformer's layers", minimum=1),
    Knob("model.d_model", 128, "the transformer's width (a multiple of num_heads)", minimum=1),
    Knob("model.num_heads", 4, "attention heads", minimum=1),
    Knob("model.d_ff", 0, "the MLP's hidden size; 0: 4 * d_model", minimum=0),
    Knob("model.max_len", 48, "positions: prompt and answer tokens (RL on longer problems needs room)", minimum=1),
)
INIT_FROM = Knob("init_from", "", "a text run directory (text_sft or text_grpo: its newest checkpoint, every seed) "
                 "or an exported text policy whose parameters and tokenizer.json the runs start from; '': from "
                 "scratch")


@struct.dataclass
class TextHyperparams:
    """Traced numbers of SFT (a sweep may vary them)."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """Static sizes and choices of a text policy and its optimiser (SFT's settings; GRPO's `text`)."""

    task: str = "addition"
    task_kwargs: tuple[tuple[str, Any], ...] = ()
    num_prompts: int = knob("num_prompts", 64, "prompts per update (B), split over devices", minimum=1)
    num_updates: int = 1  # over the run
    optimizer: OptimizerSettings = OptimizerSettings()
    model_kwargs: tuple[tuple[str, Any], ...] = ()  # TransformerConfig fields (the vocabulary comes from the tokenizer)
    tokenizer_corpus: int = 2000  # problems per split the tokenizer is trained on
    tokenizer_path: str | None = None  # load this tokenizer.json instead of training one (RL from an SFT run)
    eval_problems: int = knobs.declared("eval.episodes").field()
    pass_k: int = knob("eval.pass_k", 8, "held-out samples per problem for eval_pass@k; 0: greedy evaluation only",
                       minimum=0)
    xla_options: tuple[tuple[str, str | bool], ...] | str = ()  # the training programs' XLA options, or "auto"
    # A pretrained model (`jaxrl.models`): its name or path ('' for the small transformer), and how it computes
    pretrained: str = ""
    compute_dtype: str = knob("model.dtype", "float32", "a pretrained model's compute dtype",
                              choices=("float32", "bfloat16"))
    param_dtype: str = knob("model.param_dtype", "float32", "a pretrained model's parameter dtype (bfloat16: the "
                            "optimiser keeps float32 master copies and moments)", choices=("float32", "bfloat16"))
    remat: bool = knob("model.remat", False, "recompute each layer's activations in the backward pass instead of "
                       "keeping them (less memory, about a third more compute)")
    shard_params: bool = knob("model.shard_params", True, "a pretrained model's parameters and optimiser state "
                              "stored split over the mesh's data axis, each layer gathered as it runs (fully sharded "
                              "data parallel); False: replicated on every device")
    lora_rank: int = knob("model.lora_rank", 0, "a pretrained model's low-rank adapters: > 0 trains only adapters "
                          "of this rank (and a value head), the base frozen; 0: every weight trains", minimum=0)
    lora_alpha: float = knob("model.lora_alpha", 16.0, "the adapters' output is scaled by lora_alpha / lora_rank",
                             above=0.0)
    lora_targets: tuple[str, ...] = knob("model.lora_targets", ",".join(LORA_TARGETS), "the projections that get "
                                         "adapters", choices=LORA_TARGETS, each_of=True,
                                         convert=lambda names: tuple(n.strip() for n in names.split(",")))
    # How a task is posed to a pretrained chat model (envs.text.chat)
    system_prompt: str = knob("task.system_prompt", "", "pretrained models: the system message before each "
                              "question ('': none)")
    instruction: str = knob("task.instruction", "", "pretrained models: the line after each question ('': ask for "
                            "the final answer after task.answer_marker)")
    answer_marker: str = knob("task.answer_marker", "Answer:", "pretrained models: the final answer is what "
                              "follows the last occurrence of this in the reply ('': the reply's last number)")
    reply_length: int = knob("task.reply_length", 64, "pretrained models: the most tokens a reply may take (EOS "
                             "included)", minimum=1)
    observation_role: str = knob("task.observation_role", "user", "pretrained models on multi-turn tasks: the chat "
                                 "role of the environment's answers (tool where the template has that role)",
                                 choices=("user", "tool"))

    @property
    def batch_size(self) -> int:
        """Samples (prompt and answer pairs) per update, over all devices."""
        return self.num_prompts


@struct.dataclass
class TextState:
    """SFT's state. Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    key: jax.Array
    update_step: jax.Array


class TextPolicy:
    """What the text algorithms share, built from their `TextSettings`: the task, its tokenizer and vocabulary,
    the model and its fresh state; held-out evaluation, the actor and the run directory's files."""

    def __init__(self, settings: TextSettings, mesh=None, eval_seed: int = 1234):
        self.settings, self.eval_seed = settings, eval_seed
        # parameter -> its PartitionSpec without the run axis (`data`: FSDP; `model`: tensor parallel)
        self.param_specs: dict[str, P] = {}
        if mesh is not None and not settings.pretrained:
            mesh_lib.check_no_model_axis(mesh, "this run trains a small model from scratch")
        if settings.pretrained:
            self._pretrained(settings, mesh)
        else:
            if settings.task == "dataset":
                raise ValueError("task.name=dataset poses a file's questions in words: it needs a pretrained model "
                                 f"(config.{PRETRAINED_NAME.key})")
            self.task = text.make_task(settings.task, **dict(settings.task_kwargs))
            self.tokenizer = (text.load_tokenizer(settings.tokenizer_path) if settings.tokenizer_path else
                              text.train_tokenizer(text.corpus([self.task], settings.tokenizer_corpus),
                                                   alphabet=getattr(self.task, "alphabet", text.ALPHABET)))
            self.vocab = text.Vocab.from_tokenizer(self.tokenizer)
            self.model = TransformerLM(TransformerConfig(vocab_size=self.vocab.size, **dict(settings.model_kwargs)))
            self.update_model = self.model
        needed = self.task.prompt_length + self.task.answer_length
        if self.model.config.max_len < needed:
            raise ValueError(f"model.max_len={self.model.config.max_len} cannot hold this task's prompt and "
                             f"answer ({self.task.prompt_length} + {self.task.answer_length} tokens)")

    def _pretrained(self, settings: TextSettings, mesh) -> None:
        """The task posed through a pretrained model's chat template, its tokenizer and architecture."""
        model_kwargs = dict(settings.model_kwargs)
        config, self.tokenizer_files = read_spec(
            settings.pretrained, dtype=jnp.dtype(settings.compute_dtype), param_dtype=jnp.dtype(settings.param_dtype),
            remat=settings.remat, value_head=bool(model_kwargs.get("value_head")), lora_rank=settings.lora_rank,
            lora_alpha=settings.lora_alpha, lora_targets=settings.lora_targets)
        tokens = self.tokenizer_files
        self.tokenizer = tokens.tokenizer
        eos = tokens.token_id(tokens.eos_token)
        eos = eos if eos is not None else (config.eos_ids or (None,))[0]
        pad = next((i for i in (tokens.token_id(tokens.pad_token), config.pad_id, eos) if i is not None), None)
        if eos is None or pad is None:
            raise ValueError(f"{settings.pretrained}: the tokenizer names no end-of-sequence token")
        self.vocab = text.ModelVocab(config.vocab_size, int(pad), int(eos))
        base = (text.DatasetTask(**dict(settings.task_kwargs)) if settings.task == "dataset"
                else text.make_task(settings.task, **dict(settings.task_kwargs)))
        available = len(base.test_rows) if isinstance(base, text.DatasetTask) else settings.eval_problems
        if settings.eval_problems > available:
            raise ValueError(f"eval.episodes={settings.eval_problems} held-out problems, but {base.path} holds "
                             f"{available}: set eval.episodes to at most that")
        if getattr(base, "multi_turn", False):  # played over turns, each answer a message of the template
            self.task = text.ChatTurns(base, tokens.encode, tokens.decode, tokens.render_chat,
                                       vocab_size=config.vocab_size, pad_id=self.vocab.pad_id, eos_id=self.vocab.eos_id,
                                       system_prompt=settings.system_prompt, instruction=settings.instruction,
                                       role=settings.observation_role)
        else:
            self.task = text.ChatTask(base, tokens.encode, tokens.decode, tokens.render_chat, pad_id=self.vocab.pad_id,
                                      eos_id=self.vocab.eos_id, answer_length=settings.reply_length,
                                      system_prompt=settings.system_prompt, instruction=settings.instruction,
                                      marker=settings.answer_marker)
        # `model` computes on whole parameters (evaluation, the actor, initialisation); `update_model`, inside the
        # training programs, on each device's part of them when they are stored sharded.
        self.model = self.update_model = Decoder(config)
        if mesh is None:
            return
        data_size = mesh.shape[DATA_AXIS] if settings.shard_params else 1
        if data_size > 1:
            self.update_model = Decoder(model_sharding.fully_sharded(config, data_size))
        self.param_specs = model_sharding.stored_specs(config, {DATA_AXIS: data_size,
                                                                MODEL_AXIS: mesh_lib.model_size(mesh)})

    def state_specs(self, state):
        """PartitionSpecs of a state [R, ...]: parameters (and their optimiser moments and reference copy) split
        over the mesh axes of `param_specs`, everything else over runs only."""
        def spec(path, leaf):
            name = str(getattr(path[-1], "key", "")) if path else ""
            split = self.param_specs.get(name) if any(getattr(k, "key", None) == "params" for k in path) else None
            if split is None or not any(split) or leaf.ndim != len(split) + 1:
                return P(RUN_AXIS)
            return P(RUN_AXIS, *split)
        return jax.tree_util.tree_map_with_path(spec, state)

    @property
    def adapters(self) -> bool:
        """Whether only low-rank adapters train (LoRA on a pretrained model)."""
        return bool(self.settings.pretrained and self.settings.lora_rank)

    def optimizer(self, hp, update_step):
        """The settings' optimiser; under LoRA applied to the adapters (and value head) only, keeping no state for
        the frozen base."""
        optimizer = self.settings.optimizer(hp, update_step)
        if self.settings.pretrained and self.settings.param_dtype != "float32":
            optimizer = engine.float32_master(optimizer)  # (bfloat16 alone would round fine-tuning steps away)
        if not self.adapters:
            return optimizer
        return optax.multi_transform({True: optimizer, False: optax.set_to_zero()}, lora.trainable)

    def write_files(self, workdir: str) -> None:
        """The tokenizer beside the checkpoints (a pretrained model's architecture and tokenizer in `model/`): a run
        is reloadable from its directory alone."""
        if self.settings.pretrained:
            hf_files.write_spec(self.model.config, os.path.join(workdir, MODEL_DIR), self.tokenizer_files.files())
            return
        files.write_atomic(os.path.join(workdir, "tokenizer.json"), self.tokenizer.to_str())

    def decode(self, completions) -> list[str]:
        """Completions [B, N] -> their text, up to the end-of-sequence token."""
        if self.settings.pretrained:
            return [self.task.reply(row) for row in np.asarray(completions)]
        return text.decode(self.tokenizer, completions)

    def decode_episodes(self, episodes) -> list[str]:
        """Episodes [B, N] (`envs.text.turns`' slot layout) -> their text: the small model's with each turn's EOS shown
        as `|`, a pretrained model's with its special tokens."""
        if self.settings.pretrained:
            return [self.tokenizer_files.decode([int(i) for i in row if i != self.vocab.pad_id],
                                                skip_special_tokens=False) for row in np.asarray(episodes)]
        tokens = self.tokenizer.id_to_token
        return ["".join("|" if i == self.vocab.eos_id else tokens(int(i)) for i in row if i != self.vocab.pad_id)
                for row in np.asarray(episodes)]

    def encode_prompts(self, texts: list[str]) -> np.ndarray:
        """Prompt strings -> int32 [B, P] laid out as the task's prompts (a pretrained model's: each string is the
        question of a chat prompt)."""
        if self.settings.pretrained:
            return self.task.question_prompts(texts)
        return text.encode(self.tokenizer, texts, self.task.prompt_length)

    def write_artifacts(self, workdir: str, params, seed: int, sample: bool = False, num: int = 16) -> list[str]:
        """`sample_completions.txt`: the first run's answers (params leaves [R, ...]) to `num` held-out
        problems, greedy or sampled at temperature 1, each with the reference answer and its rewards."""
        problems = self.task.heldout(min(num, self.settings.eval_problems), seed=self.eval_seed)
        actor = self.actor(jax.tree.map(lambda x: x[0], params))
        key = jax.random.PRNGKey(seed) if sample else None
        completions = (actor.play(problems, key) if self.multi_turn
                       else actor(self.task.prompts(problems, self.vocab), key))
        rewards = np.asarray(self.task.jax_rewards(problems, completions, self.vocab))
        lines = [f"# {num} held-out problems, {'sampled at temperature 1' if sample else 'greedy'}; rewards: "
                 + ", ".join(self.task.reward_names)]
        texts = self.decode_episodes(completions) if self.multi_turn else self.decode(completions)
        for (prompt, answer), completion, reward in zip(self.task.texts(problems), texts, rewards):
            lines.append(f"{prompt!r} -> {completion!r} (reference {answer!r}; rewards "
                         + ", ".join(f"{r:g}" for r in reward) + ")")
        path = os.path.join(workdir, "sample_completions.txt")
        files.write_atomic(path, "\n".join(lines) + "\n")
        return [path]

    def actor(self, params) -> "TextActor":
        """One run's model as a jitted function of prompts (`TextActor`)."""
        return TextActor(self, params)

    def init_params(self, key: jax.Array):
        tokens = jnp.zeros((1, self.model.config.max_len), jnp.int32)
        return self.model.init(key, tokens, jnp.zeros_like(tokens), jnp.ones_like(tokens, bool))

    def init(self, key: jax.Array, params=None) -> TextState:
        """A fresh state for one seed, from `params` when given (a warm start or pretrained weights: in this
        model's dtypes, with a fresh value head where they have none) else a new initialisation."""
        param_key, state_key = jax.random.split(key)
        if params is None:
            params = self.init_params(param_key)
        else:
            # Fresh parameters for what `params` lacks (a value head, adapters); otherwise only their shapes
            fresh_parts = dict(self.settings.model_kwargs).get("value_head") or self.adapters
            fresh = self.init_params(param_key) if fresh_parts else jax.eval_shape(self.init_params, param_key)
            adapters = [f"params/layers/{name}" for name in fresh["params"].get("layers", {}) if is_adapter(name)]
            params = _overlay(fresh, params, fresh_ok=("params/value", *adapters))
        optimizer = self.optimizer(TextHyperparams(), jnp.int32(0))
        return TextState(params, optimizer.init(params), state_key, jnp.int32(0))

    @jit_method(static_argnums=(3, 4))
    def _heldout_rewards(self, params, key: jax.Array, num: int, sample: bool = False):
        """Every seed's answers [S, ...] to `num` fixed held-out problems: greedy, or one sample at temperature
        1 with `sample` (rewards [S, num, K], lengths [S, num]), and `pass_k` samples at temperature 1
        (rewards [S, num, k, K]; k may be 0) with the value head's `head_scores` of them ([S, num, k]; [S, num, 0]
        without a value head)."""
        problems = self.task.heldout(num, seed=self.eval_seed)
        prompts = self.task.prompts(problems, self.vocab)
        decoding = dict(max_new_tokens=self.task.answer_length, eos_id=self.vocab.eos_id, pad_id=self.vocab.pad_id)
        rewards = lambda completions: self.task.jax_rewards(problems, completions, self.vocab)

        def one_seed(params):
            greedy = sampling.sample(self.model, params, prompts, key, temperature=1.0 if sample else 0.0,
                                     **decoding)
            if not self.settings.pass_k:
                return (rewards(greedy.tokens), greedy.lengths, jnp.zeros((num, 0, len(self.task.reward_names))),
                        jnp.zeros((num, 0)))
            sampled = sampling.sample_groups(self.model, params, prompts, key, group_size=self.settings.pass_k,
                                             temperature=1.0, **decoding)
            scores = jnp.zeros((num, 0)) if sampled.values is None else head_scores(sampled.values, sampled.mask)
            return (rewards(greedy.tokens), greedy.lengths,
                    jax.vmap(rewards, in_axes=1, out_axes=1)(sampled.tokens), scores)

        return jax.vmap(one_seed)(params)

    @property
    def multi_turn(self) -> bool:
        """Whether the task is played over turns (`envs.text.turns`)."""
        return getattr(self.task, "multi_turn", False)

    @jit_method(static_argnums=(3, 4))
    def _heldout_episodes(self, params, key: jax.Array, num: int, sample: bool = False):
        """`_heldout_rewards` of a multi-turn task, played (`jaxrl.multi_turn.play`), with each seed's per-episode
        `multi_turn.summary` [S, num] of the greedy (or sampled) episodes."""
        problems = self.task.heldout(num, seed=self.eval_seed)
        prompts = self.task.prompts(problems, self.vocab)
        keys = jax.random.split(key, num)

        def one_seed(params):
            play = functools.partial(multi_turn.play, self.model, params, self.task, self.vocab, problems, prompts,
                                     keys)
            first = play(group_size=1, temperature=1.0 if sample else 0.0)
            rewards, lengths = first.rewards[:, 0], first.mask[:, 0].sum(-1)
            stats = jax.tree.map(lambda x: x[:, 0], multi_turn.summary(first.turns))
            if not self.settings.pass_k:
                return rewards, lengths, jnp.zeros((num, 0, len(self.task.reward_names))), stats
            return rewards, lengths, play(group_size=self.settings.pass_k, temperature=1.0).rewards, stats

        return jax.vmap(one_seed)(params)

    def evaluate(self, params, key: jax.Array, num: int, sample: bool = False) -> dict[str, np.ndarray]:
        """Answers to `num` fixed held-out problems, per seed [S]: greedy decoding (or one sample at
        temperature 1, with `sample`) gives eval_accuracy (pass@1), eval_well_formed and eval_length (tokens
        generated); with settings.pass_k = k > 0, `eval_pass@k` is the fraction of problems that at least one
        of k samples at temperature 1 solves (k samples per problem: the unbiased estimate with n = k), `eval_pass^k`
        the fraction that all k solve (the reliability Claw-Eval and agentic evaluations report), and with a value
        head `eval_head@k`, the fraction the one sample of k the head predicts most likely to succeed solves
        (ARRoL's test-time use of its quality head: best-of-k by the head; not for multi-turn tasks). A multi-turn
        task's episodes add eval_success (solved; eval_accuracy is then the mean task reward), eval_turns,
        eval_tool_calls, eval_tool_errors (per call) and eval_solved@k, the share solved within k turns, k = 1..K;
        a task of roles (`MultiTurnTask.roles`) adds eval_turn<k>_reward, turn k's (its role's) mean reward."""
        if self.multi_turn:
            greedy, lengths, sampled, stats = jax.device_get(self._heldout_episodes(params, key, num, sample))
            scores = None  # (no value head's scores of episodes)
        else:
            greedy, lengths, sampled, scores = jax.device_get(self._heldout_rewards(params, key, num, sample))
        correct = self.task.reward_names.index("correct")
        out = {"eval_accuracy": greedy[..., correct].mean(-1),
               "eval_well_formed": greedy[..., self.task.reward_names.index("well_formed")].mean(-1),
               "eval_length": lengths.mean(-1)}
        if self.settings.pass_k:  # at least one of k samples solves a problem (pass@k), and all k do (pass^k)
            out[f"eval_pass@{self.settings.pass_k}"] = sampled[..., correct].max(-1).mean(-1)
            out[f"eval_pass^{self.settings.pass_k}"] = sampled[..., correct].min(-1).mean(-1)
            if scores is not None and scores.shape[-1]:  # best-of-k by the value head
                out[f"eval_head@{self.settings.pass_k}"] = np.asarray(best_by_head(sampled[..., correct],
                                                                                   scores)).mean(-1)
        if self.multi_turn:
            calls = stats["tool_calls"].sum(-1)
            out.update(eval_success=stats["solved"].mean(-1), eval_turns=stats["turns"].mean(-1),
                       eval_tool_calls=stats["tool_calls"].mean(-1),
                       eval_tool_errors=stats["tool_errors"].sum(-1) / np.maximum(calls, 1))
            out.update({f"eval_solved@{k}": (stats["solved_at"] <= k).mean(-1)
                        for k in range(1, self.task.max_turns + 1)})
            if self.task.roles:  # a task of roles: each turn's reward is its role's
                out.update({f"eval_turn{k + 1}_reward": stats["turn_rewards"][..., k].mean(-1)
                            for k in range(self.task.max_turns)})
        return out


class TextActor:
    """One trained model, ready to answer: `actor(prompts [B, P], key=None) -> completions [B, N]` (token ids,
    jitted; greedy without `key`, else sampled at temperature 1), and `actor.complete(texts)` for strings.

        actor = jaxrl.load_policy("runs/text_grpo-addition-...")
        actor.complete(["12+30="])                                  # ['42']
        actor.complete(["What is 12 + 30?"])                        # a pretrained model's run: questions in words
    """

    def __init__(self, policy: TextPolicy, params):
        self.params, self.task, self.tokenizer, self.policy = params, policy.task, policy.tokenizer, policy
        vocab = policy.vocab
        decoding = dict(max_new_tokens=self.task.answer_length, eos_id=vocab.eos_id, pad_id=vocab.pad_id)
        self._greedy = jax.jit(lambda params, prompts: sampling.sample(
            policy.model, params, prompts, jax.random.PRNGKey(0), temperature=0.0, **decoding).tokens)
        self._sampled = jax.jit(lambda params, prompts, key: sampling.sample(
            policy.model, params, prompts, key, temperature=1.0, **decoding).tokens)
        self._play = jax.jit(lambda params, problems, key, temperature: multi_turn.play(
            policy.model, params, self.task, vocab, problems, self.task.prompts(problems, vocab),
            jax.random.split(key, problems.target.shape[0]), group_size=1, temperature=temperature).tokens[:, 0])

    def __call__(self, prompts: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if self.policy.multi_turn:
            raise ValueError(f"{self.task.name} is played over turns against its environment: "
                             "actor.play(problems) plays its episodes")
        return self._greedy(self.params, prompts) if key is None else self._sampled(self.params, prompts, key)

    def play(self, problems, key: jax.Array | None = None) -> jax.Array:
        """A multi-turn task's episodes [B, N] (slot layout) of `problems` [B]: greedy without `key`, else sampled at
        temperature 1."""
        if not self.policy.multi_turn:
            raise ValueError(f"{self.task.name} is answered in one turn: actor(prompts) answers it")
        temperature = 0.0 if key is None else 1.0
        return self._play(self.params, problems, jax.random.PRNGKey(0) if key is None else key, temperature)

    def complete(self, texts: list[str], key: jax.Array | None = None) -> list[str]:
        """The answers to prompt strings (laid out as the task's prompts: BOS, text, padded on the left; for a
        pretrained model each string is a question, posed through its chat template)."""
        return self.policy.decode(self(jnp.asarray(self.policy.encode_prompts(texts)), key))


def text_algorithm(settings, mesh, policy: TextPolicy, init, update, parts, init_from_params=None,
                   starts_from: str = "", state_specs=None) -> engine.Algorithm:
    """A text algorithm's record: `init(key)` and `update` with `policy`'s evaluation, actor and files (and its
    state's PartitionSpecs, unless `state_specs` gives others); with `init_from_params(key, params)`, runs may
    start from a saved run's parameters (those of `starts_from`)."""
    mesh_lib.check_divisible("num_prompts", policy.settings.num_prompts, mesh)
    return engine.Algorithm(settings, mesh, init=init, update=update,
                            state_specs=state_specs or policy.state_specs,
                            evaluate=policy.evaluate, actor=policy.actor,
                            write_files=policy.write_files, write_artifacts=policy.write_artifacts,
                            init_from_params=init_from_params, starts_from=starts_from, parts=parts,
                            sized_by={"params": "config.model's sizes", "opt_state": "config.model's sizes"})


# ---------------------------------------------------------------------------------------------------
# SFT


def sft_batch(policy: TextPolicy, key: jax.Array):
    """This device's share of B training problems: (prompts [b, P], answers [b, A])."""
    problems = policy.task.sample(key, policy.settings.num_prompts, "train")
    problems = jax.tree.map(mesh_lib.local_share, problems)
    return policy.task.prompts(problems, policy.vocab), policy.task.reference_answers(problems, policy.vocab)


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
    prompts, answers, key = batch
    real = answers != policy.vocab.pad_id
    attend = None
    if policy.multi_turn:  # a demonstration episode: learn the model's turns, attend to the environment's too
        mask, attend = (real & policy.task.turn_slots()[1]).astype(jnp.float32), real
    else:
        mask = real.astype(jnp.float32)
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


def _overlay(fresh, loaded, fresh_ok: tuple[str, ...] = (), path: str = ""):
    """`fresh` parameters (nested dicts) with every leaf taken from `loaded` (a warm start's, whose leaves
    `fresh` lacks are dropped), which must hold each at the same shape, except under the paths `fresh_ok` ("a/b")
    that may be missing and stay fresh (a new value head). Shapes are static: a mismatch raises while tracing,
    before anything is compiled."""
    if not isinstance(fresh, dict):
        if fresh.shape != loaded.shape:
            raise ValueError(f"config.{INIT_FROM.key}: the saved run's {path} is {list(loaded.shape)}, this "
                             f"config's model has {list(fresh.shape)}: config.model must match the saved run's")
        return loaded.astype(fresh.dtype)
    missing = [f"{path}/{k}".lstrip("/") for k in fresh if k not in loaded]
    if any(m not in fresh_ok for m in missing):
        raise ValueError(f"config.{INIT_FROM.key}: the saved run has no parameters "
                         f"{[m for m in missing if m not in fresh_ok][0]}; config.model must match the saved run's")
    return {k: _overlay(v, loaded[k], fresh_ok, f"{path}/{k}".lstrip("/")) if k in loaded else v
            for k, v in fresh.items()}


# ---------------------------------------------------------------------------------------------------
# GRPO on tokens


KL_COEF = Knob("loss.kl_coef", 0.0, "> 0: a KL penalty to the frozen starting policy, of this weight", traced=True,
               minimum=0.0)
LAYER_POLICY = Knob("loss.layer_policy", 0, "l > 0: for the first loss.layer_policy_updates updates the loss "
                    "optimises the internal policy of layer l (the hidden state after layer l through the final norm "
                    "and unembedding), not the model's (BuPO); 0: off", minimum=0)
EXPERT_COEF = Knob("loss.expert_coef", 0.0, "> 0: AHPO's expert term (MM-HELIX), this x the mean token negative "
                  "log-likelihood of the task's reference answer of each prompt whose group's pass rate is at most "
                  "loss.expert_below, averaged over the batch's prompts (SFT where rewards are sparse); 0: off",
                  traced=True, minimum=0.0)
REFERENCE_RESET = Knob("loss.reference_reset", 0, "> 0: every this many updates the reference policy becomes the "
                       "current one and the optimiser's state starts afresh (ProRL's reference resets); 0: never",
                       minimum=0)


@struct.dataclass
class TextGRPOHyperparams:
    """Traced numbers of the RL update (a sweep may vary them)."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()
    clip_low: float = losses.CLIP_LOW.field()
    clip_high: float = losses.CLIP_HIGH.field()
    kl_coef: float = KL_COEF.field()
    teacher_coef: float = losses.TEACHER_COEF.field()
    expert_coef: float = EXPERT_COEF.field()
    score_scale: float = losses.SCORE_SCALE.field()
    confidence_penalty: float = losses.CONFIDENCE_PENALTY.field()
    token_keep: float = losses.TOKEN_KEEP.field()
    sample_keep: float = losses.SAMPLE_KEEP.field()
    min_distinctiveness: float = losses.MIN_DISTINCTIVENESS.field()
    entropy_shaping: float = losses.ENTROPY_SHAPING.field()
    clip_smoothing: float = losses.CLIP_SMOOTHING.field()
    novelty_sharpening: float = losses.NOVELTY_SHARPENING.field()
    novelty_floor: float = losses.NOVELTY_FLOOR.field()  # < 1: ETTRL's EAR
    confidence_clip: float = losses.CONFIDENCE_CLIP.field()  # ECHO
    confidence_share: float = losses.CONFIDENCE_SHARE.field()  # ECHO
    soft_advantage: float = losses.SOFT_ADVANTAGE.field()
    entropy_bound: float = losses.ENTROPY_BOUND.field()
    ent_coef: float = losses.ENT_COEF.field()
    vf_coef: float = losses.VF_COEF.field()  # (of the value head, when critic_weight > 0)
    critic_weight: float = CRITIC_WEIGHT.field()  # advantages = (1 - w) * group + w * standardised (reward - value)
    correction_low: float = corrections.CORRECTION_LOW.field()
    correction_high: float = corrections.CORRECTION_HIGH.field()
    temperature: float = knob("sampling.temperature", 1.0, "the sampling temperature (0: greedy)", traced=True,
                              minimum=0.0)
    top_p: float = knob("sampling.top_p", 1.0, "nucleus sampling: the smallest set of tokens holding this much "
                        "probability", traced=True, above=0.0, maximum=1.0)
    reward_model_weight: float = knob("reward.model_weight", 1.0, "with reward.model: the learned reward's share of "
                                      "the correct reward, the verifier's the rest (1: the model alone)", traced=True,
                                      minimum=0.0, maximum=1.0)


@dataclasses.dataclass(frozen=True)
class TextGRPOSettings:
    """Static choices of token GRPO: the policy's and the optimiser's (`text`), the group, estimator, loss and
    rollout strategies."""

    text: TextSettings
    # Rollout strategies per stage, in the order they run: ((stage, (name, ...)), ...) (`rollout.settings_of`)
    rollout: tuple[tuple[str, tuple[str, ...]], ...]
    rollout_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # (strategy, ((key, value), ...))
    # > 0: train on a fixed pool of this many problems (memory per problem); 0: fresh ones
    pool_size: int = knobs.declared("rollout.pool_size").field()
    group_size: int = GROUP_SIZE.field()
    oversample: int = knob("group.oversample", 1, "candidate prompts per slot, of which a selecting Control "
                           "strategy keeps one", minimum=1)
    top_k: int = knob("sampling.top_k", 0, "sample among the k most likely tokens; 0: all", minimum=0)
    advantage: str = advantages.ESTIMATOR.field()
    advantage_options: tuple[tuple[str, Any], ...] = ()
    merges_groups: bool = knob("advantage.merge_problem_groups", False, "the groups of one pool problem in an update "
                               "(a prompt given several by a budget, DARS's first round and its extra rollouts, a "
                               "problem drawn twice) share one baseline and scale, over all their members on every "
                               "device (needs rollout.pool_size > 0)")
    reward_weights: tuple[float, ...] = knob("reward_weights", (1.0, 0.1), "the weight of each reward component "
                                             "(correct, well_formed)", rule="two weights (correct, well_formed)",
                                             accepts=lambda weights: len(weights) == 2, convert=tuple)
    process_weight: float = knob("advantage.process_weight", 0.0, "with an implicit reward model (reward.model): the "
                                 "weight of its per-token process rewards (PRIME), summed to go against the group's "
                                 "leave-one-out baseline and standardised, added to every token's advantage",
                                 minimum=0.0)
    reward_model: str = knob("reward.model", "", "a text_reward_model run whose model scores each completion as its "
                             "correct reward (sigmoid of the score; see reward.model_weight); '': the task's verifier")
    length_penalty: float = knob("reward.length_penalty", 0.0, "> 0: ARLCP's complexity-calibrated length penalty: "
                                 "a correct completion's correct reward loses this x (1 - the problem's difficulty) x "
                                 "its share of the length limit (easy problems deserve short answers)", minimum=0.0)
    progressive: int = knob("reward.progressive", 0, "> 0: PRS's progressive reward shaping over this many "
                            "updates: the correct component's weight starts on well_formed and moves linearly back to "
                            "it, so that the effective weights go from (0, w_correct + w_well_formed) at update 0 to reward_weights at this "
                            "update (`progressive_rewards`); 0: reward_weights throughout", minimum=0)
    label_free: str = knob("reward.label_free", "", "majority: the correct reward is agreement with the group's most "
                           "common well-formed answer, no label read (MM-UPT, TTRL: test-time RL); '': the verifier's",
                           choices=("", "majority"))
    ratio: str = losses.RATIO.field()
    aggregate: str = losses.AGGREGATE.field()
    correction: str = corrections.CORRECTION.field()
    ess_step: bool = corrections.ESS_STEP.field()
    dual_clip: float | None = losses.DUAL_CLIP.field(convert=lambda bound: bound or None)
    kl: str = knob("loss.kl", "k3", "the KL estimator of the penalty to the starting policy",
                   choices=tuple(losses.KL_ESTIMATORS))
    use_kl: bool = KL_COEF.field(convert=lambda kl_coef: kl_coef > 0)
    objective: str = losses.OBJECTIVE.field()
    shapes_confidence: bool = losses.CONFIDENCE_PENALTY.field(convert=lambda penalty: penalty > 0)  # ACE
    reference_reset: int = REFERENCE_RESET.field()
    teacher: str = losses.TEACHER.field()
    learns_expert: bool = EXPERT_COEF.field(convert=lambda coef: coef > 0)  # AHPO's expert term
    expert_below: float = knob("loss.expert_below", 0.0, "with loss.expert_coef: the prompts whose group's pass rate "
                               "(over the members the policy sampled, replays excluded) is at most this get the "
                               "expert term (0: those that solved nothing)", minimum=0.0, maximum=1.0)
    samples_tokens: bool = losses.TOKEN_KEEP.field(convert=lambda keep: keep < 1)  # D3S's token-level selection
    samples_members: bool = losses.SAMPLE_KEEP.field(convert=lambda keep: keep < 1)  # D3S's sample-level selection
    keep_schedule: int = losses.KEEP_SCHEDULE.field()
    rectifies: bool = losses.MIN_DISTINCTIVENESS.field(convert=lambda d: d > 0)  # DaGRPO's pair masking
    shapes_entropy: bool = losses.ENTROPY_SHAPING.field(convert=lambda coef: coef > 0)
    smooths_clip: bool = losses.CLIP_SMOOTHING.field(convert=lambda strength: strength > 0)  # VSPO
    sharpens_novelty: bool = losses.NOVELTY_SHARPENING.field(convert=lambda strength: strength > 0)  # XRPO
    clips_by_confidence: bool = losses.CONFIDENCE_CLIP.field(convert=lambda floor: floor > 0)  # ECHO
    shapes_by_confidence: bool = knob("advantage.confidence_entropy_shaping", False, "with reward.label_free: ECHO's "
                                      "hybrid shaping, advantages x (w c + (1 - w)(1 - H / log V)), c the group's vote "
                                      "confidence, H the completion's mean token entropy, w advantage.confidence_share")
    softens: bool = losses.SOFT_ADVANTAGE.field(convert=lambda tau: tau > 0)  # TempSamp-R1
    layer_policy: int = LAYER_POLICY.field()
    layer_policy_updates: int = knob("loss.layer_policy_updates", 20, "with loss.layer_policy: the updates (from the "
                                     "start) that optimise the internal layer policy", minimum=1)
    truncated: str = knob("loss.truncated", "train", "completions cut off by the length limit (no EOS): trained as any "
                          "other, carrying no loss (mask: DAPO's overlong filtering), or carrying none where their "
                          "advantage is negative (mask_negative: MicroCoder-GRPO's conditional masking: not pushed down "
                          "for running out of room)", choices=("train", "mask", "mask_negative"))
    num_epochs: int = NUM_EPOCHS.field()
    num_minibatches: int = NUM_MINIBATCHES.field()
    max_staleness: int = staleness.MAX_STALENESS.field()
    split_actor: bool = staleness.SPLIT_ACTOR.field()
    # Multi-turn episodes: the per-turn estimators' options (`advantages.TurnOptions`), and the turn-level critic's
    turn_gamma: float = knob("advantage.turn_gamma", 1.0, "multi-turn episodes: the discount between turns of the "
                             "returns-to-go (per-turn estimators, the turn-level critic)", minimum=0.0, maximum=1.0)
    step_weight: float = knob("advantage.step_weight", 1.0, "gigpo: the weight of the step-level (anchor state) "
                              "advantage beside the episode's", minimum=0.0)
    turn_mix: float = knob("advantage.turn_mix", 0.5, "mapo: the turn-level normalisation's share of the mixed "
                           "advantage (the batch-level one has the rest)", minimum=0.0, maximum=1.0)

    @property
    def batch_size(self) -> int:
        """Completions per update, over all devices (B prompts x G)."""
        return self.text.num_prompts * self.group_size

    @property
    def keeps_reference(self) -> bool:
        """A frozen copy of the starting policy is kept (`keeps_reference`)."""
        return keeps_reference(self.use_kl, self.shapes_confidence, self.objective)

    num_updates = property(lambda self: self.text.num_updates)  # (what the engine and the loop read of `text`)
    xla_options = property(lambda self: self.text.xla_options)


@struct.dataclass
class TextGRPOState:
    """Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    key: jax.Array
    update_step: jax.Array
    ref_params: Any = None  # the frozen reference policy (None without a KL term)
    memory: Any = None  # {strategy name: its memory} of the rollout strategies that keep one
    # With actor.max_staleness = eta > 0: the batches sampled and not yet learned from, oldest first
    # ({"batches": `_sample_batch`'s batch with leaves [eta, ...], "filled": how many hold one}); else None
    pending: Any = None


@struct.dataclass
class TextGRPOLearnedRewardState(TextGRPOState):
    """`TextGRPOState` of a run with reward.model: the frozen reward model's variables beside it (a class of its own,
    so that the checkpoints of runs without one keep their layout)."""

    reward_model: Any = None


@struct.dataclass
class TextGRPOTeacherState(TextGRPOState):
    """`TextGRPOState` of a run with loss.teacher: the frozen teacher's parameters beside it (a class of its own, so
    that the checkpoints of runs without one keep their layout)."""

    teacher: Any = None


class TextGRPO:
    """GRPO and its variants on a text task: the update of one seed on this device's share of the B prompt
    slots, and what the rollout strategies read (`settings`, `task`, `vocab`, `model`, `pool`,
    `strategy_options`). No base class; `build_text_grpo` makes its `engine.Algorithm` (whose `parts` it is).

      B x oversample candidate problems (fresh ones, or from a fixed pool with `pool_size`)
      -> the rollout strategies' stages (`jaxrl.rollout`): hints, G completions each with rewards [.., G, K]
      from the task's verifier, memory updates, filters, B groups kept (by default DAPO's dynamic sampling:
      per slot, the first candidate whose rewards vary), replayed samples
      -> group advantages (jaxrl.advantages) -> epochs x minibatches of `losses.policy_loss` (with loss.expert_coef
      plus AHPO's SFT term on the reference answers of the groups whose pass rate is at most loss.expert_below).

    With `critic_weight` w > 0 the model gets a value head (a fresh one on a warm start) that regresses
    every prefix onto the completion's weighted reward; the per-token advantage becomes
    (1 - w) * group advantage + w * standardised (reward - value), as in env GRPO (w = 1: PPO on tokens
    with a learned baseline, no group needed for the baseline).
    """

    def __init__(self, settings: TextGRPOSettings, mesh, policy: TextPolicy,
                 learned_reward: LearnedReward | None = None, teacher: TextPolicy | None = None):
        self.settings, self.mesh, self.policy, self.learned_reward = settings, mesh, policy, learned_reward
        self.teacher = teacher  # (loss.teacher's model, tokenizer and task)
        self.task, self.vocab, self.model = policy.task, policy.vocab, policy.update_model
        self.use_critic = self.model.config.value_head
        self.layer_model = None  # BuPO: the internal policy of layer loss.layer_policy, the same parameters
        if settings.layer_policy:
            if settings.layer_policy >= self.model.config.num_layers:
                raise ValueError(f"config.loss.layer_policy={settings.layer_policy} must name a layer below the model's "
                                 f"last ({self.model.config.num_layers} layers)")
            self.layer_model = type(self.model)(dataclasses.replace(self.model.config,
                                                                    exit_layer=settings.layer_policy))
        self.per_turn = advantages.ESTIMATORS[settings.advantage].per_turn  # scores turns of multi-turn episodes
        self.conditions = advantages.ESTIMATORS[settings.advantage].conditions  # RCRL: return-marked prompts
        self.estimator = None if self.per_turn else advantages.get(settings.advantage)
        self.multi_turn = policy.multi_turn
        self.pipeline = rollout.Pipeline.of(settings.rollout, settings.rollout_options)
        self.strategy_options = self.pipeline.options_of  # name -> a chosen strategy's options (the hooks read)
        # Slots of candidates whose decoding stops once each holds a finished group (0: never stop early).
        self.stop_slots = settings.oversample if self.pipeline.any("stops_early") else 0
        # The training pool: problem i is the same for every seed and device (a dataset, drawn once; the task's
        # jitted sampler compiles once per task and size, not per algorithm built).
        self.pool = self.task.sample(jax.random.key(0), settings.pool_size, "train") if settings.pool_size else None
        staleness.check_layout(settings.split_actor, mesh)
        # Minibatches deal whole groups (the loss scores a group's prompt once): each device's prompts must
        # split evenly.
        local_prompts = settings.text.num_prompts // mesh.shape[DATA_AXIS]
        if local_prompts % settings.num_minibatches:
            raise ValueError(f"the {local_prompts} prompts (groups) on each device cannot be split into "
                             f"num_minibatches={settings.num_minibatches} equal minibatches: prompts per device "
                             f"must be a multiple of {settings.num_minibatches}")

    def init(self, key: jax.Array, params=None, reward_model=None, teacher=None) -> TextGRPOState:
        """A fresh state for one seed, from `params` when given (a warm start; a fresh value head if it has one), and
        with reward.model, the reward model run's parameters `reward_model` ({"params", "sampler"}; a fresh model of
        its shapes when not given: what a checkpoint restores into)."""
        state = self.policy.init(key, params)
        ref = state.params if self.settings.keeps_reference and not self.policy.adapters else None
        memory = self.pipeline.init(self, jax.random.fold_in(key, 2), state.params)
        state = TextGRPOState(state.params, state.opt_state, state.key, state.update_step, ref, memory)
        if self.learned_reward is not None:
            state = TextGRPOLearnedRewardState(**vars(state), reward_model=self.learned_reward.variables(
                reward_model, jax.random.fold_in(key, 3)))
        if self.teacher is not None:  # (a fresh model of its shapes when not given: what a checkpoint restores into)
            if teacher is None:
                teacher = self.teacher.init_params(jax.random.fold_in(key, 4))
            state = TextGRPOTeacherState(**vars(state), teacher=teacher)
        if not self.settings.max_staleness:
            return state
        return state.replace(pending=staleness.empty_queue(self._sample_batch, state, TextGRPOHyperparams,
                                                           self.settings.max_staleness))

    def state_specs(self, state: TextGRPOState):
        """The policy's PartitionSpecs (`TextPolicy.state_specs`); the queued batches' prompts split over the
        data axis as the devices sampled them (their epoch keys, the same on every device, over runs only)."""
        specs = self.policy.state_specs(state)
        if state.pending is None:
            return specs
        units, _ = state.pending["batches"]  # (and the epoch key)
        return specs.replace(pending=staleness.queue_specs((jax.tree.map(lambda _: P(RUN_AXIS, DATA_AXIS), units),
                                                            P(RUN_AXIS))))

    # ----------------------------------------------------------------------------------------------

    def _rollout(self, state: TextGRPOState, hp: TextGRPOHyperparams, key: jax.Array):
        """The stages of `jaxrl.rollout` for one seed on this device: (memory, Groups [b, G, ...], metrics)."""
        plan_key, sample_key = jax.random.split(key)
        plan = rollout.plan_candidates(self, plan_key)
        scorer = getattr(state, "reward_model", None)
        rewarded = None if scorer is None else functools.partial(self._learned_rewards, scorer, hp)
        if self.settings.label_free == "majority":
            rewarded = self._majority_rewards
        memory, groups, metrics = self.pipeline.run(self, state.params, hp, state.memory, plan, sample_key, rewarded)
        local_prompts = self.settings.text.num_prompts // jax.lax.axis_size(DATA_AXIS)
        if groups.tokens.shape[0] != local_prompts:
            raise ValueError(f"the rollout strategies {[s.name for s in self.pipeline.strategies]} left "
                             f"{groups.tokens.shape[0]} groups on a device that trains {local_prompts}")
        return memory, groups, metrics

    def _learned_rewards(self, reward_model, hp: TextGRPOHyperparams, groups: rollout.Groups) -> rollout.Groups:
        """`groups` whose correct reward is w sigmoid(reward model's score) + (1 - w) verifier's (w:
        reward.model_weight), the verifier's components kept in `verified`."""
        scorer, process = self.learned_reward.scorer, None
        if self.settings.process_weight > 0:  # (an implicit model's score is its token rewards' sum)
            process = scorer.token_rewards(reward_model, groups.prompts, groups.tokens, groups.mask)
            scores = jnp.sum(process, axis=-1)
        else:
            scores = scorer(reward_model, groups.prompts, groups.tokens, groups.mask)
        correct = self.task.reward_names.index("correct")
        w = hp.reward_model_weight
        mixed = w * reward_models_lib.learned_reward(scores) + (1.0 - w) * groups.rewards[..., correct]
        return groups.replace(rewards=groups.rewards.at[..., correct].set(mixed), verified=groups.rewards,
                              process=process)

    def _majority_rewards(self, groups: rollout.Groups) -> rollout.Groups:
        """`groups` whose correct reward is `majority_votes`' pseudo-label, the verifier's components kept in
        `verified` (never trained on: the learned-reward diagnostics compare them)."""
        names = self.task.reward_names
        formed = groups.rewards[..., names.index("well_formed")] > 0
        label = majority_votes(groups.tokens, groups.mask, formed).astype(jnp.float32)
        return groups.replace(rewards=groups.rewards.at[..., names.index("correct")].set(label), verified=groups.rewards)

    def _score(self, params, batch, layer_phase=None):
        """`sampling.score_groups` of the batch by the model, or (where the traced `layer_phase` holds) by its internal
        layer policy (BuPO)."""
        if layer_phase is None:
            return self._scored_by(self.model, params, batch)
        return jax.lax.cond(layer_phase, functools.partial(self._scored_by, self.layer_model),
                            functools.partial(self._scored_by, self.model), params, batch)

    def _scored_by(self, model, params, batch):
        return sampling.score_groups(model, params, batch["prompts"], batch["tokens"], batch["mask"], self.vocab.pad_id,
                                     batch.get("attend"))

    def _loss(self, params, batch, hp: TextGRPOHyperparams, layer_phase=None):
        """batch: whole groups, prompts [m, P] and the rest [m, G, ...]; `layer_phase`: the loss is the internal layer
        policy's (BuPO; its old log-probabilities are then that policy's too)."""
        if self.conditions:  # RCRL learns by likelihood alone: no ratio to the sampler, whose prompts were others
            return self._conditioned_nll(params, batch)
        s = self.settings
        scored = self._score(params, batch, layer_phase)
        # One row per completion [m*G, N] from here on.
        log_probs, entropy, values = (None if x is None else x.reshape(-1, x.shape[-1]) for x in scored)
        batch = {k: v if k in PER_PROMPT else v.reshape(-1, *v.shape[2:]) for k, v in batch.items()}
        trained = batch["mask"] * batch["weight"]
        mask = trained
        if s.samples_tokens:  # D3S: the policy loss on the tokens of largest |A| x entropy only
            mask = trained * losses.informative_tokens(batch["advantages"], entropy, trained, hp.token_keep)
        if s.shapes_by_confidence:  # ECHO: uncertain labels and uncertain completions move the policy less
            batch = dict(batch, advantages=losses.confidence_entropy_shaped(
                batch["advantages"], batch["confidence"], entropy, batch["mask"], hp.confidence_share, self.vocab.size))
        clip_low, clip_high = group_clip_range(s, hp, batch)
        if s.shapes_entropy:
            batch = dict(batch, advantages=losses.entropy_shaped(batch["advantages"], entropy, hp.entropy_shaping,
                                                                 hp.entropy_bound))
        outcome = None
        if losses.OBJECTIVES[s.objective].needs_outcome:
            outcome = losses.Outcome(batch["correct"], batch["pass_rate"], s.group_size)
        total, aux = losses.policy_loss(
            log_probs, batch["log_probs"], batch["advantages"], mask,
            clip_low=clip_low, clip_high=clip_high, dual_clip=s.dual_clip, ratio=s.ratio,
            aggregate=s.aggregate, constant_length=self.task.answer_length,
            ref_log_prob=batch.get("ref_log_probs"), kl=s.kl, kl_coef=hp.kl_coef,
            entropy=entropy, ent_coef=hp.ent_coef, weight=batch.get("correction"), objective=s.objective,
            outcome=outcome, score_scale=hp.score_scale,
            confidence_penalty=hp.confidence_penalty if s.keeps_reference else None,
            segments=(multi_turn.token_turns(self.task), self.task.max_turns) if s.ratio == "turn" else None,
            axis_name=DATA_AXIS)
        if self.teacher is not None:  # KDRL: the reverse KL to the teacher, per token, aggregated as the objective
            teacher_kl = losses.aggregate(losses.kl_estimate(log_probs, batch["teacher_log_probs"], s.kl), trained,
                                          s.aggregate, self.task.answer_length, DATA_AXIS)
            total, aux = total + hp.teacher_coef * teacher_kl, dict(aux, teacher_kl=teacher_kl)
        if s.learns_expert:  # AHPO: SFT on the reference answers of the prompts whose rewards are sparse
            nll = self._expert_nll(params, batch["prompts"], batch["expert"], layer_phase)
            total, aux = total + hp.expert_coef * nll, dict(aux, expert_nll=nll)
        if self.use_critic:
            errors = losses.value_loss(values, None, batch["returns"], None)
            value_mask = batch.get("value_mask", batch["mask"])
            value_loss = losses.aggregate(errors, value_mask, "token", axis_name=DATA_AXIS)
            total, aux = total + hp.vf_coef * value_loss, dict(aux, value_loss=value_loss)
        return total, aux

    def _conditioned_nll(self, params, batch):
        """RCRL's loss: the mean token NLL of every completion tokens [m, G, N] given its return-marked prompt
        return_prompts [m, G, P] (`return_prompts`), each scored as a one-member group; (loss, metrics)."""
        m, G, N = batch["tokens"].shape
        log_probs, _, _ = sampling.score_groups(self.model, params, batch["return_prompts"].reshape(m * G, -1),
                                                batch["tokens"].reshape(m * G, 1, N),
                                                batch["mask"].reshape(m * G, 1, N), self.vocab.pad_id)
        trained = (batch["mask"] * batch["weight"]).reshape(m * G, N)
        nll = losses.aggregate(-log_probs[:, 0], trained, "token", axis_name=DATA_AXIS)
        return nll, {"return_conditioned_nll": nll}

    def _expert_nll(self, params, prompts, expert: dict, layer_phase=None):
        """`losses.expert_nll` of the expert answers expert["answers"] [m, A] to prompts [m, P] (gated by
        expert["gate"] [m]), teacher-forced as one-member groups through `_score`."""
        answers = {"prompts": prompts, "tokens": expert["answers"][:, None], "mask": expert["mask"][:, None]}
        log_probs, _, _ = self._score(params, answers, layer_phase)
        return losses.expert_nll(log_probs[:, 0], expert["mask"], expert["gate"], DATA_AXIS)

    def _expert_units(self, groups: rollout.Groups):
        """AHPO's expert data for `_loss`, per prompt: the task's reference answer [b, A], its mask (the answer and
        its EOS) and the gate [b] (`sparse_rewards` of the verifier's outcomes at loss.expert_below); and the share
        of prompts gated, over devices."""
        verified = groups.rewards if groups.verified is None else groups.verified  # (a reward model's are not)
        correct = verified[..., self.task.reward_names.index("correct")] > 0
        gate = sparse_rewards(correct, ~groups.replayed, self.settings.expert_below).astype(jnp.float32)
        answers = self.task.reference_answers(groups.problems, self.vocab)
        mask = (answers != self.vocab.pad_id).astype(jnp.float32)
        return {"answers": answers, "mask": mask, "gate": gate}, global_mean(gate)

    # ----------------------------------------------------------------------------------------------
    # One update: sampling (rollouts, rewards, advantages), then learning (reference scores, epochs x
    # minibatches), in the chunk's one program.

    def _group_advantages(self, groups: rollout.Groups, update_step=None):
        """Per-token advantages and loss weights [b, G, N] of the kept groups, and which groups' verifier
        rewards all tie [b]. A filter's bonus enters as one more reward component (weight 1) where they tie.
        With reward.progressive the components are first shaped by the update step (`progressive_rewards`)."""
        s = self.settings
        rewards, weights = groups.rewards, s.reward_weights
        tied = jnp.all(rewards == rewards[:, :1], axis=(1, 2))
        if s.progressive:  # (after the ties are read: the verifier's outcomes decide what a filter sees)
            names = self.task.reward_names
            rewards = progressive_rewards(rewards, update_step, s.progressive, names.index("correct"),
                                          names.index("well_formed"))
        if s.length_penalty:  # (after the ties are read: length alone does not untie a group for a filter's bonus)
            rewards = length_penalised(rewards, groups.lengths, self.task.difficulty(groups.problems),
                                       self.task.reward_names.index("correct"), s.length_penalty,
                                       self.task.answer_length)
        if self.pipeline.uses_bonus:
            rewards = jnp.concatenate([rewards, (groups.bonus * tied[:, None])[..., None]], axis=-1)
            weights = (*weights, 1.0)
        if self.per_turn:  # each turn against the group's turns (`advantages.turn_advantages`)
            taken, turn_rewards = groups.turns["taken"], self._turn_rewards(groups)
            if self.pipeline.uses_bonus:  # a filter's bonus is earned by the episode's last turn
                last = taken & (jnp.cumsum(taken, -1) == taken.sum(-1, keepdims=True))
                turn_rewards = turn_rewards + (groups.bonus * tied[:, None])[..., None] * last
            per_turn = advantages.turn_advantages(s.advantage, turn_rewards, taken, groups.turns["anchor"],
                                                  **self._turn_options())
            return multi_turn.turn_to_tokens(per_turn, self.task), jnp.ones((*per_turn.shape[:2], 1)), tied
        generator = self.pipeline.generator
        if generator.advantages:  # structured samples (trees) score their tokens themselves
            token_advantages, weight = generator.advantages(self, groups, rewards @ jnp.asarray(weights))
            return token_advantages, weight, tied
        context = {}
        reads = advantages.ESTIMATORS[s.advantage].reads
        if reads == "strata":  # an episode's structure: how many tools it called
            context["strata"] = groups.turns["tool_call"].sum(-1)
        if reads == "baseline":  # the problem's tracked value, in the units of the weighted reward
            context["baseline"] = groups.baseline @ jnp.asarray(s.reward_weights)
        if reads == "prior":  # the value head at state zero: its prediction of the weighted reward from the prompt
            context["prior"] = groups.values[:, 0, 0]
        options = dict(reward_weights=weights, **context, **dict(s.advantage_options))
        group = advantages.merged_by_problem(self.estimator, rewards, groups.ids, over_devices=True, **options) \
            if s.merges_groups else self.estimator(rewards, None, **options)
        return jnp.broadcast_to(group.advantages[..., None], groups.tokens.shape), group.weight[..., None], tied

    def _turn_options(self) -> dict:
        s, options = self.settings, dict(self.settings.advantage_options)
        return dict(gamma=s.turn_gamma, step_weight=s.step_weight, turn_mix=s.turn_mix, eps=options["eps"],
                    scale=(options["scale"] or "group") != "none")

    def _turn_rewards(self, groups: rollout.Groups) -> jax.Array:
        """float32 [b, G, K]: each turn's share of the episode's weighted reward (`reward_weights` . (correct,
        well_formed)): its task reward, and its well-formedness over the turns taken; they sum to the episode's."""
        turns, (w_correct, w_formed) = groups.turns, self.settings.reward_weights
        taken = jnp.maximum(turns["taken"].sum(-1, keepdims=True), 1)
        return w_correct * turns["reward"] + w_formed * turns["well_formed"] / taken

    def _turn_critic(self, groups: rollout.Groups):
        """The turn-level critic of multi-turn episodes: per token [b, G, N] the return-to-go of its turn (the value
        target), the value at the turn's start (predicted at the end of the environment's last answer) and where the
        value head learns (each turn's first token)."""
        to_go = advantages.turn_returns(self._turn_rewards(groups), groups.turns["taken"], self.settings.turn_gamma)
        starts = multi_turn.first_slots(groups.mask, self.task)
        start_values = jnp.where(starts, groups.values, 0.0).reshape(*groups.values.shape[:2], self.task.max_turns, -1)
        start_values = start_values.sum(-1)  # [b, G, K]
        return (multi_turn.turn_to_tokens(to_go, self.task), multi_turn.turn_to_tokens(start_values, self.task),
                groups.mask * starts)

    def _sample_batch(self, state: TextGRPOState, hp: TextGRPOHyperparams):
        """For one seed on this device: (state with its key and rollout memory advanced, (units: prompts
        [b, P] and the rest [b, G, ...], epoch key), sampling metrics)."""
        s = self.settings
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        memory, groups, metrics = self._rollout(state, hp, rollout_key)
        advantages, weight, tied = self._group_advantages(groups, state.update_step)
        if s.softens:  # TempSamp-R1: an off-policy ground-truth member's outlier advantage compressed
            advantages = losses.soft_advantages(advantages, hp.soft_advantage)
        if s.sharpens_novelty:  # XRPO: correct completions the sampler found unlikely weigh more (EAR: likely ones less)
            advantages = losses.novelty_sharpened(advantages, groups.log_probs, groups.mask, hp.novelty_sharpening,
                                                  hp.novelty_floor)
        if groups.process is not None:  # an implicit reward model's dense process rewards (PRIME)
            dense = standardise(process_returns(groups.process, groups.mask), groups.mask)
            advantages = advantages + s.process_weight * dense
        if self.pipeline.uses_bonus:
            metrics["ranked"] = global_mean(tied.astype(jnp.float32))
        b, G, N = groups.tokens.shape
        units = {"prompts": groups.prompts, "tokens": groups.tokens, "mask": groups.mask,
                 "log_probs": groups.log_probs, "weight": weight * groups.weight}
        if groups.attend is not None:  # multi-turn episodes: the environment's tokens are seen, not learned
            units["attend"] = groups.attend
        if s.correction != "none":  # the policies that drew each token, for `_learn`'s correction
            units["behaviour"] = groups.log_probs if groups.behaviour is None else groups.behaviour
        if self.use_critic and self.multi_turn:  # a turn-level critic: values at turn starts, returns-to-go
            returns, values, units["value_mask"] = self._turn_critic(groups)
            critic = standardise(returns - values, groups.mask)
            advantages = (1.0 - hp.critic_weight) * advantages + hp.critic_weight * critic
            units["returns"] = returns
        elif self.use_critic:  # the value head predicts the completion's weighted reward from each prefix
            returns = jnp.broadcast_to((groups.rewards @ jnp.asarray(s.reward_weights))[..., None], (b, G, N))
            critic = standardise(returns - groups.values, groups.mask)
            advantages = (1.0 - hp.critic_weight) * advantages + hp.critic_weight * critic
            units["returns"] = returns
            if groups.pruned is not None:  # a pruned member's reward is not its prefix's value: not a target
                units["value_mask"] = groups.mask * ~groups.pruned[..., None]
        if s.samples_members or s.rectifies:  # selections of whole members, by their mean advantage
            units["weight"], metrics = self._select_members(groups, advantages, units["weight"], state.update_step,
                                                            hp, metrics)
        if s.truncated != "train":
            cut = truncated(groups.tokens, groups.mask, self.vocab.eos_id, groups.pruned)
            units["weight"] = units["weight"] * kept_tokens(cut, advantages, s.truncated)
            metrics["truncated"] = global_mean(cut.astype(jnp.float32))
        units["advantages"] = advantages
        solved = groups.rewards[..., self.task.reward_names.index("correct")] > 0.5  # [b, G]: each member's outcome
        if self.conditions:  # RCRL: each member's prompt marked with its outcome
            units["return_prompts"] = return_prompts(groups.prompts, solved, self.vocab)
        if s.clips_by_confidence or s.shapes_by_confidence:  # ECHO: how far each group agreed on its pseudo-label
            names = self.task.reward_names
            confidence = vote_confidence(groups.rewards[..., names.index("correct")] > 0,
                                         groups.rewards[..., names.index("well_formed")] > 0)
            units["confidence"] = jnp.broadcast_to(confidence[:, None], (b, G))
            metrics["vote_confidence"] = global_mean(confidence)
        if s.learns_expert:
            units["expert"], metrics["expert_share"] = self._expert_units(groups)
        if s.smooths_clip:  # VSPO: the clip range of each group by its task value at its observed pass rate
            value = rollout.tokens.BUDGET_TARGETS["value"](solved.mean(-1))  # [b]
            scale = losses.value_smoothed_clip(value, hp.clip_smoothing, DATA_AXIS)
            units["clip_scale"] = jnp.broadcast_to(scale[:, None], (b, G))
            metrics["clip_scale_spread"] = jax.lax.pmax(jnp.max(scale), DATA_AXIS) - jax.lax.pmin(jnp.min(scale),
                                                                                                    DATA_AXIS)
        if losses.OBJECTIVES[s.objective].needs_outcome:  # the verifier's label and its group's pass rate
            correct = solved.astype(jnp.float32)
            units["correct"] = correct
            units["pass_rate"] = jnp.broadcast_to(correct.mean(-1, keepdims=True), correct.shape)
        metrics.update({f"reward_{name}": global_mean(groups.rewards[..., i])
                        for i, name in enumerate(self.task.reward_names)})
        if groups.verified is not None:  # the learned reward against the true one (reward-hacking diagnostics)
            correct = self.task.reward_names.index("correct")
            learned, verified = groups.rewards[..., correct], groups.verified[..., correct]
            metrics.update(reward_verified=global_mean(verified), reward_gap=global_mean(learned - verified),
                           reward_model_agreement=global_mean(((learned > 0.5) == (verified > 0)).astype(jnp.float32)))
        if groups.turns is not None:
            episode = multi_turn.summary(groups.turns)
            calls = jax.lax.psum(episode["tool_calls"].sum(), DATA_AXIS)
            errors = jax.lax.psum(episode["tool_errors"].sum(), DATA_AXIS)
            metrics.update(turns=global_mean(episode["turns"]), tool_calls=global_mean(episode["tool_calls"]),
                           tool_error_rate=errors / jnp.maximum(calls, 1), solved=global_mean(episode["solved"]))
        metrics.update(completion_length=global_mean(groups.lengths),
                       zero_variance_fraction=global_mean(tied.astype(jnp.float32)),
                       tokens=jax.lax.psum(jnp.sum(groups.mask), DATA_AXIS))
        return state.replace(key=key, memory=memory), (units, epoch_key), metrics

    def _select_members(self, groups: rollout.Groups, advantages: jax.Array, weight: jax.Array, update_step,
                        hp: TextGRPOHyperparams, metrics: dict):
        """`weight` [b, G, N] times D3S's sample-level selection (`losses.varied_samples`) and DaGRPO's pair masking
        (`losses.distinct_samples`), each member scored by its mean advantage over its tokens; metrics with the
        share of members each keeps."""
        s = self.settings
        member = losses.completion_mean(advantages, groups.mask)  # [b, G]
        if s.samples_members:
            kept = losses.varied_samples(member, losses.relaxed_keep(hp.sample_keep, update_step, s.keep_schedule))
            weight, metrics = weight * kept[..., None], dict(metrics, members_kept=global_mean(kept))
        if s.rectifies:
            distinct = losses.distinct_samples(groups.tokens, groups.mask, member, hp.min_distinctiveness)
            weight, metrics = weight * distinct[..., None], dict(metrics, members_distinct=global_mean(distinct))
        return weight, metrics

    def _learn(self, state: TextGRPOState, batch, hp: TextGRPOHyperparams):
        """For one seed on this device: the optimisation of `_sample_batch`'s batch; (state, metrics)."""
        s = self.settings
        if s.samples_tokens and s.keep_schedule:  # D3S's schedule relaxes the token selection too
            hp = hp.replace(token_keep=losses.relaxed_keep(hp.token_keep, state.update_step, s.keep_schedule))
        units, epoch_key = batch
        metrics, step_scale = {}, None
        if s.correction != "none":
            # the proximal policy: these parameters, before the update, score every sample once
            proximal, _, _ = sampling.score_groups(self.model, state.params, units["prompts"], units["tokens"],
                                                   units["mask"], self.vocab.pad_id, units.get("attend"))
            behaviour, units = units["behaviour"], {k: v for k, v in units.items() if k != "behaviour"}
            fixed = corrections.correct(s.correction, behaviour, proximal, units["mask"], hp.correction_low,
                                        hp.correction_high)
            metrics = corrections.diagnostics(fixed, behaviour, proximal, units["mask"], axis_name=DATA_AXIS)
            units = dict(units, log_probs=fixed.anchor, correction=fixed.weight)
            step_scale = metrics["correction_ess"] if s.ess_step else None
        if s.keeps_reference:
            # (under LoRA the reference is the frozen base: the same arrays with the adapters off, no copy)
            reference = lora.base_only(state.params) if self.policy.adapters else state.ref_params
            ref, _, _ = sampling.score_groups(self.model, reference, units["prompts"], units["tokens"],
                                              units["mask"], self.vocab.pad_id, units.get("attend"))
            units = dict(units, ref_log_probs=ref)
        if self.teacher is not None:
            taught, _, _ = sampling.score_groups(self.teacher.update_model, state.teacher, units["prompts"],
                                                 units["tokens"], units["mask"], self.vocab.pad_id, units.get("attend"))
            units = dict(units, teacher_log_probs=taught)
        loss = self._loss
        if s.layer_policy:  # BuPO: early on, the internal layer policy's objective, its ratio against itself
            phase = state.update_step < s.layer_policy_updates
            units = dict(units, log_probs=jax.lax.cond(
                phase, lambda: self._scored_by(self.layer_model, state.params, units)[0], lambda: units["log_probs"]))
            loss, metrics = functools.partial(self._loss, layer_phase=phase), dict(metrics, layer_policy=1.0 * phase)
        optimizer = self.policy.optimizer(hp, state.update_step)
        groups = jax.tree.map(lambda x: x[:, None], units)  # one unit per prompt: minibatches deal whole groups
        params, opt_state, aux = optimise(loss, optimizer, state.params, state.opt_state, groups, hp, epoch_key,
                                          s.num_epochs, s.num_minibatches, step_scale)
        state = state.replace(params=params, opt_state=opt_state, update_step=state.update_step + 1)
        if s.reference_reset:
            state = reset_reference(state, optimizer, s.reference_reset)
        return state, {**metrics, **jax.tree.map(jnp.mean, aux)}

    def update(self, state: TextGRPOState, hp: TextGRPOHyperparams):
        """One update for one seed on this device: `_sample_batch`, then `_learn` on its batch (with
        `actor.max_staleness` = eta > 0: on the batch sampled eta updates before, on devices of its own with
        `mesh.split_actor`; `jaxrl.engine.staleness`)."""
        s = self.settings
        return staleness.update(self._sample_batch, self._learn, TEXT_ROLES, state, hp, s.max_staleness, s.split_actor)


def group_clip_range(s: TextGRPOSettings, hp: TextGRPOHyperparams, batch: dict):
    """Each completion's (clip_low, clip_high): the configured scalars, or [S, 1] where a group's trust region is its
    own: ECHO's vote confidence (`losses.confidence_clip_range`, batch["confidence"] [S]) and VSPO's task value
    (batch["clip_scale"] [S], `losses.value_smoothed_clip`) each scale it, and together their scales multiply."""
    clip_low, clip_high = hp.clip_low, hp.clip_high
    if s.clips_by_confidence:  # ECHO: a narrower trust region where few voted for the pseudo-label
        clip_low, clip_high = losses.confidence_clip_range(clip_low, clip_high, batch["confidence"], hp.confidence_clip)
    if s.smooths_clip:  # VSPO: wider where the group's task value is above the update's mean
        clip_low, clip_high = clip_low * batch["clip_scale"][:, None], clip_high * batch["clip_scale"][:, None]
    return clip_low, clip_high


def return_tokens(vocab) -> tuple[int, int]:
    """RCRL's two return marks (high, low) of the small model's vocabulary: its BOS, which opens every prompt the
    task renders (so sampling and greedy evaluation ask for a success as they are, and a warm start's SFT on
    correct answers already reads it so), and EOS, which no prompt holds, in BOS's place for a failure. Reusing
    these two specials keeps the vocabulary, and with it a warm start's embedding, unchanged."""
    return vocab.bos_id, vocab.eos_id


def return_prompts(prompts: jax.Array, success: jax.Array, vocab) -> jax.Array:
    """Return-conditioned RL's prompts (Havrilla et al. 2024): left-padded prompts [b, P] -> [b, G, P], member g's
    prompt with its BOS replaced by the mark of its return (`return_tokens`: high where `success` bool [b, G],
    low elsewhere)."""
    high, low = return_tokens(vocab)
    mark = jnp.where(success, high, low).astype(prompts.dtype)[..., None]  # [b, G, 1]
    tiled = jnp.broadcast_to(prompts[:, None], (*success.shape, prompts.shape[-1]))
    return jnp.where(tiled == vocab.bos_id, mark, tiled)


def length_penalised(rewards: jax.Array, lengths: jax.Array, difficulty: jax.Array, correct: int, penalty: float,
                     max_length: int) -> jax.Array:
    """ARLCP's complexity-calibrated length penalty: rewards [n, G, K] whose `correct` component, where positive, loses
    penalty x (1 - difficulty [n]) x lengths [n, G] / max_length: the easier the problem, the more a long correct
    answer costs; wrong answers are not charged."""
    cost = penalty * (1.0 - difficulty)[:, None] * lengths / max_length
    return rewards.at[..., correct].add(-jnp.where(rewards[..., correct] > 0, cost, 0.0))


def progressive_rewards(rewards: jax.Array, update_step, updates: int, correct: int, formed: int) -> jax.Array:
    """PRS's progressive reward shaping (Enhancing Agentic RL with Progressive Reward Shaping and Value-based Sampling
    Policy Optimization): first master the format, then correctness. Our reading of its stage-wise rewards: a linear
    curriculum over `updates` updates, a = min(update_step / updates, 1) (traced), in which the `correct` component
    of rewards [n, G, K] becomes a c + (1 - a) f, f the `formed` (well_formed) component. Under the weights
    (w_c, w_f) the weighted reward is then a w_c c + (w_f + (1 - a) w_c) f: at update 0 all the weight is on the
    format (w_c + w_f, the reward's scale kept), from update `updates` on it is the configured weighting. Mixing the
    components rather than the weights keeps the estimators' weights static."""
    a = jnp.minimum(jnp.asarray(update_step, jnp.float32) / updates, 1.0)
    return rewards.at[..., correct].set(a * rewards[..., correct] + (1.0 - a) * rewards[..., formed])


def sparse_rewards(correct: jax.Array, sampled: jax.Array, below: float) -> jax.Array:
    """bool [n]: AHPO's gate (MM-HELIX), a group's pass rate is at most `below`; the rate over its members the policy
    sampled (`sampled` bool [n, G]: replays excluded, the reference answer of replay=reference among them) of
    `correct` bool [n, G]; a group with none sampled has rate 0."""
    rate = jnp.sum(correct & sampled, axis=-1) / jnp.maximum(jnp.sum(sampled, axis=-1), 1)
    return rate <= below


def majority_votes(tokens: jax.Array, mask: jax.Array, formed: jax.Array) -> jax.Array:
    """bool [n, G]: each completion agrees with its group's majority answer, the most common of the well-formed
    (`formed` [n, G]) completions [n, G, N] (identical tokens up to their end; ties to the earliest); a group with no
    well-formed completion has no majority."""
    answers = jnp.where(mask > 0, tokens, -1)
    same = jnp.all(answers[:, :, None] == answers[:, None, :], axis=-1)  # [n, G, G]
    votes = jnp.sum(same & formed[:, None, :], axis=-1)  # [n, G]: well-formed completions agreeing with each
    winner = jnp.argmax(jnp.where(formed, votes, -1), axis=1)  # [n]
    agrees = jnp.take_along_axis(same, winner[:, None, None], axis=1)[:, 0]  # [n, G]
    return agrees & formed & formed.any(axis=1, keepdims=True)


def vote_confidence(agrees: jax.Array, formed: jax.Array) -> jax.Array:
    """float32 [n]: ECHO's confidence in each group's majority-vote pseudo-label, the share of its well-formed
    completions (`formed` bool [n, G]) that agree with it (`agrees` bool [n, G], `majority_votes`): in [1/G, 1], 0
    for a group with none well-formed (it has no label)."""
    return jnp.sum(agrees & formed, axis=-1) / jnp.maximum(jnp.sum(formed, axis=-1), 1)


def head_scores(values: jax.Array, mask: jax.Array) -> jax.Array:
    """float32 [..., k]: each of k samples' success as the value head last predicted it, before the sample's last
    token (values, mask float32 [..., k, N]: `Samples.values`, `Samples.mask`; an empty sample: column 0). The last
    prediction is the head's best-informed one (ARRoL reuses its rollout quality head at test time)."""
    last = jnp.maximum(mask.sum(-1).astype(jnp.int32) - 1, 0)
    return jnp.take_along_axis(values, last[..., None], axis=-1)[..., 0]


def best_by_head(rewards: jax.Array, scores: jax.Array) -> jax.Array:
    """[...]: the reward of the sample the head scores highest among k (rewards, scores [..., k]; a tie: the
    first), best-of-k by the value head (ARRoL's test-time selection): between pass@1 and pass@k."""
    pick = jnp.argmax(scores, axis=-1)
    return jnp.take_along_axis(rewards, pick[..., None], axis=-1)[..., 0]


def truncated(tokens: jax.Array, mask: jax.Array, eos_id: int, pruned: jax.Array | None = None) -> jax.Array:
    """bool [..., G]: completions [..., G, N] cut off by the length limit, without an EOS among their tokens (members a
    Control strategy stopped early, `pruned`, were not cut off)."""
    cut = ~(sampling.is_eos(tokens, eos_id) & (mask > 0)).any(-1)
    return cut if pruned is None else cut & ~pruned


def kept_tokens(cut: jax.Array, advantages: jax.Array, how: str) -> jax.Array:
    """float32 [..., G, N]: 0 on the tokens loss.truncated drops: every token of a cut-off completion (mask), or those
    whose advantage is negative (mask_negative); 1 elsewhere."""
    dropped = cut[..., None] & ((advantages < 0) if how == "mask_negative" else True)
    return (~dropped).astype(jnp.float32)


def reset_reference(state: TextGRPOState, optimizer, every: int) -> TextGRPOState:
    """ProRL's reference reset: after every `every`-th update the reference policy is the current one and the
    optimiser starts afresh (a fresh state of `optimizer`); `state` unchanged otherwise."""
    due = state.update_step % every == 0

    def pick(fresh, kept):
        return jax.tree.map(lambda a, b: jnp.where(due, a, b), fresh, kept)

    return state.replace(ref_params=pick(state.params, state.ref_params),
                         opt_state=pick(optimizer.init(state.params), state.opt_state))


def keeps_reference(kl: bool, confidence: bool, objective: str) -> bool:
    """A run keeps a frozen copy of the starting policy for a KL penalty (`kl`), ACE's confidence shift
    (`confidence`) or an objective that reads it."""
    return kl or confidence or losses.OBJECTIVES[objective].needs_reference


def config_keeps_reference(config: ConfigDict) -> bool:
    """`keeps_reference` from a config (before its settings are read)."""
    return keeps_reference(config.loss.kl_coef > 0, config.loss.confidence_penalty > 0, config.loss.objective)


PER_PROMPT = ("prompts", "expert")  # `_loss`'s batch entries of one row per prompt (the rest per member)
TEXT_ROLES = staleness.Roles(actor=("key", "memory"), learner=("params", "opt_state", "update_step"))


# -------------------------------------------------------------------------------------------------
# From a config


def text_config() -> ConfigDict:
    """`config.base_config()` plus the keys of a token-level run: a transformer policy on a verifiable text task
    (envs/text), trained by supervised fine-tuning on the task's reference answers."""
    config = config_lib.base_config()
    config.update(ConfigDict({"experiment": "text", "algorithm": "text_sft",
                              "total_steps": 200_000,  # samples (prompt and completion pairs) per seed
                              "log": {"every_steps": 6_400}, "eval": {"episodes": 512}}))  # 512 held-out problems
    config.optim.update({"learning_rate": 1e-3, "schedule": "cosine", "warmup_updates": 50, "max_grad_norm": 1.0,
                         "adam_eps": 1e-8})
    return knobs.fill(config, TASK_NAME, TASK_KWARGS, TextSettings, PRETRAINED_NAME, *MODEL_KNOBS)


def text_grpo_config() -> ConfigDict:
    """`text_config()` for RL on tokens from a warm start: group, estimator, loss, sampling and rollout choices."""
    config = text_config()
    config.algorithm = "text_grpo"
    config.update(group_relative_keys())
    config.rollout = rollout.config_keys("tokens")
    config.optim.update({"num_epochs": 1, "num_minibatches": 1})
    return knobs.fill(config, TextGRPOHyperparams, TextGRPOSettings, INIT_FROM)


MODEL_DIR = "model"  # a pretrained model's run directory keeps its architecture and tokenizer here


def model_source(config: ConfigDict, start: str | None) -> str:
    """Where a run's pretrained model's architecture and tokenizer come from: the `model/` directory of the saved
    run it resumes or starts from, else config.model.name; '' for the small transformer."""
    saved = bool(start) and os.path.isdir(os.path.join(start, MODEL_DIR))
    if start and config.model.name and not saved:
        raise ValueError(f"{start} is a run of the small transformer, not of the pretrained model "
                         f"config.{PRETRAINED_NAME.key}={config.model.name!r}")
    return os.path.join(start, MODEL_DIR) if saved else config.model.name


def text_settings(config: ConfigDict, samples_per_prompt: int = 1, value_head: bool = False,
                  start: str | None = None) -> TextSettings:
    """TextSettings with its knob fields read from `config` (`jaxrl.knobs`), the rest derived here; `start`: the
    saved run (directory) it resumes or starts from, whose tokenizer (or pretrained model files) it takes."""
    pretrained = model_source(config, start)
    small = {knob.key.split(".", 1)[1] for knob in MODEL_KNOBS}
    model = dict({k: v for k, v in config.model.to_dict().items() if k in small}, d_ff=config.model.d_ff or None,
                 value_head=value_head)
    tokenizer_path = os.path.join(start, "tokenizer.json") if start and not pretrained else None
    num_updates = config.total_steps // (config.num_prompts * samples_per_prompt)
    return knobs.read(
        TextSettings, config, task=config.task.name, task_kwargs=tuple(sorted(config.task.kwargs.to_dict().items())),
        num_updates=num_updates, optimizer=knobs.read(OptimizerSettings, config, num_updates=num_updates),
        model_kwargs=tuple(sorted(model.items())), tokenizer_path=tokenizer_path, pretrained=pretrained,
        xla_options=config_lib.xla_options(config))


def build_text_sft(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The SFT algorithm, starting from config.model.name's pretrained parameters when it names a model (which the
    run layer reads); with `run_dir`, that saved run's (its tokenizer, and no warm start)."""
    settings = text_settings(config, start=run_dir)
    return text_sft(settings, mesh, starts_from="" if run_dir else settings.pretrained,
                    sft=knobs.read(SFTSettings, config))


def build_text_grpo(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The GRPO algorithm (`parts`: its `TextGRPO`), starting from the parameters of `config.init_from` (which
    the run layer reads); with `run_dir`, that saved run's (its tokenizer.json, and no warm start: its
    checkpoints hold the parameters)."""
    base = text_settings(config, config.group.size, value_head=config.loss.critic_weight > 0,
                         start=run_dir or config.init_from)
    settings = knobs.read(TextGRPOSettings, config, text=base, advantage_options=advantage_options(config),
                          **rollout.settings_of(config, "tokens"))
    policy = TextPolicy(base, mesh)
    grpo = TextGRPO(settings, mesh, policy, learned_reward(config, mesh, policy) if settings.reward_model else None,
                    teacher_policy(config, mesh, policy) if settings.teacher else None)
    algorithm = text_algorithm(settings, mesh, policy, grpo.init, grpo.update, grpo, init_from_params=grpo.init,
                               starts_from="" if run_dir else config.init_from or base.pretrained,
                               state_specs=grpo.state_specs)
    frozen = (("reward_model", settings.reward_model),) * bool(settings.reward_model) + \
        (("teacher", settings.teacher),) * bool(settings.teacher)
    if frozen and not run_dir:
        algorithm = dataclasses.replace(algorithm, frozen_from=frozen)
    return algorithm


def teacher_policy(config: ConfigDict, mesh, policy: TextPolicy) -> TextPolicy:
    """config.loss.teacher as a frozen model that scores the policy's tokens: a text run (its saved config and
    tokenizer) or a pretrained model; it must read the policy's tokens."""
    path = config.loss.teacher
    if is_pretrained(path):
        teacher_config = config_lib.set_values(ConfigDict(config.to_dict()), {"model.name": path, "model.lora_rank": 0})
        teacher = TextPolicy(text_settings(teacher_config, start=None), mesh)
    else:
        saved = registry.saved_config(os.path.join(path, "config.json"))
        teacher = TextPolicy(text_settings(saved, start=path), mesh)
    if teacher.tokenizer.to_str() != policy.tokenizer.to_str():
        raise ValueError(f"config.loss.teacher={path!r} reads another tokenizer than this policy's: a teacher must "
                         "score the same tokens")
    return teacher


@dataclasses.dataclass(frozen=True)
class LearnedReward:
    """A trained reward model as GRPO's reward (`reward.model`): how it scores, and its policy (model, tokenizer)."""

    scorer: reward_models_lib.Scorer
    policy: TextPolicy

    def variables(self, saved_params, key: jax.Array) -> dict:
        """What the scorer reads of the reward model run's parameters {"params", "sampler"}: those given, or a fresh
        model's of their shapes (what a checkpoint restores into)."""
        if saved_params is None:
            fresh = self.policy.init_params(key)["params"]
            saved_params = {"params": fresh, "sampler": fresh}
        return reward_models_lib.scoring(saved_params, self.scorer.objective)


def learned_reward(config: ConfigDict, mesh, policy: TextPolicy) -> LearnedReward:
    """config.reward.model's run (a `text_reward_model` run, read from its config.json and files) as a reward; it
    must read the policy's tokens."""
    path = config.reward.model
    saved = registry.saved_config(os.path.join(path, "config.json"))
    if saved.algorithm != "text_reward_model":
        raise ValueError(f"config.reward.model={path!r} is a {saved.algorithm} run, not a text_reward_model run")
    scorer_policy = TextPolicy(text_settings(saved, saved.group.size, value_head=True, start=path), mesh)
    if scorer_policy.tokenizer.to_str() != policy.tokenizer.to_str():
        raise ValueError(f"config.reward.model={path!r} reads another tokenizer than this policy's: train the reward "
                         "model from the same run (its init_from) as the policy")
    if config.advantage.process_weight > 0 and saved.reward_model.objective != "implicit":
        raise ValueError(f"config.advantage.process_weight={config.advantage.process_weight} takes per-token rewards "
                         f"from an implicit reward model; {path} is a {saved.reward_model.objective} one")
    scorer = reward_models_lib.Scorer.of(scorer_policy.update_model, saved.reward_model.objective,
                                         saved.reward_model.beta, scorer_policy.task, scorer_policy.vocab)
    return LearnedReward(scorer, scorer_policy)


def check_text_config(config: ConfigDict) -> None:
    if config.model.d_model % config.model.num_heads:
        raise ValueError(f"config.model.d_model = {config.model.d_model} is not divisible by "
                         f"config.model.num_heads = {config.model.num_heads}")
    if config.total_steps < config.num_prompts:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update (num_prompts = "
                         f"{config.num_prompts})")


def check_text_grpo_config(config: ConfigDict) -> None:
    check_text_config(config)
    multi_turn_task = config.task.name in text.MULTI_TURN_TASKS
    check_group_estimator(config, multi_turn=multi_turn_task)
    check_objective(config, text=True, multi_turn=multi_turn_task)
    check_return_conditioned(config, multi_turn_task)
    if config.loss.reference_reset and not config_keeps_reference(config):
        raise ValueError(f"config.loss.reference_reset={config.loss.reference_reset} resets a reference policy the run "
                         "does not keep: it needs config.loss.kl_coef > 0, config.loss.confidence_penalty > 0 or "
                         "config.loss.objective=pacs")
    if config.reward.label_free and "reference" in rollout.names(config.rollout.replay):
        raise ValueError(f"config.reward.label_free={config.reward.label_free} reads no label; "
                         "config.rollout.replay=reference injects the labelled answer: choose one")
    if config.reward.label_free and (config.reward.model or multi_turn_task):
        raise ValueError(f"config.reward.label_free={config.reward.label_free} votes among single completions for the "
                         "correct reward: " + ("config.reward.model gives it too" if config.reward.model else
                                               f"task.name={config.task.name} is played over turns"))
    echo = {"loss.confidence_clip": config.loss.confidence_clip > 0,
            "advantage.confidence_entropy_shaping": config.advantage.confidence_entropy_shaping}
    if any(echo.values()) and config.reward.label_free != "majority":
        raise ValueError(" and ".join(f"config.{key}" for key, on in echo.items() if on) + ": ECHO reads each group's "
                         "vote confidence in its pseudo-label, which needs config.reward.label_free=majority")
    if config.advantage.novelty_floor < 1 and not config.advantage.novelty_sharpening > 0:
        raise ValueError(f"config.advantage.novelty_floor={config.advantage.novelty_floor} bounds the factor of "
                         "advantage.novelty_sharpening (EAR): set config.advantage.novelty_sharpening > 0")
    if config.reward.length_penalty and multi_turn_task:
        raise ValueError(f"config.reward.length_penalty charges single completions by their length; "
                         f"task.name={config.task.name} is played over turns")
    if config.reward.progressive and multi_turn_task:
        raise ValueError(f"config.reward.progressive shapes the components of single completions' rewards; "
                         f"task.name={config.task.name} is played over turns")
    if config.loss.layer_policy and (config.loss.correction != "none" or config_keeps_reference(config)
                                     or config.loss.teacher):
        raise ValueError(f"config.loss.layer_policy={config.loss.layer_policy} optimises an internal layer policy early "
                         "on; the off-policy correction, the reference terms and a teacher score the whole model: turn "
                         "them off (loss.correction=none, loss.kl_coef=0, loss.teacher='')")
    if config.loss.keep_schedule and config.loss.sample_keep == 1 and config.loss.token_keep == 1:
        raise ValueError(f"config.loss.keep_schedule={config.loss.keep_schedule} relaxes D3S's down-sampling: set "
                         "config.loss.sample_keep or config.loss.token_keep below 1")
    if config.loss.expert_coef > 0 and (config.reward.label_free or multi_turn_task):
        raise ValueError(f"config.loss.expert_coef={config.loss.expert_coef} learns the labelled reference answer of "
                         "single-answer tasks: " + (f"config.reward.label_free={config.reward.label_free} reads no "
                                                    "label" if config.reward.label_free else
                                                    f"task.name={config.task.name} is played over turns"))
    if config.loss.truncated != "train" and multi_turn_task:
        raise ValueError(f"config.loss.truncated={config.loss.truncated} masks single completions cut off by the length "
                         f"limit; task.name={config.task.name} is played over turns")
    if config.loss.teacher:
        if multi_turn_task:
            raise ValueError(f"config.loss.teacher scores single completions; task.name={config.task.name} is played "
                             "over turns")
        if config.reward.model:
            raise ValueError("config.loss.teacher and config.reward.model: one frozen model per run for now")
        if not (is_pretrained(config.loss.teacher)
                or os.path.exists(os.path.join(config.loss.teacher, "config.json"))):
            raise ValueError(f"config.loss.teacher={config.loss.teacher!r} is neither a text run directory (no "
                             "config.json) nor a pretrained model")
    if config.loss.reference_reset and config.model.lora_rank:
        raise ValueError("config.loss.reference_reset: under LoRA (config.model.lora_rank) the reference is the frozen "
                         "base model, which never moves")
    rollout.check_config(config, "tokens")
    check_merged_groups(config)
    if multi_turn_task:
        chosen = [rollout.get(stage, name) for stage in rollout.STAGES for name in rollout.names(config.rollout[stage])]
        single = [f"rollout.{strategy.stage}={strategy.name}" for strategy in chosen if strategy.single_turn]
        if single:
            raise ValueError(f"task.name={config.task.name} is played over turns; {', '.join(single)} works on "
                             "single-answer completions only")
    if config.loss.correction != "none" and "partial" in rollout.names(config.rollout.control):
        raise ValueError(f"config.loss.correction={config.loss.correction} and config.rollout.control=partial both "
                         "reweight the tokens drawn in earlier updates: choose one")
    staleness.check_config(config)
    if config.loss.ess_step and config.loss.correction == "none":
        raise ValueError("config.loss.ess_step scales the step by the correction weights' effective sample size: "
                         "it needs a config.loss.correction")
    if config.loss.correction_low > config.loss.correction_high:
        raise ValueError(f"config.loss.correction_low={config.loss.correction_low} is above "
                         f"config.loss.correction_high={config.loss.correction_high}")
    if config.advantage.process_weight > 0 and not config.reward.model:
        raise ValueError(f"config.advantage.process_weight={config.advantage.process_weight} weighs the process "
                         "rewards of an implicit reward model: set config.reward.model")
    if config.reward.model:
        if not os.path.exists(os.path.join(config.reward.model, "config.json")):
            raise ValueError(f"config.reward.model={config.reward.model!r} is not a run directory (no config.json)")
        if multi_turn_task:
            raise ValueError(f"task.name={config.task.name} is played over turns; config.reward.model scores single "
                             "completions")
    saved_run = lambda path: any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", MODEL_DIR))  # noqa: E731
    if config.init_from and not saved_run(config.init_from):
        raise ValueError(f"config.init_from={config.init_from!r} is not a text run directory (no tokenizer.json "
                         f"nor {MODEL_DIR}/)")


def check_return_conditioned(config: ConfigDict, multi_turn_task: bool) -> None:
    """advantage.estimator=return_conditioned (RCRL) marks single answers' prompts with two specials of the small
    model's vocabulary (`return_tokens`) and learns by likelihood alone: the terms that reshape a policy gradient,
    score against other prompts' log-probabilities or read another model are refused."""
    if not advantages.ESTIMATORS[config.advantage.estimator].conditions:
        return
    where = f"config.advantage.estimator={config.advantage.estimator}"
    if config.model.name or multi_turn_task:
        raise ValueError(f"{where} marks the BOS of the small model's prompts: " + (
            f"config.model.name={config.model.name!r}'s chat prompts have no spare mark yet" if config.model.name
            else f"task.name={config.task.name} is played over turns"))
    on = [key for key, active in (
        ("loss.kl_coef", config.loss.kl_coef > 0), ("loss.confidence_penalty", config.loss.confidence_penalty > 0),
        ("loss.objective", config.loss.objective != "clip"), ("loss.teacher", bool(config.loss.teacher)),
        ("loss.expert_coef", config.loss.expert_coef > 0), ("loss.critic_weight", config.loss.critic_weight > 0),
        ("loss.layer_policy", config.loss.layer_policy > 0), ("loss.correction", config.loss.correction != "none"),
        ("loss.token_keep", config.loss.token_keep < 1), ("loss.sample_keep", config.loss.sample_keep < 1),
        ("loss.min_distinctiveness", config.loss.min_distinctiveness > 0),
        ("advantage.entropy_shaping", config.advantage.entropy_shaping > 0),
        ("advantage.novelty_sharpening", config.advantage.novelty_sharpening > 0),
        ("advantage.soft", config.advantage.soft > 0),
        ("advantage.process_weight", config.advantage.process_weight > 0)) if active]
    if on:
        raise ValueError(f"{where} learns by the likelihood of every completion alone: turn off {', '.join(on)}")


def check_merged_groups(config: ConfigDict) -> None:
    """advantage.merge_problem_groups pools groups by their pool id, with an estimator whose statistics are its group's
    alone (`advantages.Estimator.merges`): batch-level ones would count a pooled group once per group of its problem."""
    if not config.advantage.merge_problem_groups:
        return
    where = "config.advantage.merge_problem_groups pools the groups of one problem"
    mergeable = sorted(name for name, estimator in advantages.ESTIMATORS.items() if estimator.merges)
    if config.advantage.estimator not in mergeable:
        raise ValueError(f"{where}: config.advantage.estimator={config.advantage.estimator!r} reads more than its "
                         f"group's rewards; those that merge: {', '.join(mergeable)}")
    if config.advantage.scale == "batch" or config.advantage.renormalize:
        raise ValueError(f"{where}: config.advantage.scale=batch and config.advantage.renormalize take batch "
                         "statistics, which would count a pooled group once per group of its problem")
    if not config.rollout.pool_size:
        raise ValueError(f"{where} by their pool id: set config.rollout.pool_size > 0 (fresh problems have none)")
    if rollout.get("generate", config.rollout.generate).advantages:
        raise ValueError(f"{where}: config.rollout.generate={config.rollout.generate} scores its tokens itself")


def text_sft_config() -> ConfigDict:
    """`text_config()` and the keys of how SFT learns (`SFTSettings`)."""
    return knobs.fill(text_config(), SFTSettings)


register("text_sft", Recipe(build_text_sft, TextHyperparams, check=check_text_config, defaults=text_sft_config,
                            rebuild=build_text_sft))
register("text_grpo", Recipe(build_text_grpo, TextGRPOHyperparams, check=check_text_grpo_config,
                             defaults=text_grpo_config, rebuild=build_text_grpo,
                             static_of=lambda config: (config.loss.critic_weight > 0, config_keeps_reference(config),
                                                       config.loss.token_keep < 1, config.loss.expert_coef > 0)))
