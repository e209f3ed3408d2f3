"""SMAX battles: rules (movement, attacks, cooldowns, walls, rewards, masks), API shapes and wrappers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.smax import SMAX, Scenario, register_scenario, scenario_names, team
from envs.smax.env import push_apart
from envs.smax.heuristic import heuristic_targets, pick_true, sample_true
from envs.smax.parity import random_legal

N, E, S, W, STOP = 0, 1, 2, 3, 4
MARINE_STEP = 3.15 * 8 / 16  # a marine's move in one agent step (8 ticks of 1/16 s)
FAR_ENEMIES = [(28.0, 4.0), (28.0, 16.0), (28.0, 28.0)]  # out of every ally's sight below


@functools.lru_cache(maxsize=None)
def make(scenario="3m", **overrides):
    return envs.make("smax", scenario=scenario, **overrides)


@functools.lru_cache(maxsize=None)
def jitted_step(env):
    return jax.jit(env.step)


@functools.lru_cache(maxsize=None)
def jitted_reset(env):
    return jax.jit(env.reset)


def battle(env, positions, health=None, cooldown=None):
    """A state of `env` with units at `positions` [U, 2]; `health` defaults to full, `cooldown` to 0."""
    _, state = jitted_reset(env)(jax.random.PRNGKey(0))
    position = jnp.array(positions, jnp.float32)
    state = state.replace(position=position, enemy_home=32.0 - position[env.num_allies:])
    if health is not None:
        state = state.replace(health=jnp.array(health, jnp.float32))
    if cooldown is not None:
        state = state.replace(cooldown=jnp.array(cooldown, jnp.float32))
    return state


def step(env, state, actions, key=1, params=None):
    return jitted_step(env)(jax.random.PRNGKey(key), state, jnp.array(actions, jnp.int32), params)


# ------------------------------------------------------------------------------------------------
# Registry, sizes, spaces


@pytest.mark.parametrize("name", scenario_names())
def test_sizes_per_scenario(name):
    env = make(name)
    units = env.num_allies + env.num_enemies
    assert env.num_agents == env.num_allies and env.num_actions == 5 + env.num_enemies
    assert env.obs_dim == 13 * (units - 1) + 10 and env.state_dim == 12 * units
    assert env.has_action_masks and env.max_episode_steps == 100
    obs, state = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
    assert obs.shape == (env.num_agents, env.obs_dim) and obs.dtype == jnp.float32
    assert jax.eval_shape(env.global_state, state).shape == (env.state_dim,)
    assert jax.eval_shape(env.avail_actions, state).shape == (env.num_agents, env.num_actions)
    out = jax.eval_shape(env.step, jax.random.PRNGKey(0), state, jnp.zeros(env.num_agents, jnp.int32))
    _, _, reward, done, info = out
    assert reward.shape == (env.num_agents,) and reward.dtype == jnp.float32
    assert done.shape == (env.num_agents,) and done.dtype == jnp.bool_
    assert {k: v.shape for k, v in info.items()} == {"won": (), "episode_over": (), "terminated": (), "truncated": ()}


def test_unknown_scenario_lists_known_ones():
    with pytest.raises(ValueError, match="unknown SMAX scenario '4m'.*3m.*27m_vs_30m.*smacv2_20_units"):
        envs.make("smax", scenario="4m")


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError, match="unknown SMAX option"):
        envs.make("smax", scenario="3m", wall_deaths=False)


def test_custom_scenario_with_its_own_start_rule():
    def corners(key, num_allies, num_enemies, width, height):
        return jnp.array([[4.0, 4.0], [4.0, 8.0], [28.0, 28.0], [28.0, 24.0], [24.0, 28.0]])

    register_scenario("test_2M_vs_3z", Scenario(team(marauder=2), team(zergling=3), start=corners))
    with pytest.raises(ValueError, match="already registered"):
        register_scenario("test_2M_vs_3z", Scenario(["marine"], ["marine"]))
    env = envs.make("smax", scenario="test_2M_vs_3z")
    assert (env.num_agents, env.num_actions, env.obs_dim) == (2, 8, 13 * 4 + 10)
    obs, state = jitted_reset(env)(jax.random.PRNGKey(0))
    np.testing.assert_allclose(state.position, corners(None, 2, 3, 32, 32))
    assert state.unit_type.tolist() == [1, 1, 4, 4, 4]
    np.testing.assert_allclose(state.health, [125, 125, 35, 35, 35])
    # A Scenario object may also be passed directly.
    assert SMAX(Scenario(["s", "s"], ["zealot"])).num_actions == 6


def test_bad_scenarios_are_rejected():
    with pytest.raises(ValueError, match="at least one ally"):
        Scenario([], ["marine"])
    with pytest.raises(ValueError, match="unknown unit type 'tank'"):
        Scenario(["tank"], ["marine"])
    with pytest.raises(ValueError, match="unknown start rule"):
        Scenario(["marine"], ["marine"], start="circle")


# ------------------------------------------------------------------------------------------------
# Reset


def test_reset_places_teams_on_either_side_and_mirrors_the_enemy_home():
    env = make("3m")
    _, state = jitted_reset(env)(jax.random.PRNGKey(3))
    pos = np.asarray(state.position)
    assert np.all(np.abs(pos[:3] - [8, 16]) <= 2.5) and np.all(np.abs(pos[3:] - [24, 16]) <= 2.5)
    np.testing.assert_allclose(state.enemy_home, 32.0 - pos[3:], atol=1e-5)
    assert state.health.tolist() == [45.0] * 6 and state.enemy_target.tolist() == [-1] * 3


def test_smacv2_draws_random_types_that_the_enemy_mirrors():
    from envs.smax.units import NUM_UNIT_TYPES
    env = make("smacv2_10_units")
    types = np.asarray(jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 8))[1].unit_type)
    np.testing.assert_array_equal(types[:, :10], types[:, 10:])
    assert len(np.unique(types)) > 3, "types vary across episodes"
    # Uniform over the kinds, over 1,024 draws of smacv2_20_units' allies.
    env = make("smacv2_20_units")
    keys = jax.random.split(jax.random.PRNGKey(0), 1024)
    allies = np.asarray(jax.jit(jax.vmap(env.scenario.draw_unit_types))(keys))[:, :20]
    np.testing.assert_allclose(np.bincount(allies.ravel(), minlength=NUM_UNIT_TYPES) / allies.size,
                               1 / NUM_UNIT_TYPES, atol=0.01)


def test_smacv2_starts_are_surrounded_or_reflected_with_equal_odds():
    """Reflected: enemies at the allies' mirror images. Surrounded: one team within +-2 of the centre,
    the other in the 4 diagonal groups. Each about half of 1,024 draws."""
    from envs.smax.scenarios import surround_or_reflect_start
    A = E_ = 5
    keys = jax.random.split(jax.random.PRNGKey(0), 1024)
    pos = np.asarray(jax.jit(jax.vmap(lambda k: surround_or_reflect_start(k, A, E_, 32.0, 32.0)))(keys))
    assert pos.shape == (1024, 10, 2) and np.all((pos >= -2) & (pos <= 34))
    reflected = np.all(np.abs(pos[:, A:, 0] - (32.0 - pos[:, :A, 0])) < 1e-4, axis=1) & np.all(
        np.abs(pos[:, A:, 1] - pos[:, :A, 1]) < 1e-4, axis=1)
    inner = lambda team: np.all(np.abs(team - 16.0) <= 2.0, axis=(1, 2))  # noqa: E731
    surrounded = inner(pos[:, :A]) ^ inner(pos[:, A:])
    assert not np.any(reflected & surrounded) and np.all(reflected | surrounded)
    assert 0.45 < reflected.mean() < 0.55, reflected.mean()
    allies_inside = inner(pos[:, :A])[surrounded]
    assert 0.43 < allies_inside.mean() < 0.57, allies_inside.mean()
    assert np.all(pos[reflected][:, :A, 0] <= 16.0)


# ------------------------------------------------------------------------------------------------
# Movement, attacks, cooldowns, damage, walls


def test_moves_cover_speed_times_time_and_stop_keeps_position():
    env = make("3m")
    start = [(8.0, 16.0), (8.0, 8.0), (8.0, 24.0)] + FAR_ENEMIES
    state = battle(env, start)
    _, nxt, *_ = step(env, state, [N, E, STOP])
    moved = np.asarray(nxt.position[:3]) - np.asarray(start[:3])
    np.testing.assert_allclose(moved, [[0, MARINE_STEP], [MARINE_STEP, 0], [0, 0]], atol=1e-5)
    _, nxt, *_ = step(env, state, [S, W, S])
    moved = np.asarray(nxt.position[:3]) - np.asarray(start[:3])
    np.testing.assert_allclose(moved, [[0, -MARINE_STEP], [-MARINE_STEP, 0], [0, -MARINE_STEP]], atol=1e-5)


def test_attack_needs_the_target_in_range():
    env = make("3m")
    params = env.default_params.replace(enemy_shoots=False)
    others = [(10.0, 4.0), (10.0, 28.0)]
    in_range = battle(env, [(10.0, 16.0)] + others + [(14.9, 16.0), (26.0, 4.0), (26.0, 28.0)])
    assert env.avail_actions(in_range)[0].tolist() == [True] * 5 + [True, False, False]
    _, nxt, reward, *_ = step(env, in_range, [5, STOP, STOP], params=params)
    assert float(nxt.health[3]) == 36.0 and float(reward[0]) == pytest.approx(9 / 45 / 3)
    assert int(nxt.last_attack[0]) == 5

    out_of_range = battle(env, [(10.0, 16.0)] + others + [(15.1, 16.0), (26.0, 4.0), (26.0, 28.0)])
    assert not env.avail_actions(out_of_range)[0, 5]
    _, nxt, reward, *_ = step(env, out_of_range, [5, STOP, STOP], params=params)
    assert float(nxt.health[3]) == 45.0 and float(reward[0]) == 0.0
    np.testing.assert_allclose(nxt.position[0], [10.0, 16.0])  # the masked attack acted as stop


def test_weapon_cooldown_gates_attacks_and_resets_with_jitter():
    env = make("3m")
    params = env.default_params.replace(enemy_shoots=False)
    pos = [(10.0, 16.0), (10.0, 4.0), (10.0, 28.0), (14.0, 16.0), (26.0, 4.0), (26.0, 28.0)]
    dt = 1 / 16
    # Cooling down for the whole step (8 ticks): no shot, cooldown falls by 8 ticks.
    _, nxt, *_ = step(env, battle(env, pos, cooldown=[1.0] + [0.0] * 5), [5, STOP, STOP], params=params)
    assert float(nxt.health[3]) == 45.0 and float(nxt.cooldown[0]) == pytest.approx(1.0 - 8 * dt)
    # Ready on the first tick: one shot, then the type's cooldown plus jitter in [-1, +2] ticks, minus 7 ticks.
    for key in range(5):
        _, nxt, *_ = step(env, battle(env, pos), [5, STOP, STOP], key=key, params=params)
        assert float(nxt.health[3]) == 36.0
        assert 0.61 - dt - 7 * dt - 1e-5 <= float(nxt.cooldown[0]) <= 0.61 + 2 * dt - 7 * dt + 1e-5


def test_damage_from_several_attackers_adds_up_and_the_enemy_hits_the_closest():
    env = make("3m")
    pos = [(10.0, 15.0), (10.5, 16.0), (10.0, 17.0), (14.0, 16.0)] + FAR_ENEMIES[1:]
    state = battle(env, pos, health=[45.0] * 4 + [0.0, 0.0])
    _, nxt, reward, done, info = step(env, state, [5, 5, 5])
    assert float(nxt.health[3]) == 45.0 - 3 * 9
    assert float(reward[0]) == pytest.approx(27 / 45 / 3)
    assert nxt.health[:3].tolist() == [45.0, 36.0, 45.0], "the enemy shot the closest ally"
    assert int(nxt.enemy_target[0]) == 1 and not bool(info["episode_over"])


def test_touching_a_wall_kills_unless_disabled():
    env = make("3m")
    state = battle(env, [(0.5, 16.0), (8.0, 8.0), (8.0, 24.0)] + FAR_ENEMIES)
    _, nxt, _, done, _ = step(env, state, [W, STOP, STOP])
    assert float(nxt.health[0]) == 0.0 and done.tolist() == [True, False, False]
    assert env.avail_actions(nxt)[0].tolist() == [False] * 4 + [True, False, False, False]
    safe = make("3m", walls_cause_death=False)
    _, nxt, _, done, _ = step(safe, state, [W, STOP, STOP])
    assert float(nxt.health[0]) == 45.0 and float(nxt.position[0, 0]) == 0.0 and not done[0]


def test_overlapping_units_are_pushed_apart():
    env = make("3m")
    state = battle(env, [(10.0, 16.0), (10.2, 16.0), (8.0, 24.0)] + FAR_ENEMIES)
    _, nxt, *_ = step(env, state, [STOP, STOP, STOP])
    gap = np.linalg.norm(np.asarray(nxt.position[0] - nxt.position[1]))
    assert 0.7 < gap <= 0.75 + 1e-4  # two marine radii
    assert float(nxt.position[0, 0]) < 10.0 < 10.2 < float(nxt.position[1, 0])


@pytest.mark.parametrize("num_units", [5, 30])  # the fused-reduction path and the matmul path
def test_push_apart_moves_each_unit_by_half_its_overlaps(num_units):
    rng = np.random.default_rng(num_units)
    side = 0.5 * np.sqrt(num_units)  # crowded: many overlaps
    x, y = rng.uniform(10, 10 + side, num_units), rng.uniform(10, 10 + side, num_units)
    alive = rng.uniform(size=num_units) < 0.8
    radius = rng.uniform(0.3, 0.6, num_units)
    radius_sum = radius[:, None] + radius[None, :]
    dx, dy = x[:, None] - x[None, :], y[:, None] - y[None, :]
    dist = np.hypot(dx, dy) + np.eye(num_units)
    overlap = np.where(alive[:, None] & alive[None, :], np.maximum(radius_sum / dist - 1, 0), 0)
    want_x = np.where(alive, x + (dx * overlap).sum(1) / 2, x)
    want_y = np.where(alive, y + (dy * overlap).sum(1) / 2, y)
    x32, y32, radius_sum32 = (jnp.asarray(a, jnp.float32) for a in (x, y, radius_sum))
    got_x, got_y = push_apart(x32, y32, jnp.asarray(alive), radius_sum32)
    assert (overlap > 0).sum() - np.trace(overlap > 0) >= num_units, "the test needs overlapping pairs"
    np.testing.assert_allclose(got_x, want_x, atol=2e-5)
    np.testing.assert_allclose(got_y, want_y, atol=2e-5)


# ------------------------------------------------------------------------------------------------
# Episode ends and rewards


def _duel(env, ally_health, enemy_health):
    """Ally 0 and enemy 0 alone (the rest dead) within range of each other."""
    pos = [(10.0, 16.0), (10.0, 8.0), (10.0, 24.0), (13.0, 16.0)] + FAR_ENEMIES[1:]
    return battle(env, pos, health=[ally_health, 0.0, 0.0, enemy_health, 0.0, 0.0])


def test_win_pays_damage_plus_bonus():
    env = make("3m")
    _, _, reward, done, info = step(env, _duel(env, 45.0, 5.0), [5, STOP, STOP])
    assert float(reward[0]) == pytest.approx(5 / 45 / 3 + 1.0)
    assert np.all(np.asarray(reward) == reward[0]), "the team reward is shared, dead agents included"
    assert bool(info["won"]) and bool(info["terminated"]) and bool(info["episode_over"])
    assert not bool(info["truncated"]) and done.tolist() == [True] * 3


def test_tie_earns_no_bonus():
    env = make("3m")
    _, nxt, reward, _, info = step(env, _duel(env, 9.0, 9.0), [5, STOP, STOP])
    assert not nxt.alive.any()
    assert float(reward[0]) == pytest.approx(9 / 45 / 3)
    assert not bool(info["won"]) and bool(info["terminated"])


def test_loss_earns_nothing():
    env = make("3m")
    _, _, reward, _, info = step(env, _duel(env, 9.0, 45.0), [STOP, STOP, STOP])
    assert float(reward[0]) == 0.0 and not bool(info["won"]) and bool(info["terminated"])


def test_time_limit_truncates():
    env = make("3m")
    params = env.default_params.replace(max_steps=2)
    state = battle(env, [(8.0, 16.0), (8.0, 8.0), (8.0, 24.0)] + FAR_ENEMIES)
    _, state, _, done, info = step(env, state, [STOP] * 3, params=params)
    assert not bool(info["episode_over"])
    _, state, _, done, info = step(env, state, [STOP] * 3, params=params)
    assert bool(info["truncated"]) and not bool(info["terminated"]) and bool(info["episode_over"])
    assert done.tolist() == [True] * 3


# ------------------------------------------------------------------------------------------------
# Masks, observations


def test_masks_follow_life_and_range():
    env = make("3m")
    pos = [(10.0, 16.0), (10.0, 8.0), (10.0, 24.0), (14.0, 16.0), (14.0, 17.0), (26.0, 28.0)]
    mask = env.avail_actions(battle(env, pos, health=[45.0, 0.0, 45.0, 45.0, 0.0, 45.0]))
    assert mask[0].tolist() == [True] * 5 + [True, False, False]  # enemy 1 dead, enemy 2 far
    assert mask[1].tolist() == [False] * 4 + [True] + [False] * 3  # a dead ally may only stop


def test_forbidden_actions_act_as_stop():
    env = make("3m")
    pos = [(10.0, 16.0), (10.0, 8.0), (10.0, 24.0)] + FAR_ENEMIES
    state = battle(env, pos, health=[45.0, 0.0, 45.0] + [45.0] * 3)
    stopped = step(env, state, [STOP, STOP, STOP])
    for illegal in ([6, N, 99], [-1, E, 7], [5, W, 8]):
        out = step(env, state, illegal)
        jax.tree.map(np.testing.assert_array_equal, out[:4], stopped[:4])


def test_observation_layout():
    env = make("3m")
    pos = [(10.0, 16.0), (10.0, 19.0), (10.0, 28.0), (14.0, 16.0), (26.0, 4.0), (26.0, 28.0)]
    state = battle(env, pos, health=[45.0, 22.5, 45.0, 45.0, 45.0, 45.0], cooldown=[0.305] + [0.0] * 5)
    obs = np.asarray(env._observations(state, env.default_params))
    assert obs.shape == (3, 75)
    first = obs[0].reshape(-1)
    ally1, ally2, enemy0, enemy1 = first[:13], first[13:26], first[26:39], first[39:52]
    np.testing.assert_allclose(ally1[:3], [0.5, 0.0, 3 / 9])  # health fraction, relative position / sight
    assert ally1[7] == 1.0 and ally1[8:].sum() == 0.0  # marine type bit
    assert not ally2.any() and not enemy1.any(), "beyond sight range -> zeros"
    np.testing.assert_allclose(enemy0[:3], [1.0, 4 / 9, 0.0])
    own = obs[0, -10:]
    np.testing.assert_allclose(own[:4], [1.0, 10 / 32, 16 / 32, 0.5], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Heuristic enemy


# Jitted, on NumPy inputs: eager calls compile each primitive separately.
jitted_heuristic_targets = jax.jit(heuristic_targets)


def distances(enemy_pos, ally_pos):
    return np.linalg.norm(enemy_pos[:, None] - ally_pos[None], axis=-1).astype(np.float32)


def test_heuristic_keeps_its_target_while_attackable_else_takes_the_closest():
    enemy_pos = np.array([[12.0, 16.0]], np.float32)
    ally_pos = np.array([[10.0, 16.0], [8.0, 16.0], [3.0, 16.0]], np.float32)
    args = (enemy_pos, ally_pos, distances(enemy_pos, ally_pos), np.ones(1, bool), np.ones(3, bool),
            np.array([9.0], np.float32), np.array([5.0], np.float32))
    home = np.array([[20.0, 16.0]], np.float32)
    noise = np.full((2, 1), 0.5, np.float32)
    target, _ = jitted_heuristic_targets(noise, *args, np.array([-1]), home)
    assert target.tolist() == [0]
    target, _ = jitted_heuristic_targets(noise, *args, np.array([1]), home)
    assert target.tolist() == [1]  # ally 1 (distance 4) is still attackable
    target, _ = jitted_heuristic_targets(noise, *args, np.array([2]), home)
    assert target.tolist() == [0]  # ally 2 is out of range: back to the closest


def test_heuristic_heads_home_when_it_sees_nobody_and_chases_otherwise():
    enemy_pos = np.array([[24.0, 16.0], [24.0, 10.0]], np.float32)
    ally_pos = np.array([[21.0, 3.0]], np.float32)  # seen (not attackable) by enemy 1 only: distance 7.6
    target, move = jitted_heuristic_targets(
        np.full((2, 2), 0.5, np.float32), enemy_pos, ally_pos, distances(enemy_pos, ally_pos), np.ones(2, bool),
        np.ones(1, bool), np.full(2, 9.0, np.float32), np.full(2, 5.0, np.float32), np.array([-1, -1]),
        np.array([[8.0, 16.0], [8.0, 22.0]], np.float32))
    assert target.tolist() == [-1, -1]
    assert move.tolist() == [W, S]  # enemy 0 heads home (west), enemy 1 chases the ally (mostly south)


def test_sample_true_is_uniform_over_true_entries():
    mask = jnp.array([[True, False, True, True], [False, False, False, True]])
    draws = jax.vmap(lambda k: sample_true(k, mask))(jax.random.split(jax.random.PRNGKey(0), 6000))
    counts = np.stack([np.bincount(np.asarray(draws[:, r]), minlength=4) for r in range(2)]) / 6000
    np.testing.assert_allclose(counts[0], [1 / 3, 0, 1 / 3, 1 / 3], atol=0.03)
    assert counts[1].tolist() == [0, 0, 0, 1]


def test_pick_true_picks_the_true_entry_of_the_drawn_rank():
    rng = np.random.default_rng(0)
    mask = rng.uniform(size=(500, 37)) < 0.3
    mask[:5] = False  # rows without a true entry give 0
    u = rng.uniform(size=500).astype(np.float32)
    got = np.asarray(pick_true(jnp.asarray(u), jnp.asarray(mask)))
    count = mask.sum(1)
    rank = np.minimum((u * count).astype(np.int32), count - 1)
    want = [np.flatnonzero(row)[r] if row.any() else 0 for row, r in zip(mask, rank)]
    assert got.tolist() == want


# ------------------------------------------------------------------------------------------------
# Determinism, jit/vmap, params, wrappers


def _random_rollout(env, key, num_steps):
    """Final state and per-step (obs, reward, done) of random legal play, all under one jit."""

    def body(state, t):
        act_key, step_key = jax.random.split(jax.random.fold_in(key, t))
        obs, state, reward, done, _ = env.step(step_key, state, random_legal(act_key, env.avail_actions(state)))
        return state, (obs, reward, done)

    return jax.jit(lambda: jax.lax.scan(body, env.reset(key)[1], jnp.arange(num_steps)))()


def test_same_key_same_episode():
    env = make("2s3z")
    a = _random_rollout(env, jax.random.PRNGKey(7), 15)
    b = _random_rollout(env, jax.random.PRNGKey(7), 15)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    c = _random_rollout(env, jax.random.PRNGKey(8), 15)
    assert not np.array_equal(a[0].position, c[0].position)


def test_vmap_and_jit_match_single_env_steps():
    env = make("2s3z")
    num_envs = 4
    _, state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), num_envs))
    vstep, step1 = jax.jit(jax.vmap(env.step)), jitted_step(env)
    policy = jax.jit(lambda key, state: jax.vmap(random_legal)(jax.random.split(key, num_envs),
                                                                 jax.vmap(env.avail_actions)(state)))
    for t in range(4):
        act_key, step_key = jax.random.split(jax.random.PRNGKey(t))
        step_keys = jax.random.split(step_key, num_envs)
        actions = policy(act_key, state)
        batched = vstep(step_keys, state, actions)
        for i in range(num_envs):
            # one eager (un-jitted) step too: jit must not change the result
            single_step = env.step if (t, i) == (0, 0) else step1
            single = single_step(step_keys[i], jax.tree.map(lambda x: x[i], state), actions[i])
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-5), batched, single)
        state = batched[1]


def test_params_are_a_pytree_that_can_be_vmapped():
    env = make("3m")
    params = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * 2), env.default_params)
    params = params.replace(won_battle_bonus=jnp.array([1.0, 10.0]))
    state = _duel(env, 45.0, 5.0)
    reward = jax.jit(jax.vmap(lambda p: env.step(jax.random.PRNGKey(0), state, jnp.array([5, 4, 4]), p)[2]))(params)
    np.testing.assert_allclose(reward[:, 0], [5 / 45 / 3 + 1.0, 5 / 45 / 3 + 10.0], rtol=1e-6)


def test_auto_reset_and_episode_statistics_wrappers():
    base = make("3m", max_steps=5)
    env = envs.EpisodeStatistics(envs.AutoReset(base))
    num_envs = 8
    obs, state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), num_envs))
    assert obs.shape == (num_envs, 3, base.obs_dim) and state.episode_return.shape == (num_envs, 3)

    def body(state, key):
        act_key, step_key = jax.random.split(key)
        actions = jax.vmap(random_legal)(jax.random.split(act_key, num_envs), jax.vmap(env.avail_actions)(state))
        obs, state, reward, done, info = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state, actions)
        return state, (info["returned_episode"], info["episode_length"], info["episode_return"],
                       state.env_state.time, jax.vmap(env.global_state)(state))

    _, (ended, length, ret, time, gstate) = jax.jit(lambda s: jax.lax.scan(
        body, s, jax.random.split(jax.random.PRNGKey(1), 12)))(state)
    ended, length, time = np.asarray(ended), np.asarray(length), np.asarray(time)
    assert ended.sum() >= num_envs * 2, "every env finishes at least two 5-step episodes"
    assert np.all(length[ended] <= 5) and np.all(time[ended] == 0), "a finished episode restarts"
    assert ret.shape == (12, num_envs, 3) and gstate.shape == (12, num_envs, base.state_dim)
    np.testing.assert_allclose(ret[..., 0], ret[..., 2])  # shared team reward


# ------------------------------------------------------------------------------------------------
# Rendering


def test_render_writes_an_animated_gif_and_a_png(tmp_path):
    from PIL import Image

    from envs.smax.render import episode_states, main, render_episode
    env = make("3m", max_steps=4)
    states = episode_states(env, jax.random.PRNGKey(0))
    assert 2 <= len(states) <= 5 and int(states[0].time) == 0
    gif, png = render_episode(env, states, str(tmp_path), fps=8)
    with Image.open(gif) as im:
        assert im.n_frames == len(states) and im.size == (480, 480)
    with Image.open(png) as im:
        assert im.size == (480, 480)
    with pytest.raises(SystemExit):  # no --params: a trained policy is drawn through jaxrl (tests/test_evaluate.py)
        main(["--scenario", "3m", "--out", str(tmp_path), "--params", "policy.msgpack"])


def test_each_frame_draws_its_own_state_only():
    """Frames share one figure: each equals its state drawn alone (below the title, which names the step), so
    nothing of an earlier frame stays; attack lines and dead units' marks appear and go with their states."""
    from envs.smax.render import episode_states, render_frames
    env = make("3m")
    states = episode_states(env, jax.random.PRNGKey(0))[:12]
    together = render_frames(env, states)
    title_rows = 40  # (of 480: the axes start at 92% of the height)
    for t in (1, 6, 11):
        alone = render_frames(env, states[t:t + 1])[0]
        np.testing.assert_array_equal(np.asarray(together[t])[title_rows:], np.asarray(alone)[title_rows:])
    assert not np.array_equal(np.asarray(together[1]), np.asarray(together[11]))


