"""Rollout strategies of group RL, one registry per stage: Generate, Filter, Control, Replay.

The stages follow the "Generate, Filter, Control, Replay" split of rollout pipelines. In one update of a
group learner (token-level GRPO: `jaxrl.algos.text.TextGRPO`) they run in this order, inside the compiled
update (no Python loop per sample):

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

A strategy is a named `Strategy` of one stage with any of these hooks (all optional but one):

    init(algo, key) -> memory                                  one seed's memory, kept in the training state
    before(algo, memory, plan, key) -> (plan, metrics)
    generate(algo, params, hp, plan, key) -> Groups            Generate strategies only
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

`algo` is the learner (its settings, model, vocab, task and `strategy_options(name)`). Hooks run per seed on
this device's share of the prompts under `shard_map`; memory is the same on every device, so a hook that
writes it first gathers the whole batch (`mesh.gather_shares`) and writes deterministically (`last_occurrence`).
Register a new one with `register`, then name it in the config: `--config.rollout.filter=my_filter`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.knobs import Knob


STAGES = ("generate", "filter", "control", "replay")
DOMAINS = ("tokens", "env")  # token-level GRPO, GRPO on environments
HOOKS = {"tokens": ("init", "before", "generate", "observe", "after", "advantages"), "env": ("members",)}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One registered rollout strategy: its stage, hooks (see the module docstring) and option defaults."""

    stage: str
    name: str
    domain: str = "tokens"
    init: Callable | None = None
    before: Callable | None = None
    generate: Callable | None = None
    advantages: Callable | None = None  # (algo, groups, rewards [n, G]) -> (advantages, weights) [n, G, N]
    members: Callable | None = None
    observe: Callable | None = None
    after: Callable | None = None
    options: tuple[tuple[str, Any], ...] = ()  # (name, default): config keys rollout.options.<name>.<key>
    needs_pool: bool = False  # keeps memory per training problem: needs a finite pool (rollout.pool_size > 0)
    selects: bool = False  # a Control strategy that keeps B groups of B x oversample candidates
    requires: tuple[str, ...] = ()  # names of strategies that must run too (e.g. the predictor it reads)
    draws: bool = False  # its `before` hook redraws the candidate problems: it runs before every other one
    stops_early: bool = False  # generation stops once every slot of `oversample` candidates has a finished group


STRATEGIES: dict[str, dict[str, dict[str, Strategy]]] = {d: {stage: {} for stage in STAGES} for d in DOMAINS}


# The stages' config keys: strategy names, comma-separated, run in that order (a domain's registry says which exist)
STAGE_KNOBS = (
    Knob("rollout.generate", "independent", "the Generate strategy: how a group's members are drawn"),
    Knob("rollout.filter", "", "Filter strategies: what is scored or predicted before training, e.g. rank_ties"),
    Knob("rollout.control", "dynamic_sampling", "Control strategies: which candidates are trained, e.g. partial"),
    Knob("rollout.replay", "", "Replay strategies: what is kept and brought back, e.g. correct,hints "
         "(need pool_size > 0)"),
    Knob("rollout.pool_size", 0, "> 0: a fixed pool of training problems (memory per problem); 0: fresh ones",
         minimum=0),
)


