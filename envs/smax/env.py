"""SMAX-style battles: allied agents against a heuristic enemy on an open 32 x 32 map.

Behaviour follows the SMAX benchmark, with jaxmarl's SMAX as the parity reference
(tests/test_smax_parity.py). The implementation works on whole per-env arrays: units `[U]` (allies
first, then enemies) and pairwise matrices `[U, U]`; the world ticks of one agent step run in a
`lax.scan`, so compile time does not grow with the battle.

    env = envs.make("smax", scenario="3m")
    obs, state = env.reset(key)                              # obs [A, obs_dim]
    mask = env.avail_actions(state)                          # bool [A, 5 + E]
    obs, state, reward, done, info = env.step(key, state, actions)   # actions int32 [A]

Actions per agent: 0-3 move N, E, S, W; 4 stop; 5 + k attack enemy k. An action the mask forbids
acts as stop. `reward` is the team reward, shared by every agent (dead ones included); `done[a]` is
true once agent `a` is dead or the episode is over; `info` holds scalar `won`, `terminated` (a team
was wiped out), `truncated` (time limit, not terminated) and `episode_over`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Box, Discrete, Environment
from envs.smax.heuristic import DIRECTIONS, NUM_MOVES, STOP, heuristic_targets
from envs.smax.scenarios import Scenario, get_scenario
from envs.smax.units import NUM_UNIT_TYPES, UNIT_TYPES

NUM_NON_ATTACK = NUM_MOVES + 1  # moves and stop come before the attack actions
UNIT_FEATURES = 7 + NUM_UNIT_TYPES  # health, rel x, rel y, last move x, y, last target, cooldown, type
OWN_FEATURES = 4 + NUM_UNIT_TYPES  # health, x, y, cooldown, type
STATE_FEATURES = OWN_FEATURES + 2  # per unit in the global state, with team and type id
_GOLDEN = 0.6180339887498949  # fractional part of the golden ratio
_REL_X, _REL_Y = np.eye(UNIT_FEATURES, dtype=np.float32)[1:3]  # where relative x, y go in a unit's features


@struct.dataclass
class SMAXParams:
    """Dynamic numbers of a battle; unit stats are [T] tables indexed by type id."""

    speed: jax.Array
    damage: jax.Array
    attack_range: jax.Array
    sight_range: jax.Array
    radius: jax.Array
    health: jax.Array
    cooldown: jax.Array
    map_width: float = 32.0
    map_height: float = 32.0
    time_per_step: float = 1.0 / 16  # seconds of game time per world tick
    max_steps: int = 100
    won_battle_bonus: float = 1.0
    walls_cause_death: bool = True
    enemy_shoots: bool = True


def default_unit_stats() -> dict[str, jax.Array]:
    """The `SMAXParams` unit-stat fields, from the unit type table."""
    return {c: jnp.array([getattr(t, c) for t in UNIT_TYPES], dtype=jnp.float32) for c in UnitStats._fields}


@struct.dataclass
class SMAXState:
    position: jax.Array  # [U, 2] float32
    health: jax.Array  # [U] float32; a unit is alive while its health is positive
    cooldown: jax.Array  # [U] float32 seconds until the weapon is ready (<= 0: ready)
    unit_type: jax.Array  # [U] int32
    last_move: jax.Array  # [U, 2] direction each unit moved in the last step (0 when it did not)
    last_attack: jax.Array  # [U] int32 last step's attack action in the unit's own numbering, else 0
    enemy_target: jax.Array  # [E] int32 ally each heuristic enemy last attacked, -1 for none
    enemy_home: jax.Array  # [E, 2] where an enemy heads when it sees no ally
    time: jax.Array  # int32 agent steps taken

    @property
    def alive(self) -> jax.Array:
        return self.health > 0


class UnitStats(NamedTuple):
    """Per-unit stats for one step, `[U]` each (types do not change within an episode)."""

    speed: jax.Array
    damage: jax.Array
    attack_range: jax.Array
    sight_range: jax.Array
    radius: jax.Array
    health: jax.Array
    cooldown: jax.Array


def unit_stats(params: SMAXParams, unit_type: jax.Array) -> UnitStats:
    return UnitStats(*(getattr(params, f)[unit_type] for f in UnitStats._fields))


def pairwise_distance(p: jax.Array, q: jax.Array) -> jax.Array:
    """[P, Q] Euclidean distances between positions `p` [P, 2] and `q` [Q, 2]."""
    # Written out per coordinate: a sum over the size-2 axis runs as a slow reduction on CPU.
    dx = p[:, None, 0] - q[None, :, 0]
    dy = p[:, None, 1] - q[None, :, 1]
    return jnp.sqrt(dx * dx + dy * dy)


# Up to this many units the push sums run as one fused reduction; above it a small matmul is faster.
_PUSH_MATMUL_FROM = 12


def _add_pairs(a, b):
    return a[0] + b[0], a[1] + b[1]


def push_apart(x, y, alive, radius_sum):
    """Separate overlapping alive units: each moves by half its overlap with every neighbour.

    x, y, alive [U]; radius_sum [U, U] sums of unit radii. Returns the new x, y [U].
    """
    dx = x[:, None] - x[None, :]
    dy = y[:, None] - y[None, :]
    # The identity keeps a unit's distance to itself away from 0; its own push is 0 anyway (dx = 0).
    dist = jnp.sqrt(dx * dx + dy * dy) + jnp.eye(x.shape[0], dtype=x.dtype) + 1e-6
    overlap = jnp.where(alive[:, None] & alive[None, :], jax.nn.relu(radius_sum / dist - 1.0), 0.0)  # [U, U]
    if x.shape[0] < _PUSH_MATMUL_FROM:
        push_x, push_y = jax.lax.reduce((dx * overlap, dy * overlap), (0.0, 0.0), _add_pairs, (1,))
    else:
        # sum_j (x_i - x_j) o_ij = x_i sum_j o_ij - (o @ x)_i: one [U, U] pass instead of several.
        # `overlap` is symmetric, so o @ v is v^T @ o: a [3, U] result, which CPU matmul kernels run
        # about twice as fast as [U, 3]. Centred coordinates keep the cancellation error near 1e-5;
        # full precision stops GPUs and TPUs from rounding the matmul to bf16/tf32.
        cx, cy = x - jnp.mean(x), y - jnp.mean(y)
        sums = jnp.dot(jnp.stack([cx, cy, jnp.ones_like(x)]), overlap, precision="highest")  # [3, U]
        push_x, push_y = cx * sums[2] - sums[0], cy * sums[2] - sums[1]
    return jnp.where(alive, x + push_x / 2, x), jnp.where(alive, y + push_y / 2, y)


class SMAX(Environment):
    """Allied agents (`num_agents` = number of allies) against the heuristic enemy.

    Static configuration: the scenario, world ticks per agent step and the enemy's target choice.
    Everything else (unit stats, map size, time limit, bonus, wall deaths) lives in `SMAXParams` and
    may be overridden by keyword, e.g. `SMAX("3m", walls_cause_death=False, max_steps=200)`.
    """

    has_action_masks = True
    multi_agent = True

    def __init__(self, scenario: str | Scenario = "3m", *, world_steps_per_env_step: int = 8,
                 attack_mode: str = "closest", **param_overrides):
        self.scenario_name = scenario if isinstance(scenario, str) else "custom"
        self.scenario = get_scenario(scenario)
        self.name = f"smax-{self.scenario_name}"
        self.world_steps_per_env_step = int(world_steps_per_env_step)
        if attack_mode not in ("closest", "random"):
            raise ValueError(f"unknown attack_mode {attack_mode!r}; use 'closest' or 'random'")
        self.attack_mode = attack_mode
        fields = set(SMAXParams.__dataclass_fields__)
        unknown = set(param_overrides) - fields
        if unknown:
            raise TypeError(f"unknown SMAX option(s) {sorted(unknown)}; accepted: world_steps_per_env_step, "
                            f"attack_mode, {', '.join(sorted(fields))}")
        self._default_params = SMAXParams(**{**default_unit_stats(), **param_overrides})
        self.num_allies = self.scenario.num_allies
        self.num_enemies = self.scenario.num_enemies
        self.num_units = self.num_allies + self.num_enemies
        self.num_agents = self.num_allies
        self.max_episode_steps = int(self._default_params.max_steps)
        self.agents = [f"ally_{i}" for i in range(self.num_allies)]
        self.enemy_agents = [f"enemy_{i}" for i in range(self.num_enemies)]
        # Each unit's action count: allies pick among enemies, enemies among allies.
        self._unit_num_actions = np.array([NUM_NON_ATTACK + self.num_enemies] * self.num_allies
                                          + [NUM_NON_ATTACK + self.num_allies] * self.num_enemies)

    # ---------------------------------------------------------------------------------------------
    # Sizes and spaces

    @property
    def default_params(self) -> SMAXParams:
        return self._default_params

    @property
    def num_actions(self) -> int:
        return NUM_NON_ATTACK + self.num_enemies

    @property
    def obs_dim(self) -> int:
        return UNIT_FEATURES * (self.num_units - 1) + OWN_FEATURES

    @property
    def state_dim(self) -> int:
        return STATE_FEATURES * self.num_units

    def observation_space(self, params=None) -> Box:
        return Box(low=-1.0, high=1.0, shape=(self.obs_dim,))

    def action_space(self, params=None) -> Discrete:
        return Discrete(self.num_actions)

    # ---------------------------------------------------------------------------------------------
    # Reset

    def reset(self, key, params=None):
        p = self._params(params)
        pos_key, type_key = jax.random.split(key) if self.scenario.random_unit_types else (key, None)
        unit_type = self.scenario.draw_unit_types(type_key)
        position = self.scenario.start_positions(pos_key, p.map_width, p.map_height).astype(jnp.float32)
        stats = unit_stats(p, unit_type)
        alive = jnp.ones((self.num_units,), bool)
        x, y = push_apart(position[:, 0], position[:, 1], alive, stats.radius[:, None] + stats.radius[None, :])
        position = jnp.stack([x, y], axis=-1)
        centre = jnp.array([p.map_width / 2, p.map_height / 2], dtype=jnp.float32)
        state = SMAXState(
            position=position,
            health=stats.health,
            cooldown=jnp.zeros((self.num_units,), jnp.float32),
            unit_type=unit_type,
            last_move=jnp.zeros((self.num_units, 2), jnp.float32),
            last_attack=jnp.zeros((self.num_units,), jnp.int32),
            enemy_target=jnp.full((self.num_enemies,), -1, jnp.int32),
            enemy_home=2 * centre - position[self.num_allies:],
            time=jnp.int32(0),
        )
        return self._observations(state, p), state

    # ---------------------------------------------------------------------------------------------
    # Step

    def step(self, key, state: SMAXState, actions, params=None):
        p = self._params(params)
        A = self.num_allies
        # All of the step's randomness in one draw: the enemies' choices [2, E] and cooldown jitter [U].
        noise = jax.random.uniform(key, (2 * self.num_enemies + self.num_units,))
        stats = unit_stats(p, state.unit_type)
        alive = state.alive
        dist = pairwise_distance(state.position[:A], state.position[A:])  # [A, E]

        # Allies: forbidden or out-of-range actions become stop.
        actions = jnp.asarray(actions, jnp.int32)
        mask = self._ally_mask(alive, dist, stats)
        in_range = (actions >= 0) & (actions < self.num_actions)
        legal = in_range & jnp.take_along_axis(mask, jnp.where(in_range, actions, STOP)[:, None], 1)[:, 0]
        ally_actions = jnp.where(legal, actions, STOP)

        # Enemies: the heuristic, which numbers its targets in reverse ally order (as SMAX does).
        target, move = heuristic_targets(
            noise[:2 * self.num_enemies].reshape(2, -1), state.position[A:], state.position[:A], dist.T,
            alive[A:], alive[:A], stats.sight_range[A:], stats.attack_range[A:], state.enemy_target,
            state.enemy_home, self.attack_mode)
        attacks = (target >= 0) & p.enemy_shoots
        enemy_actions = jnp.where(attacks, NUM_NON_ATTACK + A - 1 - target, move)

        unit_actions = jnp.concatenate([ally_actions, enemy_actions])
        move_dir, attack_target = self._decode(unit_actions)
        position, health, cooldown = self._run_world(p, stats, state, move_dir, attack_target,
                                                     noise[2 * self.num_enemies:])

        next_state = SMAXState(
            position=position,
            health=health,
            cooldown=cooldown,
            unit_type=state.unit_type,
            last_move=move_dir,
            last_attack=jnp.where(attack_target >= 0, unit_actions, 0),
            enemy_target=target,
            enemy_home=state.enemy_home,
            time=state.time + 1,
        )
        alive = next_state.alive
        allies_dead = ~alive[:A].any()
        enemies_dead = ~alive[A:].any()
        won = enemies_dead & ~allies_dead  # a tie (both wiped out on one tick) earns no bonus
        terminated = allies_dead | enemies_dead
        truncated = (next_state.time >= p.max_steps) & ~terminated
        over = terminated | truncated
        damage_dealt = (state.health[A:] - health[A:]) / stats.health[A:]
        team_reward = jnp.sum(damage_dealt) / self.num_enemies + p.won_battle_bonus * won
        reward = jnp.full((A,), team_reward, jnp.float32)
        done = ~alive[:A] | over
        info = {"won": won, "terminated": terminated, "truncated": truncated, "episode_over": over}
        return self._observations(next_state, p), next_state, reward, done, info

    def _decode(self, unit_actions):
        """[U] actions in each unit's own numbering -> move directions [U, 2], attack targets [U] (-1: none)."""
        A = self.num_allies
        k = unit_actions - NUM_NON_ATTACK
        is_ally = jnp.arange(self.num_units) < A
        target = jnp.where(is_ally, A + k, A - 1 - k)
        attack_target = jnp.where(k >= 0, target, -1)
        move_dir = DIRECTIONS[jnp.clip(unit_actions, 0, STOP)]
        return move_dir, attack_target

    def _run_world(self, p: SMAXParams, stats: UnitStats, state: SMAXState, move_dir, attack_target, noise):
        """Run the world ticks of one step. Returns position [U, 2], health [U], cooldown [U].

        Per tick: attacks resolve on the tick's start positions (damage from several attackers adds
        up), units move, units touching a wall die, overlapping units are pushed apart. A unit that
        fires resets its cooldown to its type's plus a jitter uniform in [-1, +2) ticks, drawn from
        `noise` [U] (uniforms in [0, 1)).
        """
        # One uniform per unit and step, moved along by the golden ratio for each tick: each tick's
        # jitter is exactly uniform, and with the stock cooldowns (>= 7 ticks) a unit fires at most
        # once per step, so no shot shares its jitter with another of the same unit.
        ticks = jnp.arange(self.world_steps_per_env_step, dtype=jnp.float32)[:, None]
        uniform = jnp.mod(noise[None, :] + ticks * _GOLDEN, 1.0)  # [K, U]
        jitter = (3 * uniform - 1) * p.time_per_step
        step_x, step_y = (move_dir * (stats.speed * p.time_per_step)[:, None]).T
        attacking = attack_target >= 0
        victim = jnp.maximum(attack_target, 0)
        radius_sum = stats.radius[:, None] + stats.radius[None, :]

        def tick(carry, jitter_t):
            x, y, health, cooldown = carry
            alive = health > 0
            gap_x, gap_y = x[victim] - x, y[victim] - y
            fires = (attacking & alive & alive[victim] & (cooldown <= 0)
                     & (jnp.sqrt(gap_x * gap_x + gap_y * gap_y) < stats.attack_range))
            # Damage adds up per victim: a segment sum, the sparse form of a [U, U] hit matrix reduction.
            damage_taken = jnp.zeros_like(health).at[victim].add(jnp.where(fires, stats.damage, 0.0))
            health = jnp.maximum(health - damage_taken, 0.0)
            cooldown = jnp.where(fires, stats.cooldown + jitter_t, cooldown - p.time_per_step)
            x = jnp.where(alive, jnp.clip(x + step_x, 0.0, p.map_width), x)
            y = jnp.where(alive, jnp.clip(y + step_y, 0.0, p.map_height), y)
            on_wall = (x <= 0) | (y <= 0) | (x >= p.map_width) | (y >= p.map_height)
            health = jnp.where(on_wall & p.walls_cause_death, 0.0, health)
            x, y = push_apart(x, y, health > 0, radius_sum)
            return (x, y, health, cooldown), None

        init = (state.position[:, 0], state.position[:, 1], state.health, state.cooldown)
        (x, y, health, cooldown), _ = jax.lax.scan(tick, init, jitter)
        return jnp.stack([x, y], axis=-1), health, cooldown

    # ---------------------------------------------------------------------------------------------
    # Masks, observations, global state

    def _ally_mask(self, alive, dist, stats: UnitStats):
        """bool [A, 5 + E]: moves while alive, stop always, attack enemy k while alive and in range."""
        A = self.num_allies
        moves = jnp.broadcast_to(alive[:A, None], (A, NUM_MOVES))
        stop = jnp.ones((A, 1), bool)
        attack = alive[:A, None] & alive[None, A:] & (dist < stats.attack_range[:A, None])
        return jnp.concatenate([moves, stop, attack], axis=1)

    def avail_actions(self, state: SMAXState, params=None) -> jax.Array:
        """bool [A, num_actions]."""
        p = self._params(params)
        A = self.num_allies
        dist = pairwise_distance(state.position[:A], state.position[A:])
        return self._ally_mask(state.alive, dist, unit_stats(p, state.unit_type))

    def observe(self, state: SMAXState, params=None) -> jax.Array:
        """[A, obs_dim], as `reset` and `step` return them for `state` (`Environment.observe`)."""
        return self._observations(state, self._params(params))

    def _observations(self, state: SMAXState, p: SMAXParams) -> jax.Array:
        """[A, obs_dim]: every other unit as each ally sees it (allies, then enemies), then its own features."""
        A, U = self.num_allies, self.num_units
        stats = unit_stats(p, state.unit_type)
        alive = state.alive
        health = state.health / stats.health
        cooldown = jnp.clip(state.cooldown / stats.cooldown, 0.0, 1.0)
        type_bits = jax.nn.one_hot(state.unit_type, NUM_UNIT_TYPES, dtype=jnp.float32)
        last_target = state.last_attack / (self._unit_num_actions - 1)
        # What a viewer sees of each unit [U, F]; slots 1, 2 (relative position) are filled per viewer.
        visible_features = jnp.concatenate([health[:, None], jnp.zeros((U, 2)), state.last_move,
                                            last_target[:, None], cooldown[:, None], type_bits], axis=-1)

        x, y = state.position[:, 0], state.position[:, 1]
        sight = stats.sight_range[:A, None]
        dx, dy = x[None, :] - x[:A, None], y[None, :] - y[:A, None]  # [A, U]
        seen = alive[:A, None] & alive[None, :] & (jnp.sqrt(dx * dx + dy * dy) < sight)
        rel_x, rel_y = dx / sight, dy / sight

        def block(visible, features, rx, ry):
            """[A, K, F]: `features` [.., K, F] with the relative position filled in, zero where unseen."""
            # Broadcast arithmetic rather than a concatenate keeps this pass one fused loop.
            return jnp.where(visible[..., None], features + rx[..., None] * _REL_X + ry[..., None] * _REL_Y, 0.0)

        # Allies skip the viewer's own column: slot k holds ally k before the viewer, ally k + 1 from it on.
        # Shifting only this [A, A] block (not the enemies) keeps the big enemy block a plain broadcast.
        after_self = np.arange(A - 1)[None, :] >= np.arange(A)[:, None]  # [A, A - 1]

        def skip(m):
            return jnp.where(after_self, m[:, 1:A], m[:, :A - 1])

        ally_features = jnp.where(after_self[..., None], visible_features[None, 1:A], visible_features[None, :A - 1])
        allies = block(skip(seen), ally_features, skip(rel_x), skip(rel_y))
        enemies = block(seen[:, A:], visible_features[None, A:], rel_x[:, A:], rel_y[:, A:])
        own = jnp.concatenate([health[:A, None], state.position[:A] / jnp.array([p.map_width, p.map_height]),
                               cooldown[:A, None], type_bits[:A]], axis=-1) * alive[:A, None]
        # Joining the blocks along the unit axis (before flattening) lets XLA write them straight into
        # one buffer; joining the flattened rows costs extra full passes over the observations.
        others = jnp.concatenate([allies, enemies], axis=1).reshape(A, -1)
        return jnp.concatenate([others, own], axis=-1)

    def global_state(self, state: SMAXState, params=None) -> jax.Array:
        """[state_dim]: each unit's health fraction, position, cooldown and type bits (zero when dead),
        then every unit's team (0 ally, 1 enemy) and type id."""
        p = self._params(params)
        stats = unit_stats(p, state.unit_type)
        per_unit = jnp.concatenate([
            (state.health / stats.health)[:, None], state.position, state.cooldown[:, None],
            jax.nn.one_hot(state.unit_type, NUM_UNIT_TYPES, dtype=jnp.float32),
        ], axis=-1) * state.alive[:, None]
        team = (jnp.arange(self.num_units) >= self.num_allies).astype(jnp.float32)
        return jnp.concatenate([per_unit.reshape(-1), team, state.unit_type.astype(jnp.float32)])

    def attack_targets(self, state: SMAXState) -> jax.Array:
        """[U] int32 unit each unit attacked in the last step, -1 for none (for rendering)."""
        return self._decode(jnp.where(state.last_attack > 0, state.last_attack, STOP))[1]


    def __repr__(self) -> str:
        return f"SMAX({self.scenario_name!r}: {self.scenario.describe()})"
