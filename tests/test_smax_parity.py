"""SMAX parity with the reference, jaxmarl's SMAX (installed by the dev extra).

Fast tests compare sizes, unit stats, observations, global states, masks, heuristic decisions and
one-step dynamics on identical states. Slow tests compare episode statistics over thousands of
episodes (mean length, return, win rate) under fixed ally policies.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.smax import UNIT_TYPES, scenario_names
from envs.smax.heuristic import STOP
from envs.smax.parity import POLICIES, episode_statistics, random_legal

def slow(*values):
    """Parametrisations that only run with the slow tests (each compiles the reference, ~10 s)."""
    return [pytest.param(v, marks=pytest.mark.slow) for v in values]


# Reference figures from the issue (jaxmarl 0.2.0, random legal allies, 1024 envs x 300 steps).
PUBLISHED = {"3m": (17.7, 0.177), "2s3z": (53.0, 0.203), "5m_vs_6m": (18.1, 0.139)}


def _jaxmarl_smax():
    # The `dev` extra installs jaxmarl, the parity reference: a missing reference is a failure, not a skip.
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario
    return HeuristicEnemySMAX, map_name_to_scenario


@functools.lru_cache(maxsize=None)
def pair(name):
    """(ours, reference) for a scenario."""
    HeuristicEnemySMAX, map_name_to_scenario = _jaxmarl_smax()
    return envs.make("smax", scenario=name), HeuristicEnemySMAX(scenario=map_name_to_scenario(name))


def to_reference_state(env, state):
    """Our SMAXState as the reference's (HeuristicEnemySMAX) state."""
    from jaxmarl.environments.smax.heuristic_enemy import HeuristicPolicyState
    from jaxmarl.environments.smax.heuristic_enemy_smax_env import State as WrapperState
    from jaxmarl.environments.smax.smax_env import State

    A = env.num_allies
    inner = State(unit_positions=state.position, unit_alive=state.health > 0,
                  unit_teams=(jnp.arange(env.num_units) >= A).astype(jnp.float32), unit_health=state.health,
                  unit_types=state.unit_type.astype(jnp.uint8), unit_weapon_cooldowns=state.cooldown,
                  prev_movement_actions=state.last_move, prev_attack_actions=state.last_attack,
                  step=state.time, done=jnp.bool_(False))
    # The reference numbers an enemy's targets in reverse ally order.
    last = jnp.where(state.enemy_target >= 0, A - 1 - state.enemy_target, -1)
    return WrapperState(state=inner, enemy_policy_state=HeuristicPolicyState(default_target=state.enemy_home,
                                                                             last_attacked_enemy=last))


def stack(d, agents):
    return jnp.stack([d[a] for a in agents])


def visited_states(env, num_envs=16, num_steps=40, seed=0):
    """[num_steps * num_envs] states of random legal play (auto-reset), flattened on a leading axis."""
    wrapped = envs.AutoReset(env)

    @jax.jit  # (the flattening too: op by op, each leaf's reshape would compile apart)
    def run(key):
        _, state = jax.vmap(wrapped.reset)(jax.random.split(key, num_envs))

        def body(state, k):
            a_key, s_key = jax.random.split(k)
            actions = jax.vmap(random_legal)(jax.random.split(a_key, num_envs), jax.vmap(env.avail_actions)(state))
            _, nxt, *_ = jax.vmap(wrapped.step)(jax.random.split(s_key, num_envs), state, actions)
            return nxt, state

        states = jax.lax.scan(body, state, jax.random.split(key, num_steps))[1]
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), states)

    return run(jax.random.PRNGKey(seed))


# ------------------------------------------------------------------------------------------------
# Sizes and stats


@pytest.mark.parametrize("name", scenario_names())
def test_sizes_match_the_reference(name):
    HeuristicEnemySMAX, map_name_to_scenario = _jaxmarl_smax()
    from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO
    if name not in MAP_NAME_TO_SCENARIO:
        pytest.skip(f"{name} is not a reference scenario")
    ours, ref = pair(name)
    assert ours.num_agents == ref.num_agents
    assert ours.num_enemies == ref.num_enemies
    assert ours.obs_dim == ref.obs_size and ours.state_dim == ref.state_size
    assert ours.num_actions == ref.action_space(ref.agents[0]).n
    assert ours.observation_space().shape == ref.observation_space(ref.agents[0]).shape
    ref_types = np.asarray(map_name_to_scenario(name).unit_types)
    if not ours.scenario.random_unit_types:
        assert list(ours.scenario.unit_types) == ref_types.tolist()


def test_every_reference_scenario_exists():
    _jaxmarl_smax()
    from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO
    assert set(MAP_NAME_TO_SCENARIO) <= set(scenario_names())