def register(stage: str, name: str, *, domain: str = "tokens", options: dict | None = None, needs_pool: bool = False,
             selects: bool = False, requires: tuple[str, ...] = (), draws: bool = False, stops_early: bool = False,
             **hooks) -> Strategy:
    """Add a strategy to its domain's and stage's registry; `hooks` are the functions of the module docstring.
    `options`: {key: (default, one line of help, and `jaxrl.knobs.Knob`'s bounds as a dict)}, each declared as
    config key rollout.options.<name>.<key>."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown rollout domain {domain!r}; domains: {', '.join(DOMAINS)}")
    if stage not in STAGES:
        raise ValueError(f"unknown rollout stage {stage!r}; stages: {', '.join(STAGES)}")
    if name in STRATEGIES[domain][stage]:
        raise ValueError(f"rollout strategy {stage}/{name} ({domain}) is already registered")
    unknown = set(hooks) - set(HOOKS[domain])
    if unknown or not hooks:
        raise ValueError(f"rollout strategy {name!r}: the hooks of domain {domain} are {', '.join(HOOKS[domain])}; "
                         f"got {sorted(hooks)}")
    if ("generate" in hooks or "members" in hooks) != (stage == "generate"):
        raise ValueError(f"rollout strategy {name!r}: Generate strategies, and only they, have a `generate` "
                         f"(tokens) or `members` (env) hook")
    options = {key: Knob(f"rollout.options.{name}.{key}", default, help, **accepts).default  # (declared)
               for key, (default, help, accepts) in (options or {}).items()}
    strategy = Strategy(stage, name, domain, options=tuple(options.items()),
                        needs_pool=needs_pool, selects=selects, requires=tuple(requires), draws=draws,
                        stops_early=stops_early, **hooks)
    STRATEGIES[domain][stage][name] = strategy
    return strategy


def names(spec: str) -> tuple[str, ...]:
    """"a,b" -> ("a", "b"): a stage's config value lists its strategies in the order they run."""
    return tuple(n.strip() for n in spec.split(",") if n.strip())


def get(stage: str, name: str, domain: str = "tokens") -> Strategy:
    registry = STRATEGIES[domain].get(stage, {})
    if name not in registry:
        raise ValueError(f"unknown {stage} strategy {name!r}; known: {', '.join(sorted(registry)) or 'none'}")
    return registry[name]


def options_of(strategy: Strategy, configured: tuple) -> dict:
    """A strategy's options: its registered defaults, overridden by `configured` ((name, ((key, value), ...)),
    ...) from a settings object)."""
    return {**dict(strategy.options), **dict(dict(configured).get(strategy.name, ()))}


def configured_options(options) -> tuple:
    """config.rollout.options (a ConfigDict per strategy) as a settings field: ((name, ((key, value), ...)), ...)."""
    return tuple((name, tuple(sorted(o.to_dict().items()))) for name, o in sorted(options.items()))


def option_keys(domain: str) -> dict:
    """{strategy name: {option: default}} of every registered strategy of `domain` that has options (the
    config's rollout.options)."""
    return {name: dict(strategy.options) for stage in STAGES
            for name, strategy in STRATEGIES[domain][stage].items() if strategy.options}


# ---------------------------------------------------------------------------------------------------
# What flows between the stages


@struct.dataclass
class Plan:
    """The candidate prompts of one update on this device, before generation. Leaves [C, ...]."""

    ids: jax.Array  # int32 [C]: index in the training pool; -1 for a fresh problem (no pool)
    problems: Any  # envs.text.Problems [C]
    hint_len: jax.Array  # int32 [C]: reference-answer tokens forced at the start of every member (0: none)
    predicted: jax.Array  # float32 [C]: a Filter's predicted pass rate (-1: no prediction)
    start: jax.Array  # int32 [C]: completion columns generated in earlier updates (0: a fresh group)
    # Groups to continue, or None: {"tokens", "behaviour", "mask"} [C, G, N], "stopped" [C, G], and "cap" [C] (the
    # truncation of the importance weights of their earlier tokens).
    resume: Any = None
    prune_at: jax.Array | None = None  # int32 [C]: the column where members may be pruned (control/prune)
    prune_below: jax.Array | None = None  # float32 [C]: members predicted below it there are stopped


