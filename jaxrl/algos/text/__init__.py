"""Token-level training on verifiable text tasks (envs/text): supervised fine-tuning (`text_sft`) and GRPO on tokens
(`text_grpo`), each an `engine.Algorithm` made by its registered builder.

Both act through one `TextPolicy` (`policy`): the task, its tokenizer and vocabulary, the model, evaluation on
held-out problems, the actor and the run directory's files (`tokenizer.json`: a run reloads from its directory
alone). Evaluation is greedy decoding (temperature 0) on a fixed held-out set: `eval_accuracy` (pass@1) and
`eval_well_formed`, and `eval_pass@k` from k samples per problem at temperature 1.

    policy          the shared policy, its settings and keys, the actor
    sft             supervised fine-tuning on the reference answers
    grpo_settings   GRPO's keys, hyperparameters, settings, state and config checks
    frozen          the frozen models a GRPO run reads: a reward model, a teacher
    grpo            GRPO's update (`TextGRPO`) and its builder

Shapes: S seeds, B prompts per update (b on one device), G completions per prompt, P prompt and N completion tokens.
"""

from jaxrl.algos.text.grpo import TextGRPO, build_text_grpo
from jaxrl.algos.text.grpo_settings import (TextGRPOHyperparams, TextGRPOSettings, TextGRPOState,
                                            config_keeps_reference, text_grpo_config)
from jaxrl.algos.text.policy import (INIT_FROM, TextActor, TextHyperparams, TextPolicy, TextSettings, TextState,
                                     text_config, text_settings)
from jaxrl.algos.text.sft import SFTSettings, build_text_sft, text_sft_config

__all__ = ["INIT_FROM", "SFTSettings", "TextActor", "TextGRPO", "TextGRPOHyperparams", "TextGRPOSettings",
           "TextGRPOState", "TextHyperparams", "TextPolicy", "TextSettings", "TextState", "build_text_grpo",
           "build_text_sft", "config_keeps_reference", "text_config", "text_grpo_config", "text_settings",
           "text_sft_config"]
