"""What env and text GRPO share: the group size, the advantage estimator with its options and the policy-loss
parts, declared once (`jaxrl.knobs`: `jaxrl.algos.validate` checks them for both)."""

from __future__ import annotations

from ml_collections import ConfigDict

from envs.text import MULTI_TURN_TASKS
from jaxrl import advantages, knobs, losses, rollout
from jaxrl.knobs import Knob

ADVANTAGE_SCALES = ("group", "batch", "none")

GROUP_SIZE = Knob("group.size", 8, "G: episodes (or completions) per start state (or prompt); 1 only with a baseline "
                  "that needs no group (advantage.estimator=tracked, or loss.critic_weight=1)", minimum=1)
ADVANTAGE_OPTIONS = (
    Knob("advantage.scale", "", "how advantages are scaled: by the group's std, the batch's, or not; "
         "'': the estimator's default", choices=("", *ADVANTAGE_SCALES)),
    Knob("advantage.eps", 1e-6, "added to the std that advantages are divided by", minimum=0.0),
    Knob("advantage.clip", 0.0, "advantages clipped to [-clip, clip]; 0: off", minimum=0.0),
    Knob("advantage.max_reward", 1.0, "the best reward: calibrated's virtual sample has it, expert_iteration learns "
         "from the samples that reach it"),
    Knob("advantage.renormalize", False, "gdpo: renormalise the combined advantages over the batch"),
    Knob("advantage.stratum_weight", 0.5, "stratified: the within-stratum advantage's share of the blend (the group's "
         "has the rest)", minimum=0.0, maximum=1.0),
    Knob("advantage.prior_weight", 4.0, "fused: the value prior counts as this many samples where its test accepts it",
         minimum=0.0),
    Knob("advantage.prior_z", 1.96, "fused: the prior is accepted while the group mean lies within this many standard "
         "errors of it", minimum=0.0),
    Knob("advantage.rare_weight_max", 4.0, "weighted_grpo: the most a group's rare outcome (a success where most "
         "fail, a failure where most succeed) is weighted; its weight is the common outcome's count over its own",
         minimum=1.0),
)
CRITIC_WEIGHT = Knob("loss.critic_weight", 0.0, "> 0 mixes in a learned value baseline (1: critic-based, 0: "
                     "critic-free)", traced=True, minimum=0.0, maximum=1.0)
GROUP_KNOBS = (advantages.ESTIMATOR, *ADVANTAGE_OPTIONS, GROUP_SIZE, CRITIC_WEIGHT, losses.CLIP_LOW, losses.CLIP_HIGH,
               losses.DUAL_CLIP, losses.RATIO, losses.AGGREGATE, losses.ENT_COEF, losses.OBJECTIVE)


def group_relative_keys() -> ConfigDict:
    """The keys env and text GRPO share: estimator, its options, group size and the policy-loss parts (no
    entropy bonus by default)."""
    config = knobs.defaults(*GROUP_KNOBS)
    config.loss.ent_coef = 0.0
    return config


def advantage_options(config: ConfigDict) -> tuple[tuple[str, object], ...]:
    """config.advantage's options as keyword options of the estimator ("" and 0 mean the default / off)."""
    o = config.advantage
    return (("scale", o.scale or None), ("eps", o.eps), ("clip", o.clip or None), ("max_reward", o.max_reward),
            ("renormalize", o.renormalize), ("stratum_weight", o.stratum_weight), ("prior_weight", o.prior_weight),
            ("prior_z", o.prior_z), ("rare_weight_max", o.rare_weight_max))