@struct.dataclass
class Groups:
    """Generated groups on this device: n prompts, G members each, N completion tokens."""

    ids: jax.Array  # int32 [n]
    problems: Any  # [n]
    prompts: jax.Array  # int32 [n, P]
    hint_len: jax.Array  # int32 [n]
    tokens: jax.Array  # int32 [n, G, N]
    log_probs: jax.Array  # float32 [n, G, N]: the policy that the loss's ratio starts from (behaviour)
    mask: jax.Array  # float32 [n, G, N]: real tokens (hints included: later tokens attend to them)
    lengths: jax.Array  # int32 [n, G]
    values: jax.Array | None  # float32 [n, G, N] with a value head, else None
    rewards: jax.Array  # float32 [n, G, K]: the verifier's components
    weight: jax.Array  # float32 [n, G, N]: loss weight per token (0 on hints; importance weights on replays)
    bonus: jax.Array  # float32 [n, G]: added to the reward where a group's verifier rewards are all equal
    replayed: jax.Array  # bool [n, G]: the member comes from memory, not from this update's policy
    start: jax.Array | None = None  # int32 [n]: columns drawn in earlier updates (a resumed group)
    decided: jax.Array | None = None  # int32 [n]: columns final so far (N unless decoding stopped early)
    behaviour: jax.Array | None = None  # float32 [n, G, N]: log-probabilities under the policies that drew
    finished: jax.Array | None = None  # bool [n]: every member has ended (None: all have), an outcome to learn from
    pruned: jax.Array | None = None  # bool [n, G]: members stopped early by their predicted value
    branched_at: jax.Array | None = None  # int32 [n, G]: column where a tree member left its branch's leader

    @property
    def generated(self) -> jax.Array:
        """float32 [n, G, N]: tokens this update's policy drew (hints, replays and resumed columns excluded)."""
        first = self.hint_len if self.start is None else jnp.maximum(self.hint_len, self.start)
        drawn = jnp.arange(self.tokens.shape[-1]) >= first[:, None, None]
        return self.mask * drawn * ~self.replayed[..., None]

    def finished_only(self, mask: jax.Array) -> jax.Array:
        """mask bool [n] where the group is finished (memories learn from finished groups only)."""
        return mask if self.finished is None else mask & self.finished


def take(tree, index: jax.Array):
    """A `Plan` or `Groups` (any tree of leaves [C, ...]) at the rows `index` [m]: leaves [m, ...]."""
    return jax.tree.map(lambda x: x[index], tree)


# ---------------------------------------------------------------------------------------------------
# Pieces the built-in strategies share (pure functions, tested on their own)


def last_occurrence(ids: jax.Array, write: jax.Array) -> jax.Array:
    """bool [n]: write[i], and no later j with write[j] has the same id. Scattering only these rows makes a
    write with repeated ids deterministic (the last one wins, on any number of devices)."""
    same = (ids[:, None] == ids[None, :]) & write[None, :]
    later = jnp.triu(same, k=1).any(axis=1)
    return write & ~later


def first_per_slot(ok: jax.Array, oversample: int) -> tuple[jax.Array, jax.Array]:
    """ok bool [b * O], O candidates per slot (slot-major) -> (index [b] of each slot's first candidate that
    is ok, else its last; filled bool [b]: one was)."""
    ok = ok.reshape(-1, oversample)
    filled = ok.any(axis=1)
    return jnp.arange(ok.shape[0]) * oversample + jnp.where(filled, jnp.argmax(ok, axis=1), oversample - 1), filled


def tie_ranks(scores: jax.Array) -> jax.Array:
    """[n, G] -> [n, G] ranks within each group centred on 0 and spread over [-1/2, 1/2] (the highest
    score +1/2); equal scores rank by position."""
    G = scores.shape[-1]
    ranks = jnp.argsort(jnp.argsort(scores, axis=-1, stable=True), axis=-1, stable=True)
    return ranks / max(G - 1, 1) - 0.5


def importance_weights(log_probs: jax.Array, behaviour_log_probs: jax.Array, mask: jax.Array, cap: float):
    """Per-token truncated importance weights min(pi(y_t) / mu(y_t), cap), 0 where `mask` is 0.

    pi: the current policy, mu: the one that drew the tokens (as V-trace's truncated rho). [..., N] each."""
    ratio = jnp.exp(jnp.where(mask > 0, log_probs - behaviour_log_probs, 0.0))
    return jnp.minimum(ratio, cap) * mask


