"""Token GRPO's keys, traced hyperparameters, static settings and state, and the checks of its config (run before
anything is built or compiled)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import struct
from ml_collections import ConfigDict

from envs import text
from jaxrl import advantages, corrections, knobs, losses, rollout
from jaxrl.algos.group import CRITIC_WEIGHT, GROUP_SIZE, check_group_estimator, check_objective, group_relative_keys
from jaxrl.algos.text.policy import INIT_FROM, TextSettings, check_init_from, check_text_config, text_config
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import staleness
from jaxrl.knobs import Knob, knob
from jaxrl.models.lm import is_pretrained


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
    cross_rollout: bool = advantages.CROSS_ROLLOUT.field()  # POISE's baseline from another member's states
    value_entropy: bool = losses.VALUE_ENTROPY.field()  # POISE's entropy features of the value head
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


def keeps_reference(kl: bool, confidence: bool, objective: str) -> bool:
    """A run keeps a frozen copy of the starting policy for a KL penalty (`kl`), ACE's confidence shift
    (`confidence`) or an objective that reads it."""
    return kl or confidence or losses.OBJECTIVES[objective].needs_reference


def config_keeps_reference(config: ConfigDict) -> bool:
    """`keeps_reference` from a config (before its settings are read)."""
    return keeps_reference(config.loss.kl_coef > 0, config.loss.confidence_penalty > 0, config.loss.objective)


def text_grpo_config() -> ConfigDict:
    """`text_config()` for RL on tokens from a warm start: group, estimator, loss, sampling and rollout choices."""
    config = text_config()
    config.algorithm = "text_grpo"
    config.update(group_relative_keys())
    config.rollout = rollout.config_keys("tokens")
    config.optim.update({"num_epochs": 1, "num_minibatches": 1})
    return knobs.fill(config, TextGRPOHyperparams, TextGRPOSettings, INIT_FROM)


def check_text_grpo_config(config: ConfigDict) -> None:
    check_text_config(config)
    multi_turn_task = config.task.name in text.MULTI_TURN_TASKS
    check_group_estimator(config, multi_turn=multi_turn_task)
    check_objective(config, text=True, multi_turn=multi_turn_task)
    check_return_conditioned(config, multi_turn_task)
    check_poise(config, multi_turn_task)
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
    check_init_from(config)


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


def check_poise(config: ConfigDict, multi_turn_task: bool) -> None:
    """POISE's keys (advantage.cross_rollout, loss.value_entropy) shape the value head's baseline: they need one
    (loss.critic_weight > 0); the cross-rollout baseline needs another member per group and single completions."""
    on = [key for key, active in (("advantage.cross_rollout", config.advantage.cross_rollout),
                                  ("loss.value_entropy", config.loss.value_entropy)) if active]
    if on and not config.loss.critic_weight > 0:
        raise ValueError(f"config.{' and config.'.join(on)}: POISE's value head needs config.loss.critic_weight > 0")
    if config.advantage.cross_rollout and (config.group.size < 2 or multi_turn_task):
        raise ValueError("config.advantage.cross_rollout predicts each member's baseline from another member's "
                         "completion: " + (f"task.name={config.task.name} is played over turns" if multi_turn_task
                                           else f"config.group.size={config.group.size} must be >= 2"))


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
