"""The rollout registries (one per domain and stage), what flows between the stages (`Plan`, `Groups`), a run's
chosen strategies (`Pipeline`) and the config keys and checks of `config.rollout`. See `jaxrl.rollout`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct
from ml_collections import ConfigDict

from jaxrl import knobs
from jaxrl.knobs import Knob
from jaxrl.mesh import DATA_AXIS
from jaxrl.rollout.pieces import member_hint_lengths


STAGES = ("generate", "filter", "control", "replay")
DOMAINS = {"tokens": STAGES, "env": ("generate",)}  # token-level GRPO, GRPO on environments: their stages
HOOKS = {"tokens": ("init", "prime", "tune", "before", "generate", "replaces", "observe", "after", "advantages"),
         "env": ("members",)}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One registered rollout strategy: its stage, hooks (see `jaxrl.rollout`), option defaults and check."""

    stage: str
    name: str
    domain: str = "tokens"
    init: Callable | None = None
    prime: Callable | None = None  # (algo, memory, params, key) -> memory: once, from the starting policy
    tune: Callable | None = None  # (algo, memory, hp) -> hp: the sampling hyperparameters of this update's generation
    before: Callable | None = None
    generate: Callable | None = None
    # (algo, memory, params, plan, generate, key) -> (Groups, metrics): generates only part of the plan itself,
    # through generate(plan, key), and supplies the rest (a replay of whole stored groups); at most one per run
    replaces: Callable | None = None
    advantages: Callable | None = None  # (algo, groups, rewards [n, G]) -> (advantages, weights) [n, G, N]
    members: Callable | None = None
    observe: Callable | None = None
    after: Callable | None = None
    check: Callable | None = None  # (config, chosen {stage: names}) -> None, or a ValueError naming the key
    options: tuple[tuple[str, Any], ...] = ()  # (name, default): config keys rollout.options.<name>.<key>
    needs_pool: bool = False  # keeps memory per training problem: needs a finite pool (rollout.pool_size > 0)
    selects: bool = False  # a Control strategy that keeps B groups of B x oversample candidates
    requires: tuple[str, ...] = ()  # names of strategies that must run too
    predicts: bool = False  # a Filter whose `before` fills `Plan.predicted` (a pass-rate predictor)
    reads_predictions: bool = False  # reads `Plan.predicted`: exactly one `predicts` strategy must run too
    draws: bool = False  # its `before` hook redraws the candidate problems: it runs before every other one
    stops_early: bool = False  # generation stops once every slot of `oversample` candidates has a finished group
    baseline: bool = False  # its `before` gives each candidate its problem's value (`Plan.baseline`): `tracked` reads it
    single_turn: bool = False  # works on single-answer completions only (not on multi-turn episodes)


STRATEGIES: dict[str, dict[str, dict[str, Strategy]]] = {d: {stage: {} for stage in STAGES} for d in DOMAINS}