def tree_advantages(rewards: jax.Array, in_tree: jax.Array, branches: int, depth, length: int, *,
                    scale: bool, eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Per-token advantages and loss weights [n, G, N] of groups sampled as trees.

    rewards [n, G]: each member's reward; a group's G members form `branches` branches of k = G / branches
    that share their first `depth` tokens (an int, or int32 [n, G]: each member's branch point). in_tree [n, G]:
    the member belongs to its branch (a replayed one does not, and is scored as an independent sample). With the group mean m and the branch mean m_b (over
    its members in the tree):
      shared prefix (t < depth): m_b - m, weight 1 / k (the k copies of one prefix count once);
      after the branch point:    r - m_b, weight 1;
      a member not in the tree:  r - m everywhere, weight 1.
    Prefix and suffix advantages add up to the flat r - m. `scale` divides by the group's std (+ eps)."""
    n, G = rewards.shape
    k = G // branches
    inside = in_tree.reshape(n, branches, k).astype(rewards.dtype)
    branch_mean = jnp.sum(rewards.reshape(n, branches, k) * inside, -1) / jnp.maximum(inside.sum(-1), 1.0)
    branch_mean = jnp.repeat(branch_mean, k, axis=1)  # [n, G]
    mean = rewards.mean(axis=1, keepdims=True)
    depth = jnp.asarray(depth)
    prefix = jnp.arange(length) < (depth[..., None] if depth.ndim else depth)  # [N] or [n, G, N]
    tree = jnp.where(prefix, (branch_mean - mean)[..., None], (rewards - branch_mean)[..., None])
    advantages = jnp.where(in_tree[..., None], tree, (rewards - mean)[..., None])
    weights = jnp.where(in_tree[..., None] & prefix, 1.0 / k, 1.0)
    if scale:
        advantages = advantages / (rewards.std(axis=1, keepdims=True)[..., None] + eps)
    return advantages, jnp.broadcast_to(weights, advantages.shape)


def allocate_groups(uncertainty: jax.Array, num_groups: int, max_groups: int) -> jax.Array:
    """Spend `num_groups` groups on candidates by their uncertainty [C] (>= 0): the candidate of each group
    [num_groups], sorted. Group k + 1 of a candidate is worth uncertainty / (k + 1) (diminishing returns), and
    the `num_groups` most valuable (candidate, k) pairs with k < max_groups are taken: the most uncertain
    candidates get up to `max_groups` groups, the least (predicted always right or always wrong) none. Never
    more than `num_groups` groups, never more than `max_groups` per candidate; ties go to the earlier one."""
    C = uncertainty.shape[0]
    if num_groups > C * max_groups:
        raise ValueError(f"{num_groups} groups cannot be spread over {C} candidates at most {max_groups} each")
    value = uncertainty[:, None] / jnp.arange(1, max_groups + 1, dtype=uncertainty.dtype)  # [C, M]
    _, best = jax.lax.top_k(value.reshape(-1), num_groups)
    return jnp.sort(best // max_groups)


def hint_update(tier: jax.Array, streak: jax.Array, pass_rate: jax.Array, *, patience: int, tiers: int,
                recover: float) -> tuple[jax.Array, jax.Array]:
    """One observation of a prompt's group -> its (tier, streak); all int32 [n] except pass_rate [n].

    A prompt that no member solves `patience` times in a row moves one hint tier up (at most `tiers`);
    one whose pass rate reaches `recover` moves one tier down (hints are taken away as it recovers)."""
    stuck = pass_rate <= 0
    streak = jnp.where(stuck, streak + 1, 0)
    up = stuck & (streak >= patience) & (tier < tiers)
    down = (pass_rate >= recover) & (tier > 0)
    tier = tier + up.astype(tier.dtype) - down.astype(tier.dtype)
    return tier, jnp.where(up, 0, streak)


def hint_lengths(tier: jax.Array, answer_lengths: jax.Array, tiers: int) -> jax.Array:
    """Tokens of the reference answer (lengths [n], EOS excluded) revealed at `tier` of `tiers`: tier k
    reveals floor(k / (tiers + 1)) of it, so even the top tier leaves the end of the answer to the model."""
    return (tier * answer_lengths) // (tiers + 1)
