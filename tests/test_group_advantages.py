"""Group advantage estimators (GRPO family) against hand-written NumPy loops, plus their properties."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import advantages as adv_lib
from jaxrl.advantages import (ESTIMATORS, GroupAdvantages, get, group_advantages, register, returns_to_go,
                              stepwise_group_advantages)

EPS = 1e-6
B, G, A = 6, 5, 3
DEFAULT_SCALE = {"grpo": "group", "dr_grpo": "none", "rloo": "none", "median": "group", "gdpo": "group",
                 "per_agent": "group", "calibrated": "group", "bnpo": "none"}
SHIFT_INVARIANT = ["grpo", "dr_grpo", "rloo", "median", "gdpo", "per_agent"]


# ---- NumPy reference: plain loops over groups, nothing shared with the implementation ----------------

def _ref_rule(name, x, scale, batch_std, eps, max_reward):
    """Advantages and keep flags for the valid rewards x (1-D, sample order) of one group."""
    n = len(x)
    if n == 0:
        return [], []
    mean = sum(x) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / n)
    keep = [True] * n
    if name in ("grpo", "dr_grpo", "per_agent", "gdpo"):
        centered = [v - mean for v in x]
    elif name == "rloo":
        centered = [x[i] - (sum(x) - x[i]) / (n - 1) if n > 1 else 0.0 for i in range(n)]
    elif name == "median":
        s = sorted(x)
        med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        centered = [v - med for v in x]
        if n % 2:
            keep[x.index(med)] = False  # list.index: the lowest index holding the median value
    elif name == "calibrated":
        y = list(x) + [max_reward]
        mean = sum(y) / len(y)
        std = math.sqrt(sum((v - mean) ** 2 for v in y) / len(y))
        centered = [v - mean for v in x]
    else:
        raise AssertionError(name)
    divisor = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
    return [c / divisor if k else 0.0 for c, k in zip(centered, keep)], keep


def _ref_scalar(name, rewards, mask, scale, eps, max_reward):
    """rewards, mask [B, G] or [B, G, A] -> advantages, weight (float64)."""
    out, weight = np.zeros(rewards.shape), np.zeros(rewards.shape)
    batch_std = float(np.std(rewards[mask])) if mask.any() else 0.0
    n_groups = rewards.shape[0]
    if rewards.ndim == 2:
        groups = [[(b, g) for g in range(rewards.shape[1])] for b in range(n_groups)]
    elif name == "per_agent":  # one group per (b, agent)
        groups = [[(b, g, a) for g in range(rewards.shape[1])]
                  for b in range(n_groups) for a in range(rewards.shape[2])]
    else:  # agents share the group, g-major order
        groups = [[(b, g, a) for g in range(rewards.shape[1]) for a in range(rewards.shape[2])]
                  for b in range(n_groups)]
    for members in groups:
        idx = [i for i in members if mask[i]]
        values, keep = _ref_rule(name, [float(rewards[i]) for i in idx], scale, batch_std, eps, max_reward)
        for i, v, k in zip(idx, values, keep):
            out[i], weight[i] = v, float(k)
    return out, weight


def reference(name, rewards, mask, *, scale=None, eps=EPS, clip=None, reward_weights=None, renormalize=False,
              max_reward=1.0):
    rewards = np.asarray(rewards, np.float64)
    mask = np.asarray(mask, bool)  # full [B, G(, A)] shape
    scale = scale or DEFAULT_SCALE[name]
    if name == "gdpo":
        comps = [rewards] if reward_weights is None else [rewards[..., k] for k in range(rewards.shape[-1])]
        weights = [1.0] if reward_weights is None else reward_weights
        out = sum(w * _ref_scalar("gdpo", c, mask, scale, eps, max_reward)[0] for w, c in zip(weights, comps))
        if renormalize:
            m, s = out[mask].mean(), out[mask].std()
            out = np.where(mask, (out - m) / (s + eps), 0.0)
        weight = mask.astype(float)
    else:
        combined = rewards if reward_weights is None else sum(
            w * rewards[..., k] for k, w in enumerate(reward_weights))
        out, weight = _ref_scalar(name, combined, mask, scale, eps, max_reward)
    if clip:
        out = np.where(weight > 0, np.clip(out, -clip, clip), 0.0)
    zero_var = []
    for b in range(rewards.shape[0]):
        vecs = [rewards[b][i] for i in zip(*np.nonzero(mask[b]))]
        zero_var.append(all(np.array_equal(v, vecs[0]) for v in vecs))
    return out, weight, np.array(zero_var)


def random_case(seed, agents=False, k=None):
    """Random rewards with some special groups: all equal, a single valid sample, none valid."""
    rng = np.random.default_rng(seed)
    lead = (B, G, A) if agents else (B, G)
    shape = lead + ((k,) if k else ())
    rewards = rng.normal(size=shape)
    if k:
        rewards[..., 0] = rng.integers(0, 2, size=lead)  # a binary component: ties and per-component zero variance
    mask = rng.random(lead) < 0.7
    rewards[0] = rewards[0].reshape(-1)[0]  # group 0: every reward equal
    mask[1] = False
    mask[1].reshape(-1)[2] = True  # group 1: a single valid sample
    mask[2] = False  # group 2: nothing valid
    mask[3] = True  # group 3: all valid
    return rewards.astype(np.float32), mask


@functools.lru_cache(maxsize=None)
def _jitted(name, options):
    return jax.jit(functools.partial(get(name), **dict(options)))


def estimate(name, rewards, mask=None, **options) -> GroupAdvantages:
    """The jitted estimator; one compiled function per (name, options), reused across tests."""
    if mask is None:
        mask = np.ones(np.shape(rewards)[:-1] if options.get("reward_weights") else np.shape(rewards), bool)
    return _jitted(name, tuple(sorted(options.items())))(jnp.asarray(rewards, jnp.float32), jnp.asarray(mask))


def assert_matches_reference(name, rewards, mask, **options):
    out = estimate(name, rewards, mask, **options)
    chex.assert_shape([out.advantages, out.weight], mask.shape)
    chex.assert_shape(out.zero_variance, (rewards.shape[0],))
    chex.assert_type([out.advantages, out.weight], jnp.float32)
    ref_adv, ref_weight, ref_zero = reference(name, rewards, mask, **options)
    np.testing.assert_allclose(out.advantages, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out.weight, ref_weight)
    np.testing.assert_array_equal(out.zero_variance, ref_zero)


# ---- every estimator against the reference -----------------------------------------------------------

# (name, agent axis, K components, options): every estimator on [B, G] and, where it applies, [B, G, A];
# the scales not covered by an estimator's default are spread over the cases to keep compiles few.
REFERENCE_CASES = [
    ("grpo", False, None, {}),
    ("grpo", True, None, {"scale": "batch"}),
    ("grpo", True, 2, {"reward_weights": (1.0, 0.5)}),  # combining K components before a scalar estimator
    ("dr_grpo", False, None, {}),
    ("dr_grpo", True, None, {}),
    ("rloo", False, None, {}),
    ("rloo", True, None, {"scale": "group"}),
    ("rloo", False, 3, {"reward_weights": (1.0, -0.5, 2.0)}),
    ("median", False, None, {}),
    ("median", True, None, {"scale": "none"}),
    ("median", True, 2, {"reward_weights": (1.0, 0.25), "scale": "batch"}),
    ("calibrated", False, None, {}),
    ("calibrated", True, None, {"scale": "batch"}),
    ("calibrated", False, None, {"max_reward": 2.5, "scale": "none"}),
    ("per_agent", True, None, {}),
    ("per_agent", True, 2, {"reward_weights": (0.5, 2.0), "scale": "batch"}),
    ("gdpo", False, None, {}),
    ("gdpo", False, 3, {"reward_weights": (1.0, 0.5, 2.0)}),
    ("gdpo", True, 2, {"reward_weights": (1.0, 3.0), "scale": "batch"}),
    ("gdpo", True, 3, {"reward_weights": (1.0, 0.5, 2.0), "renormalize": True}),
]


@pytest.mark.parametrize("seed,case", list(enumerate(REFERENCE_CASES)),
                         ids=[f"{n}-{'BGA' if a else 'BG'}-K{k or 0}-" + "-".join(f"{o}={v}" for o, v in opts.items()
                                                                                    if o != "reward_weights")
                              for n, a, k, opts in REFERENCE_CASES])
def test_matches_numpy_reference(seed, case):
    name, agents, k, options = case
    rewards, mask = random_case(seed, agents, k)
    assert_matches_reference(name, rewards, mask, **options)


def test_scale_batch_and_none_formulas():
    rewards, mask = random_case(3)
    r = np.where(mask, rewards, 0.0).astype(np.float64)
    n = mask.sum(1, keepdims=True)
    mean = r.sum(1, keepdims=True) / np.maximum(n, 1)
    batch_std = rewards[mask].astype(np.float64).std()
    out = estimate("grpo", rewards, mask, scale="batch")
    np.testing.assert_allclose(out.advantages, np.where(mask, (r - mean) / (batch_std + EPS), 0), atol=1e-5)
    out = estimate("grpo", rewards, mask, scale="none")
    np.testing.assert_allclose(out.advantages, np.where(mask, r - mean, 0), atol=1e-5)
    out = estimate("rloo", rewards, mask, scale="none")
    factor = np.where(n > 1, n / np.maximum(n - 1, 1), 0)
    np.testing.assert_allclose(out.advantages, np.where(mask, factor * (r - mean), 0), atol=1e-5)


def test_sample_mask_broadcasts_over_agents():
    rewards, _ = random_case(4, agents=True)
    sample_mask = np.random.default_rng(4).random((B, G)) < 0.6
    for name in ("dr_grpo", "per_agent"):
        chex.assert_trees_all_close(estimate(name, rewards, sample_mask),
                                    estimate(name, rewards, np.repeat(sample_mask[..., None], A, -1)))


# ---- properties ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SHIFT_INVARIANT)
def test_invariant_to_a_constant_shift(name):
    k = 3 if name == "gdpo" else None
    rewards, mask = random_case(5, agents=name == "per_agent", k=k)
    opts = {"reward_weights": (1.0, 0.5, 2.0)} if k else {}
    base, shifted = (estimate(name, r, mask, **opts) for r in (rewards, rewards + 3.25))
    np.testing.assert_allclose(shifted.advantages, base.advantages, atol=1e-4)
    chex.assert_trees_all_equal(shifted.weight, base.weight)


@pytest.mark.parametrize("name", sorted(DEFAULT_SCALE))
def test_identical_rewards_give_zero_advantages(name):
    # The first values are ones whose float32 mean over 5 copies is off by an ulp, which (std + eps) would
    # blow up into O(1) advantages; exact zeros are still required.
    lead = (B, G, A) if name == "per_agent" else (B, G)
    values = np.array([-5.3566937, 6.4042263, 0.1, 1e3, 1 / 3, 2.2], np.float32)
    rewards = np.broadcast_to(values.reshape((B,) + (1,) * (len(lead) - 1)), lead)
    mask = np.random.default_rng(0).random(lead) < 0.8
    mask[:2] = True  # G = 5 valid samples per group (and per agent)
    out = estimate(name, rewards, mask)
    assert bool(out.zero_variance.all())
    if name == "calibrated":  # by design: the virtual max_reward sample still sets a baseline
        assert (np.abs(np.asarray(out.advantages))[mask] > 0).all()
    else:
        np.testing.assert_array_equal(out.advantages, 0.0)


def test_zero_variance_compares_reward_vectors():
    same = jnp.array([[[1.0, 0.0]] * 3])  # [1, 3, 2]: equal vectors
    tied = jnp.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])  # sums tie, vectors differ
    weights = (1.0, 1.0)
    assert bool(estimate("grpo", same, reward_weights=weights).zero_variance[0])
    out = estimate("grpo", tied, reward_weights=weights)
    assert not bool(out.zero_variance[0])
    np.testing.assert_array_equal(out.advantages, 0.0)  # grpo only sees the tied sums


@pytest.mark.parametrize("name", sorted(DEFAULT_SCALE))
def test_padded_samples_are_inert(name):
    agents = name == "per_agent"
    rewards, mask = random_case(11, agents=agents)
    fn = functools.partial(estimate, name)
    base = fn(rewards, mask)
    np.testing.assert_array_equal(np.asarray(base.advantages)[~mask], 0.0)
    np.testing.assert_array_equal(np.asarray(base.weight)[~mask], 0.0)
    for junk in (1e6, np.nan, -np.inf):
        chex.assert_trees_all_equal(fn(np.where(mask, rewards, junk).astype(np.float32), mask), base)


def test_median_pivot_excluded_with_odd_counts_only():
    rewards = jnp.array([[3.0, 1.0, 2.0, 2.0, 5.0, 9.0],   # 5 valid (last padded): median 2, ties at 2 and 3
                         [3.0, 1.0, 2.0, 5.0, 4.0, 0.0]])  # 6 valid: median 2.5, nobody excluded
    mask = jnp.array([[True] * 5 + [False], [True] * 6])
    out = jax.jit(get("median"))(rewards, mask)
    np.testing.assert_array_equal(out.weight, [[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]])  # lowest index pivots
    std = np.std([3.0, 1.0, 2.0, 2.0, 5.0])
    np.testing.assert_allclose(out.advantages[0], np.array([1, -1, 0, 0, 3, 0]) / (std + EPS), rtol=1e-5)
    assert bool((out.advantages[1] != 0).all())
    # On random data: exactly one valid sample excluded per odd group, none per even group.
    rewards, mask = random_case(12, agents=True)
    out = estimate("median", rewards, mask, scale="none")
    n = mask.reshape(B, -1).sum(1)
    excluded = (mask & (np.asarray(out.weight) == 0)).reshape(B, -1).sum(1)
    np.testing.assert_array_equal(excluded, n % 2)


def test_calibrated_all_failed_group_gets_negative_advantages():
    rewards = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = estimate("calibrated", rewards)
    # Virtual success: mean' = 1/5, std' = 0.4, so each failure gets -0.2 / 0.4.
    np.testing.assert_allclose(out.advantages[0], -0.5, rtol=1e-5)
    np.testing.assert_allclose(out.advantages[1], 0.0, atol=1e-6)  # all succeeded: matches the virtual sample
    np.testing.assert_array_equal(out.zero_variance, [True, True])
    np.testing.assert_array_equal(estimate("grpo", rewards).advantages, 0.0)


@pytest.mark.parametrize("name", ["dr_grpo", "gdpo"])
def test_clip_bounds(name):
    rewards, mask = random_case(13)
    rewards = rewards * 10
    unclipped = estimate(name, rewards, mask)
    clipped = estimate(name, rewards, mask, clip=0.5)
    assert float(jnp.abs(clipped.advantages).max()) <= 0.5
    assert float(jnp.abs(unclipped.advantages).max()) > 0.5  # the bound really bites
    np.testing.assert_allclose(clipped.advantages, np.clip(unclipped.advantages, -0.5, 0.5), atol=1e-6)
    chex.assert_trees_all_equal(estimate(name, rewards, mask, clip=0), unclipped)  # 0 means off


def test_gdpo_separates_reward_mixes_that_grpo_merges():
    # Two groups whose weighted sums are identical ([1, 1, 0, 0] with weights (1, 1)), so grpo on the
    # sum cannot tell them apart. In group 0 the two successes are on different components, each rare
    # (1 of 4): gdpo normalises each component on its own, and rare successes get larger advantages.
    # In group 1 both successes are on component 0 (2 of 4) and component 1 never fires (no signal).
    rewards = jnp.array([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
                         [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    weights = (1.0, 1.0)
    grpo_adv = estimate("grpo", rewards, reward_weights=weights).advantages
    np.testing.assert_allclose(grpo_adv[0], grpo_adv[1])
    gdpo_adv = estimate("gdpo", rewards, reward_weights=weights).advantages
    # Component [1, 0, 0, 0]: mean 1/4, std sqrt(3)/4, so a success gets +sqrt(3) and a miss -1/sqrt(3).
    np.testing.assert_allclose(gdpo_adv[0], np.array([1, 1, -1, -1]) * (math.sqrt(3) - 1 / math.sqrt(3)),
                               rtol=1e-4)
    np.testing.assert_allclose(gdpo_adv[1], [1.0, 1.0, -1.0, -1.0], rtol=1e-4)
    assert not np.allclose(gdpo_adv[0], gdpo_adv[1], atol=0.1)


def test_gdpo_without_weights_is_grpo():
    rewards, mask = random_case(14)
    chex.assert_trees_all_close(estimate("gdpo", rewards, mask), estimate("grpo", rewards, mask))


# ---- errors and the registry -----------------------------------------------------------------------

def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="'nope'") as info:
        get("nope")
    for name in DEFAULT_SCALE:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="'nope'"):
        group_advantages("nope", jnp.zeros((2, 3)))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="agent axis"):
        group_advantages("per_agent", jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="2 reward_weights but rewards have 3"):
        group_advantages("grpo", jnp.zeros((2, 3, 3)), reward_weights=(1.0, 1.0))
    with pytest.raises(ValueError, match="scale"):
        group_advantages("grpo", jnp.zeros((2, 3)), scale="global")
    with pytest.raises(ValueError, match="already registered"):
        register("grpo")(lambda rewards, valid, opts: rewards)


def test_register_adds_a_working_estimator():
    assert "test_max_baseline" not in ESTIMATORS
    try:
        @register("test_max_baseline", default_scale="none")
        def max_baseline(rewards, valid, opts):  # advantage = r - best valid reward of the group
            best = jnp.max(jnp.where(valid, rewards, -jnp.inf), axis=1, keepdims=True)
            return rewards - best

        rewards = jnp.array([[1.0, 4.0, 2.0], [5.0, 3.0, 9.0]])
        mask = jnp.array([[True, True, True], [True, True, False]])
        out = jax.jit(get("test_max_baseline"), static_argnames="clip")(rewards, mask, clip=2.5)
        np.testing.assert_allclose(out.advantages, [[-2.5, 0.0, -2.0], [0.0, -2.0, 0.0]])
        np.testing.assert_array_equal(out.weight, mask)
        assert isinstance(out, GroupAdvantages)

        # Cores receive padded rewards as 0, so even an unmasked group sum ignores the padding.
        register("test_group_sum", default_scale="none")(
            lambda rewards, valid, opts: jnp.broadcast_to(rewards.sum(1, keepdims=True), rewards.shape))
        out = group_advantages("test_group_sum", rewards.at[1, 2].set(jnp.nan), mask)
        np.testing.assert_allclose(out.advantages, [[7.0, 7.0, 7.0], [8.0, 8.0, 0.0]])
    finally:
        ESTIMATORS.pop("test_max_baseline", None)
        ESTIMATORS.pop("test_group_sum", None)
    assert "test_max_baseline" not in ESTIMATORS and "test_group_sum" not in ESTIMATORS


# ---- time steps -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [("grpo", {}), ("median", {}), ("per_agent", {}),
                                          ("gdpo", {"reward_weights": (1.0, 0.5)})])
def test_stepwise_equals_looping_over_time(name, options):
    rng = np.random.default_rng(15)
    T = 4
    k = (2,) if options else ()
    returns = rng.normal(size=(B, G, T, A) + k).astype(np.float32)
    mask = rng.random((B, G, T)) < 0.75  # per sample and step, shared by the agents
    out = jax.jit(functools.partial(stepwise_group_advantages, name, **options))(returns, mask)
    chex.assert_shape([out.advantages, out.weight], (B, G, T, A))
    chex.assert_shape(out.zero_variance, (B, T))
    for t in range(T):
        step = estimate(name, returns[:, :, t], mask[:, :, t], **options)
        np.testing.assert_allclose(out.advantages[:, :, t], step.advantages, atol=1e-6)
        np.testing.assert_array_equal(out.weight[:, :, t], step.weight)
        np.testing.assert_array_equal(out.zero_variance[:, t], step.zero_variance)


def test_returns_to_go_matches_python_loop():
    rng = np.random.default_rng(16)
    T, N, gamma = 7, 5, 0.9
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    lengths = np.array([0, 1, 3, 6, 7])  # episode of each column ends after `length` steps
    alive = np.arange(T)[:, None] < lengths[None, :]
    out = jax.jit(returns_to_go, static_argnums=2)(rewards, alive, gamma)
    expected = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            expected[t, n] = sum(gamma ** (k - t) * rewards[k, n] * alive[k, n] for k in range(t, T))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[~alive], 0.0)


def test_bnpo_fits_a_beta_to_the_pass_rates_and_divides_by_its_density():
    """BNPO by hand: pass rates 1/4, 1/2, 3/4, 1/2 have mean 1/2 and variance 1/32, so the moment fit is
    Beta(3.5, 3.5) (k = m (1 - m) / v - 1 = 7) and the normalising Beta has a = b = 1 + 3.5 / 3; each advantage is
    (r - p) / pdf(p; a, b). Two binary components are normalised apart and weighted (the decomposition)."""
    correct = np.float32([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 0, 1]])
    formed = np.float32([[1, 1, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    alpha, beta = adv_lib.beta_fit(jnp.float32([0.25, 0.5, 0.75, 0.5]), jnp.ones(4, bool))
    np.testing.assert_allclose([alpha, beta], [3.5, 3.5], rtol=1e-4)

    def by_hand(r):
        p = r.mean(1, keepdims=True)
        m, v = p.mean(), p.var()
        k = m * (1 - m) / v - 1
        a, b = 1 + m * k / 3, 1 + (1 - m) * k / 3
        pc = np.clip(p, 1e-6, 1 - 1e-6)
        pdf = pc ** (a - 1) * (1 - pc) ** (b - 1) * math.gamma(a + b) / (math.gamma(a) * math.gamma(b))
        return (r - p) / pdf

    out = estimate("bnpo", np.stack([correct, formed], -1), reward_weights=(1.0, 0.1))
    np.testing.assert_allclose(out.advantages, by_hand(correct) + 0.1 * by_hand(formed), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(by_hand(formed)[3], 0.0)  # a component its group agrees on adds nothing


def test_beta_normalisation_spans_reinforce_and_grpo():
    """The abstract's claim for binary rewards: Beta(1, 1) gives REINFORCE with the group-mean baseline, Beta(3/2,
    3/2) GRPO's advantage up to the constant B(3/2, 3/2) = pi / 8."""
    rewards, mask = jnp.float32([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]]), jnp.ones((3, 4), bool)
    p = rewards.mean(1, keepdims=True)
    np.testing.assert_allclose(adv_lib.beta_normalised(rewards, mask, 1.0, 1.0), rewards - p, atol=1e-6)
    np.testing.assert_allclose(adv_lib.beta_normalised(rewards, mask, 1.5, 1.5), estimate("grpo", rewards).advantages
                               * math.pi / 8, rtol=1e-4, atol=1e-6)