def register(stage: str, name: str, *, domain: str = "tokens", options: dict | None = None, **fields) -> Strategy:
    """Add a strategy to its domain's and stage's registry; `fields`: its hooks (see `jaxrl.rollout`), `check`
    and flags (`Strategy`). `options`: {key: (default, one line of help, and `jaxrl.knobs.Knob`'s bounds as a
    dict)}, each declared as config key rollout.options.<name>.<key>."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown rollout domain {domain!r}; domains: {', '.join(DOMAINS)}")
    if stage not in DOMAINS[domain]:
        raise ValueError(f"unknown rollout stage {stage!r} of domain {domain}; its stages: "
                         f"{', '.join(DOMAINS[domain])}")
    if name in STRATEGIES[domain][stage]:
        raise ValueError(f"rollout strategy {stage}/{name} ({domain}) is already registered")
    hooks = set(fields) & {hook for domain_hooks in HOOKS.values() for hook in domain_hooks}
    if hooks - set(HOOKS[domain]) or not hooks:
        raise ValueError(f"rollout strategy {name!r}: the hooks of domain {domain} are {', '.join(HOOKS[domain])}; "
                         f"got {sorted(hooks)}")
    if ("generate" in hooks or "members" in hooks) != (stage == "generate"):
        raise ValueError(f"rollout strategy {name!r}: Generate strategies, and only they, have a `generate` "
                         f"(tokens) or `members` (env) hook")
    options = {key: Knob(f"rollout.options.{name}.{key}", default, help, **accepts).default  # (declared)
               for key, (default, help, accepts) in (options or {}).items()}
    strategy = Strategy(stage, name, domain, options=tuple(options.items()), **fields)
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
    prune_at: jax.Array | None = None  # int32 [C]: the column where members may be pruned (a pruning strategy)
    prune_below: jax.Array | None = None  # float32 [C]: members predicted below it there are stopped
    baseline: jax.Array | None = None  # float32 [C, K]: the problem's tracked value per reward component (a tracker)
    hint_members: jax.Array | None = None  # int32 [C]: ADHint: only the first members get the hint (None: all)
    length_cap: jax.Array | None = None  # int32 [C]: completion columns a member may use (a shorter window; None: N)


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
    rewards: jax.Array  # float32 [n, G, K]: the reward's components (the verifier's, unless a reward model's)
    weight: jax.Array  # float32 [n, G, N]: loss weight per token (0 on hints; importance weights on replays)
    bonus: jax.Array  # float32 [n, G]: added to the reward where a group's verifier rewards are all equal
    replayed: jax.Array  # bool [n, G]: the member comes from memory, not from this update's policy
    start: jax.Array | None = None  # int32 [n]: columns drawn in earlier updates (a resumed group)
    decided: jax.Array | None = None  # int32 [n]: columns final so far (N unless decoding stopped early)
    behaviour: jax.Array | None = None  # float32 [n, G, N]: log-probabilities under the policies that drew
    finished: jax.Array | None = None  # bool [n]: every member has ended (None: all have), an outcome to learn from
    pruned: jax.Array | None = None  # bool [n, G]: members stopped early by their predicted value
    branched_at: jax.Array | None = None  # int32 [n, G]: column where a tree member left its branch's leader
    # Multi-turn episodes (`jaxrl.multi_turn`): `mask` holds the model's tokens (the loss's), `attend` bool
    # [n, G, N] every real token (the environment's too), `turns` the per-turn outcomes {field: [n, G, K]}
    attend: jax.Array | None = None
    turns: Any = None
    # float32 [n, G, K]: the verifier's components where `rewards` hold a reward model's (`reward.model`): kept
    # to measure the learned reward against the true one, never trained on
    verified: jax.Array | None = None
    # float32 [n, G, N]: an implicit reward model's per-token process rewards (with advantage.process_weight > 0)
    process: jax.Array | None = None
    # float32 [n, K]: the problem's tracked value per reward component before this update (`rollout.replay=tracker`)
    baseline: jax.Array | None = None
    # float32 [n]: the pass rate a Filter predicted when the group was planned (`Plan.predicted`; -1: none)
    predicted: jax.Array | None = None
    # int32 [n]: ADHint (`rollout.options.hints.adaptive`): the first hint_members[i] members of group i were hinted,
    # the rest sampled without the hint (None: every member has the group's hint_len)
    hint_members: jax.Array | None = None

    @property
    def member_hint_len(self) -> jax.Array:
        """int32 [n, G]: each member's forced hint tokens (`pieces.member_hint_lengths`)."""
        return member_hint_lengths(self.hint_len, self.hint_members, self.tokens.shape[1])

    @property
    def generated(self) -> jax.Array:
        """float32 [n, G, N]: tokens this update's policy drew (hints, replays and resumed columns excluded)."""
        first = self.member_hint_len if self.start is None else jnp.maximum(self.member_hint_len, self.start[:, None])
        drawn = jnp.arange(self.tokens.shape[-1]) >= first[..., None]
        return self.mask * drawn * ~self.replayed[..., None]

    def finished_only(self, mask: jax.Array) -> jax.Array:
        """mask bool [n] where the group is finished (memories learn from finished groups only)."""
        return mask if self.finished is None else mask & self.finished


