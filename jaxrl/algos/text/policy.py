"""What the text algorithms share: the task, its tokenizer and vocabulary, the model (the small transformer or a
pretrained `jaxrl.models` decoder), held-out evaluation, the actor, the run directory's files, and the keys and settings
that say which (`TextSettings`, read from a config by `text_settings`)."""

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
from jaxrl import config as config_lib, engine, files, knobs, mesh as mesh_lib, multi_turn, sampling
from jaxrl.engine import OptimizerSettings
from jaxrl.jitting import jit_method
from jaxrl.knobs import Knob, knob
from jaxrl.mesh import DATA_AXIS, MODEL_AXIS, RUN_AXIS
from jaxrl.models import hf as hf_files, lora, sharding as model_sharding
from jaxrl.models.config import LORA_TARGETS
from jaxrl.models.decoder import Decoder, is_adapter
from jaxrl.models.lm import read_spec
from jaxrl.transformer import TransformerConfig, TransformerLM
from jaxrl.rewards import best_by_head, head_scores


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
            value_entropy=bool(model_kwargs.get("value_entropy")),
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

    def encode_pairs(self, prompts: list[str], completions: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prompt strings and one completion string each -> (prompts int32 [B, P] as `encode_prompts` lays them out,
        completions int32 [B, N]: each one's tokens then EOS, cut to the task's answer_length N and padded, and the
        float32 [B, N] mask of their real slots)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts and {len(completions)} completions: give one completion each")
        vocab, width = self.vocab, self.task.answer_length
        ids = [self.tokenizer.encode(text).ids[:width - 1] + [vocab.eos_id] for text in completions]
        tokens = np.full((len(ids), width), vocab.pad_id, np.int32)
        for i, row in enumerate(ids):
            tokens[i, :len(row)] = row
        mask = (np.arange(width) < np.asarray([len(r) for r in ids])[:, None]).astype(np.float32)
        return self.encode_prompts(prompts), tokens, mask

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

    # The actors' programs, compiled once per policy (not per actor: an evaluation that makes an actor per seed
    # compiles each once). A temperature of 0 is greedy; the key is then unused.
    @jit_method(static_argnums=(4,))
    def answers(self, params, prompts: jax.Array, key: jax.Array, temperature: float) -> jax.Array:
        """One completion [B, N] per prompt [B, P] of a single-answer task."""
        return sampling.sample(self.model, params, prompts, key, temperature=temperature,
                               max_new_tokens=self.task.answer_length, eos_id=self.vocab.eos_id,
                               pad_id=self.vocab.pad_id).tokens

    @jit_method
    def log_likelihoods(self, params, prompts: jax.Array, completions: jax.Array, mask: jax.Array) -> jax.Array:
        """float32 [B]: log pi(completion | prompt) of completions [B, N] (mask [B, N]) to prompts [B, P], EOS
        included: the sum of their tokens' log-probabilities at temperature 1."""
        log_probs, _, _ = sampling.score(self.model, params, prompts, completions, mask, self.vocab.pad_id)
        return jnp.sum(log_probs, axis=-1)

    @jit_method
    def played(self, params, problems, key: jax.Array, temperature: jax.Array) -> jax.Array:
        """One episode [B, N] (slot layout) per problem [B] of a multi-turn task."""
        return multi_turn.play(self.model, params, self.task, self.vocab, problems,
                               self.task.prompts(problems, self.vocab), jax.random.split(key, problems.target.shape[0]),
                               group_size=1, temperature=temperature).tokens[:, 0]

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
            judge = [f"params/{name}" for name in fresh["params"] if name.startswith("judge_")]  # (a reward model's)
            params = _overlay(fresh, params, fresh_ok=("params/value", *adapters, *judge))
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

    def __call__(self, prompts: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if self.policy.multi_turn:
            raise ValueError(f"{self.task.name} is played over turns against its environment: "
                             "actor.play(problems) plays its episodes")
        return self.policy.answers(self.params, prompts, *_key_and_temperature(key))

    def play(self, problems, key: jax.Array | None = None) -> jax.Array:
        """A multi-turn task's episodes [B, N] (slot layout) of `problems` [B]: greedy without `key`, else sampled at
        temperature 1."""
        if not self.policy.multi_turn:
            raise ValueError(f"{self.task.name} is answered in one turn: actor(prompts) answers it")
        return self.policy.played(self.params, problems, *_key_and_temperature(key))

    def complete(self, texts: list[str], key: jax.Array | None = None) -> list[str]:
        """The answers to prompt strings (laid out as the task's prompts: BOS, text, padded on the left; for a
        pretrained model each string is a question, posed through its chat template)."""
        return self.policy.decode(self(jnp.asarray(self.policy.encode_prompts(texts)), key))

    def log_likelihood(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """float32 [B]: the model's log-probability of each completion string after its prompt string, its EOS
        included (a judge with no training: best-of-n by likelihood picks the completion the model finds likeliest)."""
        if self.policy.multi_turn:
            raise ValueError(f"{self.task.name} is played over turns: its episodes are not one completion each")
        encoded = map(jnp.asarray, self.policy.encode_pairs(prompts, completions))
        return np.asarray(self.policy.log_likelihoods(self.params, *encoded))


def _key_and_temperature(key: jax.Array | None) -> tuple[jax.Array, float]:
    """An actor's decoding: greedy without a key (any key then: it is unused), else sampled at temperature 1."""
    return (jax.random.PRNGKey(0), 0.0) if key is None else (key, 1.0)


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
                  start: str | None = None, value_entropy: bool = False, judge_layers: int = 0) -> TextSettings:
    """TextSettings with its knob fields read from `config` (`jaxrl.knobs`), the rest derived here; `start`: the
    saved run (directory) it resumes or starts from, whose tokenizer (or pretrained model files) it takes."""
    pretrained = model_source(config, start)
    small = {knob.key.split(".", 1)[1] for knob in MODEL_KNOBS}
    model = dict({k: v for k, v in config.model.to_dict().items() if k in small}, d_ff=config.model.d_ff or None,
                 value_head=value_head, **{"value_entropy": True} if value_entropy else {},  # (POISE)
                 **{"judge_layers": judge_layers} if judge_layers else {})  # (a reward model's judge)
    tokenizer_path = os.path.join(start, "tokenizer.json") if start and not pretrained else None
    num_updates = config.total_steps // (config.num_prompts * samples_per_prompt)
    return knobs.read(
        TextSettings, config, task=config.task.name, task_kwargs=tuple(sorted(config.task.kwargs.to_dict().items())),
        num_updates=num_updates, optimizer=knobs.read(OptimizerSettings, config, num_updates=num_updates),
        model_kwargs=tuple(sorted(model.items())), tokenizer_path=tokenizer_path, pretrained=pretrained,
        xla_options=config_lib.xla_options(config))


def scorer_settings(config: ConfigDict, start: str | None) -> TextSettings:
    """A reward model run's model settings from its config (in training, or saved: as GRPO reads it for
    `reward.model`): the policy's, with a value head and the run's judge layers; `start` as `text_settings`'s."""
    return text_settings(config, config.group.size, value_head=True, start=start,
                         judge_layers=config.reward_model.judge_layers)


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


def check_init_from(config: ConfigDict) -> None:
    """config.init_from, when set, is a saved text run (or an exported policy): it has a tokenizer or a model."""
    saved = any(os.path.exists(os.path.join(config.init_from, f)) for f in ("tokenizer.json", MODEL_DIR))
    if config.init_from and not saved:
        raise ValueError(f"config.init_from={config.init_from!r} is not a text run directory (no tokenizer.json "
                         f"nor {MODEL_DIR}/)")


def check_text_config(config: ConfigDict) -> None:
    if config.model.d_model % config.model.num_heads:
        raise ValueError(f"config.model.d_model = {config.model.d_model} is not divisible by "
                         f"config.model.num_heads = {config.model.num_heads}")
    if config.total_steps < config.num_prompts:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update (num_prompts = "
                         f"{config.num_prompts})")
