"""The frozen models a token GRPO run reads beside its policy: a trained reward model as its reward (`reward.model`)
and a teacher that scores its tokens (`loss.teacher`), each loaded from its own run directory or a pretrained model."""

from __future__ import annotations

import dataclasses
import os

import jax
from ml_collections import ConfigDict

from jaxrl import config as config_lib, reward_models as reward_models_lib
from jaxrl.algos import registry
from jaxrl.algos.text.policy import TextPolicy, scorer_settings, text_settings
from jaxrl.models.lm import is_pretrained


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


def learned_reward(config: ConfigDict, mesh, policy: TextPolicy) -> LearnedReward:
    """config.reward.model's run (a `text_reward_model` run, read from its config.json and files) as a reward; it
    must read the policy's tokens."""
    path = config.reward.model
    saved = registry.saved_config(os.path.join(path, "config.json"))
    if saved.algorithm != "text_reward_model":
        raise ValueError(f"config.reward.model={path!r} is a {saved.algorithm} run, not a text_reward_model run")
    scorer_policy = TextPolicy(scorer_settings(saved, start=path), mesh)
    if scorer_policy.tokenizer.to_str() != policy.tokenizer.to_str():
        raise ValueError(f"config.reward.model={path!r} reads another tokenizer than this policy's: train the reward "
                         "model from the same run (its init_from) as the policy")
    if config.advantage.process_weight > 0 and saved.reward_model.objective != "implicit":
        raise ValueError(f"config.advantage.process_weight={config.advantage.process_weight} takes per-token rewards "
                         f"from an implicit reward model; {path} is a {saved.reward_model.objective} one")
    # (saved_config gives keys declared since the run was saved their defaults)
    scorer = reward_models_lib.Scorer.of(scorer_policy.update_model, scorer_policy.task, scorer_policy.vocab,
                                         saved.reward_model)
    return LearnedReward(scorer, scorer_policy)