def test_unit_stats_match_the_reference():
    _jaxmarl_smax()
    from jaxmarl.environments.smax import SMAX as RefSMAX
    ref = RefSMAX()
    assert [t.name for t in UNIT_TYPES] == ref.unit_type_names
    assert [t.short for t in UNIT_TYPES] == ref.unit_type_shorthands
    for ours, theirs in [("speed", ref.unit_type_velocities), ("damage", ref.unit_type_attacks),
                         ("attack_range", ref.unit_type_attack_ranges), ("sight_range", ref.unit_type_sight_ranges),
                         ("radius", ref.unit_type_radiuses), ("health", ref.unit_type_health),
                         ("cooldown", ref.unit_type_weapon_cooldowns)]:
        np.testing.assert_allclose([getattr(t, ours) for t in UNIT_TYPES], theirs, err_msg=ours)
    env = envs.make("smax")
    assert env.world_steps_per_env_step == ref.world_steps_per_env_step
    p = env.default_params
    assert (p.map_width, p.map_height, p.time_per_step, p.max_steps, p.won_battle_bonus) == (
        ref.map_width, ref.map_height, ref.time_per_step, ref.max_steps, ref.won_battle_bonus)


# ------------------------------------------------------------------------------------------------
# Same state -> same observations, global state, masks, enemy decisions


@pytest.mark.parametrize("name", ["2s3z", "smacv2_5_units", *slow("3m", "5m_vs_6m", "6h_vs_8z", "27m_vs_30m")])
def test_observations_global_state_and_masks_match_on_visited_states(name):
    ours, ref = pair(name)
    states = visited_states(ours)

    @jax.jit
    def both(state):
        rs = to_reference_state(ours, state)
        mine = (ours._observations(state, ours.default_params), ours.global_state(state), ours.avail_actions(state))
        theirs = (stack(ref.get_obs(rs), ref.agents), ref.get_world_state(rs),
                  stack(ref.get_avail_actions(rs), ref.agents).astype(bool))
        return mine, theirs

    mine, theirs = jax.vmap(both)(states)
    np.testing.assert_allclose(mine[0], theirs[0], atol=1e-6)
    np.testing.assert_allclose(mine[1], theirs[1], atol=1e-6)
    np.testing.assert_array_equal(mine[2], theirs[2])


@pytest.mark.parametrize("name", ["3m", *slow("2s3z", "5m_vs_6m")])
def test_enemy_decisions_match_the_reference_heuristic(name):
    """Attacks (closest / keep target) must agree; moves agree wherever they involve no random choice."""
    from envs.smax.env import pairwise_distance, unit_stats
    from envs.smax.heuristic import heuristic_targets
    ours, ref = pair(name)
    states = visited_states(ours, seed=1)
    A = ours.num_allies

    @jax.jit
    def both(state, key):
        stats = unit_stats(ours.default_params, state.unit_type)
        alive = state.health > 0
        dist = pairwise_distance(state.position[A:], state.position[:A])
        noise = jax.random.uniform(key, (2, ours.num_enemies))
        target, move = heuristic_targets(noise, state.position[A:], state.position[:A], dist, alive[A:],
                                         alive[:A], stats.sight_range[A:], stats.attack_range[A:],
                                         state.enemy_target, state.enemy_home)
        rs = to_reference_state(ours, state)
        enemy_obs = stack(ref._env.get_obs_unit_list(rs.state), ref.enemy_agents)
        actions, _ = ref.get_enemy_actions(key, rs.enemy_policy_state, enemy_obs)
        visible = alive[A:, None] & alive[None, :A] & (dist < stats.sight_range[A:, None])
        return target, move, stack(actions, ref.enemy_agents), visible.sum(1), alive[A:]

    keys = jax.random.split(jax.random.PRNGKey(2), states.time.shape[0])
    target, move, ref_action, num_visible, alive = map(np.asarray, jax.vmap(both)(states, keys))
    ours_action = np.where(target >= 0, STOP + 1 + (A - 1 - target), move)
    deterministic = alive & ((target >= 0) | (num_visible <= 1))
    assert deterministic.mean() > 0.5
    np.testing.assert_array_equal(ours_action[deterministic], ref_action[deterministic])


# ------------------------------------------------------------------------------------------------
# Same state and ally actions -> same next state, where the step involves no random draw


def _random_battles(name, key, num, ally_box, enemy_box):
    """[num] states with allies uniform in `ally_box` and enemies in `enemy_box` ((x0, y0), (x1, y1))."""
    ours, _ = pair(name)

    @jax.jit  # (one program: op by op, each draw would compile apart)
    def battles(key):
        _, state = jax.vmap(ours.reset)(jax.random.split(key, num))
        a_key, e_key = jax.random.split(key)
        allies = jax.random.uniform(a_key, (num, ours.num_allies, 2), minval=jnp.array(ally_box[0]),
                                    maxval=jnp.array(ally_box[1]))
        enemies = jax.random.uniform(e_key, (num, ours.num_enemies, 2), minval=jnp.array(enemy_box[0]),
                                     maxval=jnp.array(enemy_box[1]))
        return state.replace(position=jnp.concatenate([allies, enemies], axis=1))

    return battles(key)


