"""GRPO and its variants on tokens (`text_grpo`): `TextGRPO`, the update of one seed on this device's share of the
prompts, and `build_text_grpo`, its `engine.Algorithm` from a config."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from jaxrl import (advantages, corrections, engine, knobs, losses, multi_turn, reward_models as reward_models_lib,
                   rollout, sampling)
from jaxrl.advantages import cross_rollout_advantages, process_returns
from jaxrl.algos.group import advantage_options
from jaxrl.algos.registry import Recipe, register
from jaxrl.algos.text.frozen import LearnedReward, learned_reward, teacher_policy
from jaxrl.algos.text.grpo_settings import (TextGRPOHyperparams, TextGRPOLearnedRewardState, TextGRPOSettings,
                                            TextGRPOState, TextGRPOTeacherState, check_text_grpo_config,
                                            config_keeps_reference, text_grpo_config)
from jaxrl.algos.text.policy import TextPolicy, text_algorithm, text_settings
from jaxrl.engine import global_mean, optimise, staleness, standardise
from jaxrl.mesh import DATA_AXIS, RUN_AXIS
from jaxrl.models import lora
from jaxrl.rewards import (kept_tokens, length_penalised, majority_votes, progressive_rewards, return_prompts,
                           sparse_rewards, truncated, vote_confidence)


PER_PROMPT = ("prompts", "expert")  # `_loss`'s batch entries of one row per prompt (the rest per member)
TEXT_ROLES = staleness.Roles(actor=("key", "memory"), learner=("params", "opt_state", "update_step"))


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
    with a learned baseline, no group needed for the baseline). With advantage.cross_rollout (POISE) the critic term is
    the reward less the value head's mean over another member's completion (`advantages.cross_rollout_baseline`).
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
        if reads == "hinted":  # ADHint: which members began with the hint
            context["hinted"] = groups.member_hint_len > 0
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
        trained = groups.weight
        if groups.hint_members is not None:  # ADHint: hint tokens trained by consistency, where the member's A > 0
            hint = groups.mask * (jnp.arange(N) < groups.member_hint_len[..., None])
            trained = losses.hint_modulated(trained, advantages, groups.log_probs, hint)
        units = {"prompts": groups.prompts, "tokens": groups.tokens, "mask": groups.mask,
                 "log_probs": groups.log_probs, "weight": weight * trained}
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
            if s.cross_rollout:  # POISE: each member's baseline from another member's states, not standardised
                critic = cross_rollout_advantages(returns[..., 0], groups.values, groups.mask)
                # (reward - baseline)^2 per member: its tokens all carry it (column 0 may be masked)
                metrics["cross_rollout_error"] = global_mean(losses.completion_mean(jnp.square(critic), groups.mask))
            else:
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


def reset_reference(state: TextGRPOState, optimizer, every: int) -> TextGRPOState:
    """ProRL's reference reset: after every `every`-th update the reference policy is the current one and the
    optimiser starts afresh (a fresh state of `optimizer`); `state` unchanged otherwise."""
    due = state.update_step % every == 0

    def pick(fresh, kept):
        return jax.tree.map(lambda a, b: jnp.where(due, a, b), fresh, kept)

    return state.replace(ref_params=pick(state.params, state.ref_params),
                         opt_state=pick(optimizer.init(state.params), state.opt_state))


def build_text_grpo(config: ConfigDict, mesh, run_dir: str | None = None) -> engine.Algorithm:
    """The GRPO algorithm (`parts`: its `TextGRPO`), starting from the parameters of `config.init_from` (which
    the run layer reads); with `run_dir`, that saved run's (its tokenizer.json, and no warm start: its
    checkpoints hold the parameters)."""
    base = text_settings(config, config.group.size, value_head=config.loss.critic_weight > 0,
                         start=run_dir or config.init_from, value_entropy=config.loss.value_entropy)
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


register("text_grpo", Recipe(build_text_grpo, TextGRPOHyperparams, check=check_text_grpo_config,
                             defaults=text_grpo_config, rebuild=build_text_grpo,
                             static_of=lambda config: (config.loss.critic_weight > 0, config_keeps_reference(config),
                                                       config.loss.token_keep < 1, config.loss.expert_coef > 0)))