def test_stratified_normalises_within_each_stratum_and_blends_with_the_group():
    """Stratified GRPO's SAN by hand: rewards (1, 0, 1 | 1, 0, 0) in strata (0, 0, 0 | 1, 1, 1): stratum 0 has mean
    2/3 and std sqrt(2)/3, stratum 1 mean 1/3 and the same std; the group mean 1/2, std 1/2. A lone member of its
    stratum gets no within-stratum advantage."""
    rewards = jnp.asarray([[1.0, 0.0, 1.0, 1.0, 0.0, 0.0]])
    strata = jnp.asarray([[0, 0, 0, 1, 1, 1]])
    s = math.sqrt(2) / 3
    within = np.array([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3]) / (s + EPS)
    group = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0]) * 0.5 / (0.5 + EPS)
    for w in (0.0, 0.3, 1.0):
        out = get("stratified")(rewards, strata=strata, stratum_weight=w)
        np.testing.assert_allclose(out.advantages[0], w * within + (1 - w) * group, rtol=1e-4, atol=1e-5)
    alone = get("stratified")(rewards, strata=jnp.asarray([[0, 0, 0, 1, 1, 2]]), stratum_weight=1.0)
    assert float(alone.advantages[0, 5]) == 0.0
    with pytest.raises(ValueError, match="reads `strata`: pass it"):
        get("stratified")(rewards)