def _step_both(name, states, key):
    ours, ref = pair(name)

    @jax.jit
    def run(state, key):
        act_key, step_key = jax.random.split(key)
        actions = random_legal(act_key, ours.avail_actions(state))
        _, mine, reward, done, info = ours.step(step_key, state, actions)
        rs = to_reference_state(ours, state)
        _, theirs, ref_reward, ref_done, _ = ref.step_env(step_key, rs, dict(zip(ref.agents, actions)))
        return mine, theirs.state, reward, stack(ref_reward, ref.agents), info, ref_done["__all__"]

    return jax.vmap(run)(states, jax.random.split(key, states.time.shape[0]))


@pytest.mark.parametrize("name", ["2s3z", *slow("3m")])
def test_movement_pushes_and_wall_deaths_match(name):
    # Teams out of each other's sight: allies move at random (walls kill some), enemies walk home.
    states = _random_battles(name, jax.random.PRNGKey(3), 128, ((0.2, 0.2), (9.0, 31.8)),
                             ((21.0, 0.2), (31.8, 31.8)))
    mine, theirs, reward, ref_reward, *_ = _step_both(name, states, jax.random.PRNGKey(4))
    np.testing.assert_allclose(mine.position, theirs.unit_positions, atol=1e-4)
    np.testing.assert_array_equal(mine.health, theirs.unit_health)
    np.testing.assert_array_equal(mine.health > 0, theirs.unit_alive)
    np.testing.assert_allclose(mine.last_move, theirs.prev_movement_actions, atol=1e-6)
    np.testing.assert_allclose(reward, ref_reward, atol=1e-6)
    assert (np.asarray(mine.health) == 0).any(), "some units should have hit a wall"


@pytest.mark.parametrize("name", ["3m", *slow("5m_vs_6m")])
def test_close_combat_damage_and_rewards_match(name):
    # Everyone within everyone's attack range: every unit fires on the first tick, nobody walks.
    states = _random_battles(name, jax.random.PRNGKey(5), 128, ((14.0, 15.0), (15.5, 17.0)),
                             ((16.5, 15.0), (18.0, 17.0)))
    mine, theirs, reward, ref_reward, info, ref_over = _step_both(name, states, jax.random.PRNGKey(6))
    np.testing.assert_array_equal(mine.health, theirs.unit_health)
    np.testing.assert_allclose(mine.position, theirs.unit_positions, atol=1e-4)
    np.testing.assert_array_equal(mine.last_attack, theirs.prev_attack_actions)
    np.testing.assert_allclose(reward, ref_reward, atol=1e-6)
    np.testing.assert_array_equal(info["episode_over"], ref_over)
    # Cooldowns differ only by their random jitter (up to 3 ticks wide).
    assert np.abs(np.asarray(mine.cooldown) - np.asarray(theirs.unit_weapon_cooldowns)).max() <= 3 / 16 + 1e-5


# ------------------------------------------------------------------------------------------------
# Episode statistics over thousands of episodes (slow)


def _close(ours, theirs, rel=0.05, win_abs=0.05):
    assert ours["length"] == pytest.approx(theirs["length"], rel=rel)
    assert ours["return"] == pytest.approx(theirs["return"], rel=rel)
    assert abs(ours["win_rate"] - theirs["win_rate"]) <= win_abs


@pytest.mark.slow
@pytest.mark.optimized  # long programs: optimised, they run in half the time, which more than repays the compile
@pytest.mark.parametrize("name", ["3m", "2s3z"])
def test_episode_statistics_match_the_reference(name):
    """Allies that attack or advance (the reference runs in the same test). Random legal allies are compared with
    the reference's published figures below, which need no second compile of the reference."""
    _jaxmarl_smax()
    from envs.smax.parity import reference_env
    key, policy = jax.random.PRNGKey(0), POLICIES["attack_or_advance"]
    # 512 envs x 200 steps: 1,900 (2s3z) to 5,800 (3m) episodes a side, a 5% bar at several standard errors
    ours = episode_statistics(envs.make("smax", scenario=name), policy, key, num_envs=512, num_steps=200)
    theirs = episode_statistics(reference_env(name), policy, key, num_envs=512, num_steps=200)
    print(f"{name} attack_or_advance: ours {ours} reference {theirs}")
    _close(ours, theirs)


@pytest.mark.slow
@pytest.mark.optimized
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_episode_statistics_match_the_published_reference_figures(name):
    """Needs no jaxmarl: the figures measured with it (random legal allies, 1024 envs x 300 steps)."""
    ours = episode_statistics(envs.make("smax", scenario=name), POLICIES["random"], jax.random.PRNGKey(0))
    length, ret = PUBLISHED[name]
    _close(ours, {"length": length, "return": ret, "win_rate": 0.0})
    assert ours["win_rate"] == 0.0  # random allies never win these battles, in the reference or here
