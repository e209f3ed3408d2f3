"""What env and text GRPO share: the group size, the advantage estimator with its options and the policy-loss
parts, read from the same keys (`config.group_relative_keys`) and checked the same way."""

from __future__ import annotations

from ml_collections import ConfigDict

from jaxrl import advantages, config as config_lib, losses

ADVANTAGE_SCALES = ("group", "batch", "none")


def group_relative_keys() -> ConfigDict:
    """The keys env and text GRPO share: estimator, its options, group size and the policy-loss parts."""
    return ConfigDict({
        "advantage": "grpo",  # an estimator of jaxrl.advantages: grpo, dr_grpo, rloo, median, ...
        "advantage_options": {
            "scale": "",  # "group", "batch" or "none"; "": the estimator's default
            "eps": 1e-6,
            "clip": 0.0,  # clip advantages to [-clip, clip]; 0: off
            "max_reward": 1.0,  # calibrated: the virtual best sample's reward
            "renormalize": False,  # gdpo: renormalise the combined advantages over the batch
        },
        "group": {"size": 8},
        "critic_weight": 0.0,  # > 0 mixes in a learned value baseline (1: critic-based, 0: critic-free)
        "loss": {
            "clip_low": 0.2,  # the policy ratio is clipped to [1 - clip_low, 1 + clip_high]
            "clip_high": 0.2,  # > clip_low: DAPO's clip-higher
            "dual_clip": 0.0,  # > 1: cap the loss of negative advantages at -dual_clip * A; 0: off
            "ratio": "token",  # "token" or "sequence" (GSPO)
            "aggregate": "token",  # "token", "sequence" or "constant" (Dr. GRPO)
            "ent_coef": 0.0,
        },
    })


def advantage_options(config: ConfigDict) -> tuple[tuple[str, object], ...]:
    """config.advantage_options as keyword options of the estimator ("" and 0 mean the default / off)."""
    o = config.advantage_options
    return (("scale", o.scale or None), ("eps", o.eps), ("clip", o.clip or None), ("max_reward", o.max_reward),
            ("renormalize", o.renormalize))


def group_settings(config: ConfigDict) -> dict:
    """The estimator and loss-part choices of a settings object."""
    loss = config.loss
    return dict(group_size=config.group.size, advantage=config.advantage,
                advantage_options=advantage_options(config), ratio=loss.ratio, aggregate=loss.aggregate,
                dual_clip=loss.dual_clip or None)


def check_group_config(config: ConfigDict) -> None:
    one_of = config_lib.one_of
    one_of(config.advantage, sorted(advantages.ESTIMATORS), "advantage")
    if config.advantage_options.scale:
        one_of(config.advantage_options.scale, ADVANTAGE_SCALES, "advantage_options.scale")
    one_of(config.loss.ratio, losses.RATIO_LEVELS, "loss.ratio")
    one_of(config.loss.aggregate, tuple(losses.AGGREGATIONS), "loss.aggregate")
    config_lib.positive(config, "group.size")
    if config.group.size < 2:
        raise ValueError(f"config.group.size must be >= 2, got {config.group.size}")
    for key in ("clip_low", "clip_high"):
        if not config.loss[key] > 0:
            raise ValueError(f"config.loss.{key} must be > 0, got {config.loss[key]!r}")
    if config.loss.dual_clip and not config.loss.dual_clip > 1:
        raise ValueError(f"config.loss.dual_clip must be > 1 (or 0: off), got {config.loss.dual_clip!r}")
    config_lib.unit_interval(config.critic_weight, "critic_weight")


# Traced hyperparameters both read from the same keys.
GROUP_LOSS_KEYS = {"clip_low": "loss.clip_low", "clip_high": "loss.clip_high", "ent_coef": "loss.ent_coef",
                   "critic_weight": "critic_weight"}
