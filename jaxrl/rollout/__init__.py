"""Rollout strategies of group RL, one registry per stage: Generate, Filter, Control, Replay.

In one update of token-level GRPO (`jaxrl.algos.text.TextGRPO`) the stages run in this order, inside the
compiled update (no Python loop per sample; `Pipeline.run`):

    tune      strategies set this update's sampling hyperparameters (an entropy- or diversity-targeted
              temperature)
    plan      C = B x oversample candidate prompts (ids in the training pool, problems, hint lengths)
    before    strategies change the plan: first one that redraws the problems (a curriculum), then in stage
              order (a predictor's pass rates, which candidates get groups, hints to force)
    generate  the Generate strategy turns the plan into `Groups` (G completions per candidate, rewards)
    observe   strategies with memory see every candidate (what to replay, which prompts are stuck)
    after     Filter, then Control (keeps B of the C groups), then Replay (injects past samples)
    advantages and the loss, on the B groups left

Control strategies may also shape decoding through the plan: `Plan.resume` continues groups from earlier
updates, `Plan.prune_below` stops members predicted to fail, and a strategy registered with `stops_early` ends
decoding once every slot of `oversample` candidates holds a finished group (`Groups.finished`).

A strategy is a named `Strategy` of one stage with any of these hooks (all optional but one), and its own config
check, `check(config, chosen {stage: names})`, run with the registry's (`check_config(config, domain)`) before
anything compiles:

    init(algo, key) -> memory                                  one seed's memory, kept in the training state
    prime(algo, memory, params, key) -> memory                 once at init, from the starting policy (the reference)
    tune(algo, memory, hp) -> hp                               sampling hyperparameters (e.g. the temperature)
    before(algo, memory, plan, key) -> (plan, metrics)
    generate(algo, params, hp, plan, key) -> Groups            Generate strategies only
    replaces(algo, memory, params, plan, generate, key)        in place of generate: generates part of the plan
        -> (Groups, metrics)                                   (generate(plan, key)) and supplies the rest itself
    observe(algo, memory, groups, params) -> (memory, metrics) groups: every candidate on this device
    after(algo, memory, groups, params, key) -> (groups, metrics)
    advantages(algo, groups, rewards) -> (advantages, weights)   a Generate strategy whose samples have a
                                                               structure (a tree) may score tokens itself

Environments (`jaxrl.algos.grpo.GRPO`, domain "env") have Generate strategies only, with one hook:

    members(algo, key) -> None (nothing shared, every step trained), or
                          (shared [T, n, A] bool, trained [T, n, A] bool, metrics)

where `shared` says which (step, env, agent) draws its group leader's action noise instead of its own (a
group's members then act alike there: a shared prefix, or all agents but one) and `trained` which steps the
loss learns from.

`algo` is the learner: its settings and `strategy_options(name)`, and for tokens its model, vocab, task and
pipeline, for environments its policy. Hooks run per
seed on this device's share of the prompts under `shard_map`; memory is the same on every device, so a hook that
writes it first gathers the whole batch (`mesh.gather_shares`) and writes deterministically (`last_occurrence`).
Register a new one with `register`, then name it in the config: `--config.rollout.filter=my_filter`.

Modules: `stages` (the registries, what flows between the stages, the config checks), `pieces` (pure functions
the token strategies share), `tokens` (the built-in token strategies, registered on import, and their keys),
`environments` (the env Generate strategies, registered on import, and their check).
"""

from jaxrl.rollout.pieces import (allocate_groups, difficulty_tier, distinct_share, hint_lengths,  # noqa: F401
                                  hint_update, importance_weights, last_occurrence, member_hint_lengths, tie_ranks,
                                  tree_advantages)
from jaxrl.rollout.stages import (STAGES, STRATEGIES, Groups, Pipeline, Plan, Strategy, check_config,  # noqa: F401
                                  config_keys, configured_options, get, names, option_keys, options_of,
                                  register, settings_of)
from jaxrl.rollout.tokens import plan_candidates  # noqa: F401  (registers the token strategies)
from jaxrl.rollout.environments import share_leader_noise  # noqa: F401  (registers the env strategies)