def test_hint_posterior_judges_each_member_against_the_members_of_its_hint_condition():
    """ADHint's advantage with rollout difficulty posterior by hand: rewards (1, 1 | 1, 0), the first two hinted.
    The hinted members' mean is 1 (difficulty posterior 0), the unhinted ones' 1/2; the group's std is
    sqrt(3/4 x 1/4) = sqrt(3)/4. A = (0, 0 | 1/2, -1/2) / (sqrt(3)/4) = (0, 0, 2/sqrt(3), -2/sqrt(3)), where GRPO would
    credit the easy hinted successes (1/4 / (sqrt(3)/4) each) and punish the unhinted failure by 3/sqrt(3). A group
    of one condition gets GRPO's advantage."""
    rewards = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    out = get("hint_posterior")(rewards, hinted=jnp.asarray([[True, True, False, False]]), eps=0.0)
    np.testing.assert_allclose(out.advantages[0], [0.0, 0.0, 2 / math.sqrt(3), -2 / math.sqrt(3)], rtol=1e-5,
                               atol=1e-6)
    one = get("hint_posterior")(rewards, hinted=jnp.zeros((1, 4), bool), eps=0.0)
    np.testing.assert_allclose(one.advantages[0], [1 / math.sqrt(3)] * 3 + [-3 / math.sqrt(3)], rtol=1e-5)