def take(tree, index: jax.Array):
    """A `Plan` or `Groups` (any tree of leaves [C, ...]) at the rows `index` [m]: leaves [m, ...]."""
    return jax.tree.map(lambda x: x[index], tree)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The strategies a run chose (`settings_of`), in the order they run, with their configured options."""

    strategies: tuple[Strategy, ...]
    options: tuple = ()  # ((name, ((key, value), ...)), ...): `configured_options`

    @classmethod
    def of(cls, chosen: tuple, options: tuple = (), domain: str = "tokens") -> "Pipeline":
        """chosen: ((stage, (name, ...)), ...) as `settings_of` gives it."""
        return cls(tuple(get(stage, name, domain) for stage, chosen_names in chosen for name in chosen_names), options)

    @property
    def generator(self) -> Strategy:
        generator, = (s for s in self.strategies if s.stage == "generate")
        return generator

    def any(self, flag: str) -> bool:
        """Whether any chosen strategy has `flag` (a Strategy field: a hook or a flag)."""
        return any(getattr(s, flag) for s in self.strategies)

    @property
    def forces_hints(self) -> bool:
        """Any plan change may set hint lengths: the generator then forces reference-answer prefixes."""
        return self.any("before")

    @property
    def uses_bonus(self) -> bool:
        """Filters' bonuses (`Groups.bonus`) reach the advantages of groups whose verifier rewards tie."""
        return any(s.stage == "filter" and s.after for s in self.strategies)

    def options_of(self, name: str) -> dict:
        """The options of chosen strategy `name` (its registered defaults, overridden by the config)."""
        strategy, = (s for s in self.strategies if s.name == name)
        return options_of(strategy, self.options)

    def init(self, algo, key: jax.Array, params=None) -> dict:
        """{strategy name: its memory} of the strategies that keep one; with the starting policy's `params`, those that
        prime their memory from it have (`Strategy.prime`)."""
        memory = {s.name: s.init(algo, key) for s in self.strategies if s.init}
        for i, s in enumerate(self.strategies):
            if s.prime and params is not None:
                memory[s.name] = s.prime(algo, memory[s.name], params, jax.random.fold_in(key, i + 1))
        return memory

    def run(self, algo, params, hp, memory: dict, plan: Plan, key: jax.Array,
            rewarded: Callable[[Groups], Groups] | None = None) -> tuple[dict, Groups, dict]:
        """The stages for one seed on this device, from the candidates `plan`: tune (the sampling hyperparameters),
        before (a strategy that redraws the problems first), generate (or a strategy that `replaces` part of it),
        `rewarded` (a reward model's scores in place of the verifier's, which every
        later stage then sees), observe, after. Returns (memory, Groups, metrics)."""
        memory, metrics = dict(memory), {}
        for strategy in self.strategies:
            if strategy.tune:
                hp = strategy.tune(algo, memory.get(strategy.name), hp)
        hook_key = lambda i: jax.random.fold_in(key, i + 1)
        for i, strategy in sorted(enumerate(self.strategies), key=lambda item: not item[1].draws):
            if strategy.before:
                plan, m = strategy.before(algo, memory.get(strategy.name), plan, hook_key(i))
                metrics.update(m)
        generate = functools.partial(self.generator.generate, algo, params, hp)
        replacing = [s for s in self.strategies if s.replaces]
        if replacing:
            groups, m = replacing[0].replaces(algo, memory[replacing[0].name], params, plan, generate, key)
            metrics.update(m)
        else:
            groups = generate(plan, key)
        if rewarded is not None:
            groups = rewarded(groups)
        metrics["sampled_tokens"] = jax.lax.psum(jnp.sum(groups.generated), DATA_AXIS)  # every candidate's
        for strategy in self.strategies:
            if strategy.observe:
                memory[strategy.name], m = strategy.observe(algo, memory[strategy.name], groups, params)
                metrics.update(m)
        for i, strategy in enumerate(self.strategies):
            if strategy.after:
                groups, m = strategy.after(algo, memory.get(strategy.name), groups, params, hook_key(i))
                metrics.update(m)
        return memory, groups, metrics


# ---------------------------------------------------------------------------------------------------
# config.rollout


# The stages' config keys: strategy names, comma-separated, run in that order (the registry says which exist)
STAGE_KNOBS = {
    "generate": Knob("rollout.generate", "independent", "the Generate strategy: how a group's members are drawn"),
    "filter": Knob("rollout.filter", "", "Filter strategies: what is scored or predicted before training, e.g. "
                   "rank_ties"),
    "control": Knob("rollout.control", "dynamic_sampling", "Control strategies: which candidates are trained, e.g. "
                    "partial"),
    "replay": Knob("rollout.replay", "", "Replay strategies: what is kept and brought back, e.g. correct,hints "
                   "(need pool_size > 0)"),
}
POOL_SIZE = Knob("rollout.pool_size", 0, "> 0: a fixed pool of training problems (memory per problem); 0: fresh "
                 "ones", minimum=0)