def test_observe_gives_what_reset_and_step_return_and_auto_reset_observes_the_kept_state_once():
    """`SMAX.observe(state)` equals the obs that `reset` and `step` return with that state; `envs.AutoReset`
    observes the state it keeps (step's or restart's) and returns exactly what selecting between the two
    computed observations returns (an env without `observe`), over steps where battles end and restart."""
    env = make("2s3z")
    obs, state = jitted_reset(env)(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(jax.jit(env.observe)(state), obs)
    next_obs, next_state, *_ = jitted_step(env)(jax.random.PRNGKey(1), state, jnp.full((env.num_agents,), STOP))
    np.testing.assert_array_equal(jax.jit(env.observe)(next_state), next_obs)

    class Selecting(SMAX):  # the same env, without `observe`: AutoReset selects between both observations
        observe = None

    selecting = Selecting("2s3z")
    ended = 0
    for wrapped in (envs.AutoReset(env), envs.AutoReset(selecting)):
        keys = jax.random.split(jax.random.PRNGKey(2), 64)
        obs, states = jax.jit(jax.vmap(wrapped.reset))(keys)

        def body(carry, key):
            obs, states = carry
            actions = jax.vmap(random_legal)(jax.random.split(key, 64), jax.vmap(wrapped.avail_actions)(states))
            obs, states, _, _, info = jax.vmap(wrapped.step)(jax.random.split(key, 64), states, actions)
            return (obs, states), (obs, info["episode_over"])

        _, outs = jax.jit(lambda c: jax.lax.scan(body, c, jax.random.split(jax.random.PRNGKey(3), 80)))((obs, states))
        if wrapped.env is env:
            observed = outs
        else:
            np.testing.assert_array_equal(observed[0], outs[0])
            np.testing.assert_array_equal(observed[1], outs[1])
            ended = int(outs[1].sum())
    assert ended > 64, "battles should end (and restart) within 80 steps"

    # The same with restarts shared by 4 envs (`reset_ratio`, the batch step).
    shared = []
    for wrapped in (envs.AutoReset(env, reset_ratio=4), envs.AutoReset(selecting, reset_ratio=4)):
        obs, states = jax.jit(jax.vmap(wrapped.reset))(jax.random.split(jax.random.PRNGKey(2), 64))

        def batch(states, key):
            actions = jax.vmap(random_legal)(jax.random.split(key, 64), jax.vmap(wrapped.avail_actions)(states))
            obs, states, _, _, info = wrapped.batch_step(jax.random.split(key, 64), states, actions)
            return states, (obs, info["episode_over"])

        shared.append(jax.jit(lambda s: jax.lax.scan(batch, s, jax.random.split(jax.random.PRNGKey(3), 80))[1])(states))
    np.testing.assert_array_equal(shared[0][0], shared[1][0])
    assert int(shared[0][1].sum()) > 64

    def step_cost(wrapped):  # XLA's count of what one compiled auto-reset step computes
        args = (jax.random.PRNGKey(0), state, jnp.zeros((env.num_agents,), jnp.int32))
        return jax.jit(lambda *a: wrapped.step(*a)[0]).lower(*args).compile().cost_analysis()["flops"]

    assert step_cost(envs.AutoReset(env)) < step_cost(envs.AutoReset(selecting))