def test_module_exports():
    for name in ("GroupAdvantages", "ESTIMATORS", "register", "get", "group_advantages",
                 "stepwise_group_advantages", "returns_to_go", "gae"):
        assert hasattr(adv_lib, name)


def test_expert_iteration_is_sft_on_the_samples_that_reach_the_best_reward():
    """Expert iteration: advantage 1 on successes, no gradient elsewhere; with token aggregation and the sampling
    policy's log-probabilities as the old ones, the policy loss's gradient is SFT's (mean -log pi over the
    successes' tokens)."""
    from jaxrl import losses

    rewards = np.array([[1.1, 0.1, 0.0, 1.1], [0.1, 0.1, 0.0, 0.0]], np.float32)  # correct + 0.1 well-formed
    out = estimate("expert_iteration", rewards)
    np.testing.assert_array_equal(out.advantages, [[1, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(out.weight, [[1, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(estimate("expert_iteration", rewards, max_reward=0.1).weight,
                                  [[1, 1, 0, 1], [1, 1, 0, 0]])
    log_probs = jnp.log(jnp.asarray(np.random.default_rng(0).uniform(0.1, 0.9, (8, 3)), jnp.float32))
    mask = jnp.asarray(np.random.default_rng(1).random((8, 3)) < 0.8, jnp.float32).at[:, 0].set(1.0)
    weight = out.weight.reshape(-1)[:, None] * mask
    advantage = jnp.broadcast_to(out.advantages.reshape(-1)[:, None], (8, 3))
    rl = jax.grad(lambda lp: losses.policy_loss(lp, jax.lax.stop_gradient(lp), advantage, weight, clip_low=0.2)[0])
    sft = jax.grad(lambda lp: -jnp.sum(lp * weight) / jnp.sum(weight))
    np.testing.assert_allclose(rl(log_probs), sft(log_probs), rtol=1e-6)


def test_tracked_compares_each_sample_with_its_problems_tracked_value_and_scales_by_the_batch():
    """SPO: A = r - v(problem), divided by the std of the batch's advantages; one sample per prompt suffices."""
    rewards = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    baseline = np.array([0.5, 0.75], np.float32)
    tracked = get("tracked")
    np.testing.assert_allclose(tracked(rewards, baseline=baseline, scale="none").advantages,
                               [[0.5, -0.5], [0.25, 0.25]])
    centered = np.array([0.5, -0.5, 0.25, 0.25])
    np.testing.assert_allclose(tracked(rewards, baseline=baseline).advantages.reshape(-1),
                               centered / (centered.std() + EPS), rtol=1e-5)
    single = tracked(rewards[:, :1], baseline=baseline, scale="none")  # G = 1
    np.testing.assert_allclose(single.advantages, [[0.5], [0.25]])
    with pytest.raises(ValueError, match="reads `baseline`: pass it"):
        tracked(rewards)


def test_fused_shrinks_the_group_mean_towards_an_accepted_value_prior_only():
    """V_0.5: group 0 (mean 0.25, prior 0.3, standard error sqrt(0.3 0.7 / 4) = 0.23) and group 2 (mean 0.75, prior
    0.9, s.e. 0.15) accept the prior as 4 samples: baselines (4 0.25 + 4 0.3) / 8 = 0.275 and (3 + 3.6) / 8 = 0.825;
    group 1 (mean 1, prior 0.2, s.e. 0.2: 0.8 > 1.96 x 0.2) rejects it: the baseline is its mean."""
    rewards = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
    prior = np.array([0.3, 0.2, 0.9], np.float32)
    fused = get("fused")
    out = fused(rewards, prior=prior, scale="none", prior_weight=4.0, prior_z=1.96)
    np.testing.assert_allclose(out.advantages, [[0.725, -0.275, -0.275, -0.275], [0, 0, 0, 0],
                                                [0.175, 0.175, 0.175, -0.825]], rtol=1e-5, atol=1e-6)
    # A prior below the rewards' range counts as 0: an all-wrong group accepts it, and its baseline is 0, not -0.025
    # (which would push every wrong answer up)
    below = fused(np.zeros((1, 4), np.float32), prior=np.array([-0.05], np.float32), scale="none")
    np.testing.assert_array_equal(below.advantages, 0.0)
    plain = fused(rewards, prior=prior, scale="none", prior_weight=0.0)  # no weight: GRPO's centring
    np.testing.assert_allclose(plain.advantages, rewards - rewards.mean(1, keepdims=True), atol=1e-6)


# --- BroRL ("Scaling RL via Broadened Exploration"): many rollouts per prompt on a one-step softmax policy ----------

BANDIT_VOCAB, BANDIT_CORRECT = 16, 4  # tokens 0..3 are correct


def _bandit_mass(logits: jax.Array) -> jax.Array:
    """P = the probability of the correct tokens under softmax(logits [V])."""
    return jnp.sum(jax.nn.softmax(logits)[:BANDIT_CORRECT])


def _bandit_step(logits: jax.Array, key: jax.Array, num: int, lr: float):
    """One gradient step of jaxrl's GRPO on `num` one-token completions drawn from softmax(logits): the group
    advantages of `group_advantages("grpo")` and the gradient of `losses.policy_loss` (on-policy: ratio 1), taken on
    the logits themselves. -> (new logits [V], the group's rewards [num])."""
    from jaxrl import losses

    tokens = jax.random.categorical(key, logits, shape=(num,))
    rewards = (tokens < BANDIT_CORRECT).astype(jnp.float32)
    group = group_advantages("grpo", rewards[None])

    def loss(logits):
        log_p = jax.nn.log_softmax(logits)[tokens][:, None]  # [num, 1]: one-token completions
        return losses.policy_loss(log_p, jax.lax.stop_gradient(log_p), group.advantages[0][:, None],
                                  jnp.ones_like(log_p), clip_low=0.2, clip_high=0.28)[0]

    return logits - lr * jax.grad(loss)(logits), rewards


def _expected_ascent(logits: jax.Array) -> jax.Array:
    """The closed-form expected GRPO ascent direction g [V] (derived in the BroRL test's docstring)."""
    pi = jax.nn.softmax(logits)
    r = (jnp.arange(BANDIT_VOCAB) < BANDIT_CORRECT).astype(jnp.float32)
    p = jnp.sum(pi * r)
    return pi * (r - p) / jnp.sqrt(p * (1 - p))


def test_broad_rollouts_always_expand_the_correct_mass_of_a_one_step_softmax_policy():
    """BroRL's mass balance on a softmax bandit: logits z [16] ~ N(0, 1), pi = softmax(z), tokens 0-3 correct,
    P = sum_{k<4} pi_k, sigma = sqrt(P (1 - P)). A group of N one-token completions y_i ~ pi with rewards
    r_i = [y_i < 4] gets GRPO's advantages A_i = (r_i - rbar) / (s + eps) (rbar, s the group's mean and std); at ratio
    1 the clipped surrogate's gradient is that of -(1/N) sum_i A_i log pi(y_i), and d log pi(y) / dz = e_y - pi, so
    the ascent direction is (1/N) sum_i A_i (e_{y_i} - pi) = sum_k (n_k / N) A(k) e_k, since sum_i A_i = 0 (n_k: draws
    of token k). Its expectation as N grows (n_k / N -> pi_k, rbar -> P, s -> sigma) is g_k = pi_k (r_k - P) / sigma,
    and since dP / dz_j = pi_j (r_j - P), a step z + lr g changes P by lr sum_j pi_j^2 (r_j - P)^2 / sigma > 0 to
    first order: the expected update always expands the correct mass.

    A sampled step changes P to first order by lr sum_j pi_j (r_j - P) (n_j / N) (r_j - rbar) / s, every term >= 0
    when 0 < rbar < 1 (r_j = 1: (1 - P)(1 - rbar); r_j = 0: P rbar). So with GRPO's group-mean baseline no sampled
    token shrinks the correct mass (the unsampled tokens, BroRL's shrinking term, get no push: the advantages sum to
    zero); a group only fails to expand it when its rewards tie (rbar = 0 or 1, probability P^N + (1 - P)^N), which
    many rollouts make vanishingly rare. Asserted over 20 fixed random policies at lr = 1: N = 512 raises P in all
    20; N = 4 raises it in exactly the trials whose group does not tie and lowers it in none; the exact expected step
    raises it in all 20, by the first-order amount for a small step; and the mean of jaxrl's sampled ascent over 256
    groups of 512 is the closed form g."""
    # Jitted once, with NumPy in between: eager (even vmapped) calls compile each primitive separately.
    mass_program = jax.jit(jax.vmap(_bandit_mass))
    masses = lambda logits: np.asarray(mass_program(logits))  # noqa: E731
    steps = jax.jit(jax.vmap(_bandit_step, in_axes=(0, 0, None, None)), static_argnums=(2, 3))
    trials = jax.random.split(jax.random.key(0), 20)
    logits, step_keys = jax.jit(jax.vmap(lambda k: (jax.random.normal(jax.random.fold_in(k, 0), (BANDIT_VOCAB,)),
                                                    jax.random.fold_in(k, 1))))(trials)
    logits = np.asarray(logits)
    before = masses(logits)
    for num in (512, 4):
        stepped, rewards = steps(logits, step_keys, num, 1.0)
        change = masses(stepped) - before
        tied = np.all(np.asarray(rewards) == np.asarray(rewards)[:, :1], axis=1)
        assert not np.any(change < 0), (num, change)
        np.testing.assert_array_equal(change > 0, ~tied)
        assert num == 4 or not tied.any()  # N = 512: 20 / 20 raised
    assert 0 < int(tied.sum()) < 20  # (N = 4 ties in some trials: the contrast is real)
    expected = np.asarray(jax.jit(jax.vmap(_expected_ascent))(logits))
    assert np.all(masses(logits + expected) - before > 0)
    # The first-order reference in NumPy.
    pi = np.exp(logits - logits.max(axis=1, keepdims=True))
    pi /= pi.sum(axis=1, keepdims=True)
    sigma = np.sqrt(before * (1 - before))
    r = (np.arange(BANDIT_VOCAB) < BANDIT_CORRECT).astype(np.float32)
    first_order = np.sum(pi ** 2 * (r - before[:, None]) ** 2, axis=1) / sigma
    small = (masses(logits + 1e-3 * expected) - before) / 1e-3
    np.testing.assert_allclose(small, first_order, rtol=2e-2)
    # The closed form is the sampled update's mean: 256 groups of 512 on trial 0's policy.
    keys = jax.random.split(jax.random.key(1), 256)
    sampled = jax.jit(jax.vmap(lambda k: _bandit_step(logits[0], k, 512, 1.0)[0] - logits[0]))(keys)
    np.testing.assert_allclose(sampled.mean(0), expected[0], atol=1e-2)


def test_merged_groups_pool_the_groups_of_one_problem_and_leave_the_others_alone():
    """Groups 0 and 2 answer problem 5, group 1 problem 2, group 3 a fresh problem (-1, a group of its own). Pooled,
    problem 5's members are 1, 0, 0, 0, 1, 1 (mean 1/2, std 1/2, n = 6): grpo (r - 1/2) / (1/2 + eps) = +-1; rloo
    n / (n - 1) (r - 1/2) = +-0.6; dr_grpo r - 1/2. Groups 1 and 3 get their own group's advantages."""
    rewards = np.asarray([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    ids = np.asarray([5, 2, 5, -1], np.int32)
    pooled = np.asarray([[1.0, -1.0, -1.0], [-1.0, 1.0, 1.0]])  # groups 0 and 2, in units of |r - mean|
    units = {"grpo": 0.5 / (0.5 + EPS), "rloo": 0.6, "dr_grpo": 0.5}

    @jax.jit  # every case in one program: eager calls compile each primitive separately
    def cases(rewards, ids):
        components = jnp.stack([rewards, jnp.ones_like(rewards)], -1)
        return ({name: (adv_lib.merged_by_problem(get(name), rewards, ids), get(name)(rewards[np.asarray([1, 3])]))
                 for name in units},
                adv_lib.merged_by_problem(get("grpo"), components, ids, reward_weights=(1.0, 0.1)))

    by_name, weighted = jax.device_get(cases(rewards, ids))
    for name, (out, alone) in by_name.items():
        np.testing.assert_allclose(out.advantages[[0, 2]], units[name] * pooled, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(out.advantages[[1, 3]], alone.advantages, rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(out.weight, np.ones((4, 3)))
    # Two components weighted 1 and 0.1 pool as their weighted sum does.
    np.testing.assert_allclose(weighted.advantages[0], pooled[0], atol=1e-5)


def test_merged_groups_test_the_value_prior_against_the_pooled_mean():
    """fused (V_0.5) merged: problem 7's groups [1, 0] and [0, 0] pool to m = 1/4 over n = 4 against the prior
    V = 1/4 of both (one prompt): accepted, it counts as prior_weight = 4 samples, b = (4/4 + 4/4) / 8 = 1/4, so
    advantages 3/4, -1/4 | -1/4, -1/4. Unmerged, the second group alone (m = 0, n = 2, bound 1.96 sqrt(3/16 / 2) =
    0.6) also accepts: b = (0 + 1) / 6, advantages -1/6: the pooled baseline differs."""
    rewards, prior = jnp.asarray([[1.0, 0.0], [0.0, 0.0]]), jnp.full(2, 0.25)
    options = dict(prior=prior, max_reward=1.0, prior_weight=4.0, prior_z=1.96)
    out = adv_lib.merged_by_problem(get("fused"), rewards, jnp.asarray([7, 7]), **options)
    np.testing.assert_allclose(out.advantages, [[0.75, -0.25], [-0.25, -0.25]], atol=1e-6)
    np.testing.assert_allclose(get("fused")(rewards, **options).advantages[1], [-1 / 6, -1 / 6], atol=1e-6)


MERGED_OVER_DEVICES = """
import functools, json
import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxrl import advantages, mesh as mesh_lib
rewards = jax.random.bernoulli(jax.random.key(0), 0.4, (8, 4)).astype(jnp.float32)
ids = jnp.asarray([3, 1, 7, 3, 1, 9, 3, -1])  # problem 3 on devices 0, 1 and 3 of 4; problem 1 on devices 0 and 2
out = []
for devices in (1, 4):
    fn = functools.partial(advantages.merged_by_problem, advantages.get("grpo"), over_devices=True)
    run = jax.jit(jax.shard_map(fn, mesh=mesh_lib.make_mesh(devices), in_specs=P("data"), out_specs=P("data"),
                                check_vma=False))
    out.append(run(rewards, ids).advantages.tolist())
alone = advantages.merged_by_problem(advantages.get("grpo"), rewards, ids).advantages.tolist()
print(json.dumps({"one": out[0], "four": out[1], "alone": alone}))
"""


def test_merged_groups_pool_across_devices_as_on_one(python_subprocess):
    import json
    out = python_subprocess(MERGED_OVER_DEVICES, devices=4)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(result["four"], result["alone"], rtol=1e-6)
    np.testing.assert_allclose(result["one"], result["alone"], rtol=1e-6)


def test_weighted_grpo_amplifies_the_rare_success_of_a_hard_prompt_and_the_rare_failure_of_an_easy_one():
    """Weighted GRPO by hand on binary rewards, G = 8. q+ (1 of 8 correct): p = 1/8, GRPO gives the success
    (1 - p) / sqrt(p (1 - p)) = sqrt(7) and each failure -p / sqrt(p (1 - p)) = -1/sqrt(7); the success is
    outnumbered 7 to 1, so its weight is min(7, cap), the failures keep 1. q- (7 of 8 correct) mirrors it: the lone
    failure -sqrt(7) x min(7, cap), the successes 1/sqrt(7)."""
    rewards = np.array([[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 1, 1, 1, 1]], np.float32)
    s7 = math.sqrt(7.0)
    for cap, w in ((10.0, 7.0), (4.0, 4.0)):
        out = estimate("weighted_grpo", rewards, rare_weight_max=cap)
        expected = np.array([[w * s7] + [-1 / s7] * 7, [1 / s7] * 3 + [-w * s7] + [1 / s7] * 4])
        np.testing.assert_allclose(out.advantages, expected, rtol=1e-4)
    # net push: towards the rare success on q+ (sum > 0), away from the rare failure on q- (sum < 0); GRPO's sums to 0
    sums = np.asarray(estimate("weighted_grpo", rewards).advantages).sum(1)
    np.testing.assert_allclose(sums, [4 * s7 - 7 / s7, 7 / s7 - 4 * s7], rtol=1e-4)


def test_weighted_grpo_is_grpo_on_balanced_or_tied_groups_and_reads_success_at_max_reward():
    """p = 1/2: both weights are 1 (GRPO's +-1); a tied group stays 0; an all-correct group whose well-formedness
    differs ([1.1, 1.0, 1.1, 1.0]: p = 1) weighs 1, GRPO's +-1. Success is r >= max_reward: with text's
    (1, 0.1) weights a correct well-formed answer scores 1.1 (a success), a well-formed wrong one 0.1 (a failure):
    rewards [1.1, 0.1, 0.1, 0.1] under scale none centre on 0.35 (GRPO: [0.75, -0.25 x 3]) and the lone success
    weighs 3 (three failures to one)."""
    balanced = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    np.testing.assert_allclose(estimate("weighted_grpo", balanced).advantages, [[1, 1, -1, -1], [0, 0, 0, 0]],
                               rtol=1e-4)
    all_correct = np.array([[1.1, 1.0, 1.1, 1.0]], np.float32)
    np.testing.assert_allclose(estimate("weighted_grpo", all_correct).advantages, [[1, -1, 1, -1]], rtol=1e-4)
    shaped = np.array([[1.1, 0.1, 0.1, 0.1]], np.float32)
    np.testing.assert_allclose(estimate("weighted_grpo", shaped, scale="none").advantages,
                               [[3 * 0.75, -0.25, -0.25, -0.25]], rtol=1e-5)


# ---- POISE's cross-rollout baseline ("Your Language Model is Its Own Critic") -----------------------------------

def test_cross_rollout_baseline_is_another_members_mean_value_by_hand():
    """Each member's baseline is the value head's mean over the NEXT member's completion tokens (cyclically), and
    its advantage is its reward less that, on every real token."""
    values = jnp.asarray([[[0.2, 0.4, 9.0], [0.8, 0.6, 0.7]]])  # member 0's third column is padding
    mask = jnp.asarray([[[1, 1, 0], [1, 1, 1]]], jnp.float32)
    # pooled: member 0 (0.2 + 0.4) / 2 = 0.3, member 1 (0.8 + 0.6 + 0.7) / 3 = 0.7 -> baselines swapped
    np.testing.assert_allclose(adv_lib.cross_rollout_baseline(values, mask), [[0.7, 0.3]], rtol=1e-6)
    advantages = adv_lib.cross_rollout_advantages(jnp.asarray([[1.0, 0.0]]), values, mask)
    np.testing.assert_allclose(advantages, [[[0.3, 0.3, 0.0], [-0.3, -0.3, -0.3]]], rtol=1e-6)
    three = jnp.asarray([[0.1, 0.5, 0.9]])[..., None]  # G = 3, one token each: member g takes member (g + 1) mod 3's
    np.testing.assert_allclose(adv_lib.cross_rollout_baseline(three, jnp.ones_like(three)), [[0.5, 0.9, 0.1]])


def test_cross_rollout_baseline_never_reads_the_members_own_states():
    """d baseline[g] / d values[g] = 0: the baseline a member's advantage subtracts holds none of its own tokens."""
    values = jax.random.normal(jax.random.key(0), (2, 3, 4))
    mask = jnp.ones((2, 3, 4))
    jacobian = jax.jacobian(lambda v: adv_lib.cross_rollout_baseline(v, mask))(values)  # [2, 3, 2, 3, 4]
    own = jnp.einsum("bgbgn->bgn", jacobian)
    np.testing.assert_array_equal(own, 0.0)
    assert float(jnp.abs(jacobian).sum()) > 0


def test_cross_rollout_keeps_the_policy_gradient_unbiased_where_the_own_value_does_not():
    """The abstract's argument, worked exactly: a Bernoulli policy p = sigmoid(theta) = 0.3 answers y in {0, 1}, reward
    r = y, and a probe that reads the trajectory perfectly, v(y) = y. The true gradient d E[r] / d theta =
    p (1 - p) = 0.21. REINFORCE with the member's own trajectory-conditioned value, E[(y - p)(r - v(y))] = 0: biased.
    With G = 2 independent members and the other's value, E[(y0 - p)(y0 - y1)] = p (1 - p) - E[y0 - p] E[y1] = 0.21."""
    p = 0.3
    pairs = np.asarray([(y0, y1) for y0 in (0.0, 1.0) for y1 in (0.0, 1.0)])  # [4, 2]: every outcome of the 2 members
    chance = np.prod(np.where(pairs == 1, p, 1 - p), axis=1)  # [4]
    values, mask = jnp.asarray(pairs)[..., None], jnp.ones((4, 2, 1))  # v(y) = y, one token each
    cross = np.asarray(adv_lib.cross_rollout_advantages(jnp.asarray(pairs), values, mask))[:, 0, 0]  # member 0's
    score = pairs[:, 0] - p  # d log pi(y0) / d theta
    assert np.isclose(np.sum(chance * score * cross), 0.21)
    own = pairs[:, 0] - pairs[:, 0]  # r - v(y) of its own trajectory
    assert np.isclose(np.sum(chance * score * own), 0.0)