def config_keys(domain: str) -> ConfigDict:
    """config.rollout of `domain`: the strategies of each of its stages (`STAGE_KNOBS`), the pool of training
    problems where it replays, and every registered strategy's options."""
    stages = DOMAINS[domain]
    config = knobs.defaults(*(STAGE_KNOBS[stage] for stage in stages),
                            *((POOL_SIZE,) if "replay" in stages else ())).rollout
    config.options = option_keys(domain)
    return config


def _chosen(config: ConfigDict, domain: str) -> dict[str, tuple[str, ...]]:
    return {stage: names(config.rollout[stage]) for stage in DOMAINS[domain]}


def settings_of(config: ConfigDict, domain: str) -> dict:
    """The settings fields of config.rollout's strategies: `rollout` ((stage, (name, ...)), ...) for the stages
    that name some, and `rollout_options` (`configured_options`)."""
    return dict(rollout=tuple((stage, chosen) for stage, chosen in _chosen(config, domain).items() if chosen),
                rollout_options=configured_options(config.rollout.options))


def check_config(config: ConfigDict, domain: str) -> None:
    """Names each unknown strategy, a stage without its one Generate strategy, what a strategy needs (other
    strategies, a pool, options it knows, `group.oversample`) and what its own `check` refuses."""
    r, chosen = config.rollout, _chosen(config, domain)
    for stage, chosen_names in chosen.items():
        for name in chosen_names:
            try:
                get(stage, name, domain)
            except ValueError as error:
                raise ValueError(f"config.rollout.{stage}: {error}") from None
        if len(set(chosen_names)) != len(chosen_names):
            raise ValueError(f"config.rollout.{stage} names a strategy twice: {r[stage]!r}")
    if len(chosen["generate"]) != 1:
        raise ValueError(f"config.rollout.generate must name exactly one strategy, got {r.generate!r}")
    strategies = Pipeline.of(tuple(chosen.items()), domain=domain).strategies
    for strategy in strategies:
        missing = [name for name in strategy.requires if not any(name in names for names in chosen.values())]
        if missing:
            raise ValueError(f"rollout strategy {strategy.stage}/{strategy.name} needs {', '.join(missing)} in "
                             f"config.rollout too")
        if strategy.reads_predictions and not any(s.predicts for s in strategies):
            known = ", ".join(name for name, s in STRATEGIES[domain]["filter"].items() if s.predicts)
            raise ValueError(f"rollout strategy {strategy.stage}/{strategy.name} reads predicted pass rates: name a "
                             f"predictor ({known}) in config.rollout.filter")
        if strategy.needs_pool and not r.get("pool_size"):
            raise ValueError(f"rollout strategy {strategy.stage}/{strategy.name} keeps memory per training problem: "
                             f"set config.rollout.pool_size > 0")
        given = r.options.get(strategy.name, ConfigDict()).to_dict()
        unknown = set(given) - {k for k, _ in strategy.options}
        if unknown:
            raise ValueError(f"config.rollout.options.{strategy.name} has unknown keys {sorted(unknown)}; known: "
                             f"{sorted(k for k, _ in strategy.options)}")
    predicting = [s.name for s in strategies if s.predicts]
    if len(predicting) > 1:  # each would overwrite the other's predictions
        raise ValueError(f"config.rollout.filter names {len(predicting)} pass-rate predictors "
                         f"({', '.join(predicting)}); at most one")
    drawing = [s.name for s in strategies if s.draws]
    if len(drawing) > 1:
        raise ValueError(f"config.rollout names {len(drawing)} strategies that redraw the problems "
                         f"({', '.join(drawing)}); at most one")
    for strategy in strategies:
        if strategy.check:
            strategy.check(config, chosen)
    stopping = [s.name for s in strategies if s.stops_early]
    oversample = config.group.get("oversample", 1)  # (candidates per slot: the token domain's)
    if stopping and oversample < 2:
        raise ValueError(f"rollout strategy {stopping[0]} starts more groups than it trains: set "
                         f"config.group.oversample >= 2 (candidates per slot), got {config.group.oversample}")
    selecting = [s.name for s in strategies if s.selects]
    if oversample > 1 and len(selecting) != 1:
        known = ", ".join(name for name, s in STRATEGIES[domain]["control"].items() if s.selects)
        raise ValueError(f"config.group.oversample = {config.group.oversample} needs exactly one selecting Control "
                         f"strategy in config.rollout.control ({known}), got {selecting or 'none'}")