def check_group_estimator(config: ConfigDict, multi_turn: bool = False, text: bool = True) -> None:
    """config.advantage.estimator must be a group estimator (not one that needs a critic); a per-turn one only for
    `multi_turn` episodes; one that reads a tracked value or a value prior only on `text`."""
    advantages.check_estimator(config.advantage.estimator, needs_critic=False, family="the GRPO family")
    estimator = advantages.ESTIMATORS.get(config.advantage.estimator)
    if estimator is not None and estimator.reads in ("baseline", "prior") and not text:
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} reads a per-problem value that "
                         "text GRPO keeps (a tracker or a value head at the prompt); environment GRPO has none")
    if estimator is not None and estimator.conditions and not text:
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} rewrites text prompts with each "
                         "sample's return (RCRL): it needs text_grpo")
    if estimator is not None and estimator.reads == "hinted" and not (
            text and "hints" in rollout.names(config.rollout.replay)
            and config.rollout.options.get("hints", {}).get("adaptive", False)):
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} (ADHint) compares hinted and "
                         "unhinted members: it needs text_grpo with config.rollout.replay=hints and "
                         "rollout.options.hints.adaptive=True")
    if estimator is not None and estimator.reads == "strata" and not multi_turn:
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} compares each episode with those "
                         "of its group that share its structure (as many tool calls): it needs a multi-turn text task "
                         f"({', '.join(sorted(MULTI_TURN_TASKS))})")
    if estimator is not None and estimator.reads in ("baseline", "prior") and config.advantage.scale == "group":
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} centres samples on a value, not "
                         "on their group's mean: config.advantage.scale=group would divide a tied group's nonzero "
                         "advantages by its zero std; use batch or none")
    if estimator is not None and estimator.reads == "prior" and not config.loss.critic_weight:
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} fuses a value head's prior with "
                         "the group mean: it needs config.loss.critic_weight > 0 (the value head learns; e.g. 0.1)")
    if estimator is not None and estimator.reads == "baseline" and not _gives_baselines(config):
        valued = sorted(name for name, s in rollout.STRATEGIES["tokens"]["replay"].items() if s.baseline)
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} compares each sample with its "
                         f"problem's tracked value: it needs a replay strategy that keeps one ({', '.join(valued)}: "
                         "e.g. config.rollout.replay=tracker, with a pool)")
    group_free = (estimator is not None and estimator.reads == "baseline") or config.loss.critic_weight == 1
    if config.group.size == 1 and not group_free:
        raise ValueError(f"config.group.size=1 leaves no group to compare a sample with: config.advantage.estimator="
                         f"{config.advantage.estimator!r} needs G >= 2; group-free: advantage.estimator=tracked with "
                         "rollout.replay=tracker (SPO), or a learned baseline alone (loss.critic_weight=1)")
    if config.group.size == 1 and config.advantage.scale == "group":
        raise ValueError("config.group.size=1: config.advantage.scale=group divides by the std of one sample; use "
                         "batch or none")
    if estimator is not None and estimator.per_turn and not multi_turn:
        raise ValueError(f"config.advantage.estimator={config.advantage.estimator!r} scores the turns of multi-turn "
                         f"episodes: it needs a multi-turn text task ({', '.join(sorted(MULTI_TURN_TASKS))}); "
                         f"for whole samples: {', '.join(advantages.names(False))}")


def _gives_baselines(config: ConfigDict) -> bool:
    """Some replay strategy of the config gives each candidate its problem's value (`Strategy.baseline`)."""
    registry = rollout.STRATEGIES["tokens"]["replay"]
    return any(registry[name].baseline for name in rollout.names(config.rollout.get("replay", "")) if name in registry)


def check_objective(config: ConfigDict, text: bool, multi_turn: bool = False) -> None:
    """config.loss.objective must be one this family computes: those that learn from the verifier's label or read a
    reference policy need text GRPO's single-answer completions; dual_clip belongs to PPO's clipped surrogate."""
    name = config.loss.objective
    objective = losses.OBJECTIVES.get(name)
    if objective is None:
        return  # (the knob's own check names the choices)
    if (objective.needs_outcome or objective.needs_reference) and (not text or multi_turn):
        where = "a text task's single-answer completions" if text else "text GRPO (a verifier's label per completion)"
        raise ValueError(f"config.loss.objective={name} learns from the verifier's correct label of each completion: "
                         f"it needs {where}")
    if objective.needs_outcome and config.group.size < 2:
        raise ValueError(f"config.loss.objective={name} reads each group's pass rate: config.group.size must be >= 2")
    if config.loss.dual_clip and name != "clip":
        raise ValueError(f"config.loss.dual_clip caps PPO's clipped surrogate; config.loss.objective={name} has none")
    if config.loss.ratio == "turn" and not multi_turn:
        raise ValueError("config.loss.ratio=turn takes the geometric mean of each turn's token ratios: it needs a "
                         f"multi-turn text task ({', '.join(sorted(MULTI_TURN_TASKS))})")
    if name == "pacs" and config.loss.ratio != "token":
        raise ValueError("config.loss.objective=pacs scores whole completions itself (log pi / pi_ref summed): "
                         "config.loss.ratio must stay token")
