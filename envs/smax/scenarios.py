"""Scenarios: which units fight on each side and where they start.

A scenario is static configuration (it fixes array shapes). Start rules are pure functions
`rule(key, num_allies, num_enemies, width, height) -> positions [U, 2]`, allies first.

    envs.smax.register_scenario("4s_vs_6z", Scenario(team(stalker=4), team(zealot=6)))
    env = envs.make("smax", scenario="4s_vs_6z")
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from envs.smax.units import NUM_UNIT_TYPES, UNIT_TYPES, unit_type_id

StartRule = Callable[[jax.Array, int, int, float, float], jax.Array]


def team(**counts: int) -> tuple[int, ...]:
    """Unit type ids for one side, e.g. `team(stalker=2, zealot=3)`, in the order given."""
    return tuple(unit_type_id(name) for name, n in counts.items() for _ in range(n))


# ------------------------------------------------------------------------------------------------
# Start rules
#
# Each rule hashes its key once: one `uniform` draw, cut into the pieces it needs (`_pieces`). Every
# draw is a threefry hash that XLA:CPU unrolls into a few hundred operations; drawn per quantity,
# SMACv2's start took about 25 of them and its reset compiled 4-5x longer than a fixed scenario's.


def _flat(shapes) -> tuple[int]:
    """The shape of `shapes`' uniforms as one flat piece: (the sum of their sizes,)."""
    return (sum(math.prod(shape) for shape in shapes),)


def _pieces(u: jax.Array, shapes) -> list[jax.Array]:
    """Consecutive pieces of the flat `u` [_flat(shapes)], reshaped to `shapes`."""
    if u.shape != _flat(shapes):
        raise ValueError(f"expected {_flat(shapes)[0]} uniforms for pieces {shapes}, got shape {u.shape}")
    bounds = list(itertools.accumulate(math.prod(shape) for shape in shapes[:-1]))
    return [piece.reshape(shape) for piece, shape in zip(jnp.split(u, bounds), shapes)]


def _between(u, low, high):
    """Uniforms in [0, 1) moved to [low, high)."""
    return low + u * (high - low)


def _below(u, n: int) -> jax.Array:
    """int32 in {0, ..., n-1} from uniforms in [0, 1) (float32 has 23 random bits: bias below 1e-6)."""
    return jnp.minimum(jnp.floor(u * n).astype(jnp.int32), n - 1)


def line_start(key, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    """[U, 2]: allies within +-2 of (W/4, H/2), enemies within +-2 of (3W/4, H/2)."""
    centre_x = jnp.where(jnp.arange(num_allies + num_enemies) < num_allies, width / 4, width * 3 / 4)
    centres = jnp.stack([centre_x, jnp.full_like(centre_x, height / 2)], axis=-1)
    return centres + jax.random.uniform(key, (num_allies + num_enemies, 2), minval=-2.0, maxval=2.0)


# Each rule below is a pair: the shapes of the uniforms it takes, and the rule computed from them.


def _surround_shapes(num_inside: int, num_outside: int):
    return (num_inside, 2), (4, 1), (num_outside,), (num_outside, 2)


def _surround(u, num_inside: int, num_outside: int, width, height) -> tuple[jax.Array, jax.Array]:
    """([inside, 2], [outside, 2]): one group around the centre, the other in 4 groups on the diagonals, each
    at a uniform fraction of the way from a map corner to the centre."""
    inside_u, frac, group_u, noise_u = _pieces(u, _surround_shapes(num_inside, num_outside))
    centre = jnp.array([width / 2, height / 2])
    corners = jnp.array([[0.0, 0.0], [0.0, height], [width, 0.0], [width, height]])
    group_centres = frac * centre + (1 - frac) * corners
    group = _below(group_u, 4)
    return centre + _between(inside_u, -2.0, 2.0), group_centres[group] + _between(noise_u, -2.0, 2.0)


def _surround_start_shapes(num_allies: int, num_enemies: int):
    return (), _flat(_surround_shapes(num_allies, num_enemies)), _flat(_surround_shapes(num_enemies, num_allies))


def _surround_start(u, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    pick, ally_u, enemy_u = _pieces(u, _surround_start_shapes(num_allies, num_enemies))
    allies_in, enemies_out = _surround(ally_u, num_allies, num_enemies, width, height)
    enemies_in, allies_out = _surround(enemy_u, num_enemies, num_allies, width, height)
    return jnp.where(pick < 0.5, jnp.concatenate([allies_in, enemies_out]),
                     jnp.concatenate([allies_out, enemies_in]))


def _reflect_start_shapes(num_allies: int, num_enemies: int):
    return (num_allies, 2), (num_enemies - min(num_allies, num_enemies), 2)


def _reflect_start(u, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    ally_u, extra_u = _pieces(u, _reflect_start_shapes(num_allies, num_enemies))
    allies = ally_u * jnp.array([width / 2, height])
    mirrored = allies[:min(num_allies, num_enemies)] * jnp.array([-1.0, 1.0]) + jnp.array([width, 0.0])
    extra = _between(extra_u, jnp.array([width / 2, 0.0]), jnp.array([width, height]))
    return jnp.concatenate([allies, mirrored, extra])


def _surround_or_reflect_shapes(num_allies: int, num_enemies: int):
    surround, reflect = _surround_start_shapes(num_allies, num_enemies), _reflect_start_shapes(num_allies, num_enemies)
    return (), _flat(surround), _flat(reflect)


def _surround_or_reflect_start(u, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    pick, surround_u, reflect_u = _pieces(u, _surround_or_reflect_shapes(num_allies, num_enemies))
    return jnp.where(pick < 0.5, _surround_start(surround_u, num_allies, num_enemies, width, height),
                     _reflect_start(reflect_u, num_allies, num_enemies, width, height))


def _uniforms(key, shapes) -> jax.Array:
    """[_flat(shapes)] uniforms in [0, 1): one hash of `key`."""
    return jax.random.uniform(key, _flat(shapes))


def surround_start(key, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    """[U, 2]: a random team is surrounded by the other (SMACv2's "surrounded" start)."""
    u = _uniforms(key, _surround_start_shapes(num_allies, num_enemies))
    return _surround_start(u, num_allies, num_enemies, width, height)


def reflect_start(key, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    """[U, 2]: allies uniform on the left half, enemies at their mirror images (SMACv2's "reflected").

    Enemies beyond the number of allies are uniform on the right half.
    """
    u = _uniforms(key, _reflect_start_shapes(num_allies, num_enemies))
    return _reflect_start(u, num_allies, num_enemies, width, height)


def surround_or_reflect_start(key, num_allies: int, num_enemies: int, width, height) -> jax.Array:
    """[U, 2]: SMACv2's start, surrounded or reflected with equal odds."""
    u = _uniforms(key, _surround_or_reflect_shapes(num_allies, num_enemies))
    return _surround_or_reflect_start(u, num_allies, num_enemies, width, height)


START_RULES: dict[str, StartRule] = {
    "line": line_start,
    "surround": surround_start,
    "reflect": reflect_start,
    "surround_or_reflect": surround_or_reflect_start,
}


# ------------------------------------------------------------------------------------------------
# Scenarios


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One battle setup.

    allies, enemies: unit types per side (ids, names or shorthands; see `team`). With
        `random_unit_types` only their lengths matter.
    start: a name in START_RULES or a callable `(key, num_allies, num_enemies, width, height) -> [U, 2]`.
    random_unit_types: SMACv2-style: each episode draws every ally's type uniformly; enemies mirror
        the allies' types (extra enemies draw their own).
    """

    allies: Sequence[int | str]
    enemies: Sequence[int | str]
    start: str | StartRule = "line"
    random_unit_types: bool = False

    def __post_init__(self):
        object.__setattr__(self, "allies", tuple(unit_type_id(u) for u in self.allies))
        object.__setattr__(self, "enemies", tuple(unit_type_id(u) for u in self.enemies))
        if not self.allies or not self.enemies:
            raise ValueError("a scenario needs at least one ally and one enemy")
        if isinstance(self.start, str) and self.start not in START_RULES:
            raise ValueError(f"unknown start rule {self.start!r}; known: {', '.join(START_RULES)}")

    @property
    def num_allies(self) -> int:
        return len(self.allies)

    @property
    def num_enemies(self) -> int:
        return len(self.enemies)

    @property
    def unit_types(self) -> tuple[int, ...]:
        """[U] type ids, allies first (placeholders when `random_unit_types`)."""
        return self.allies + self.enemies

    def start_positions(self, key, width, height) -> jax.Array:
        """[U, 2] start positions, allies first."""
        rule = START_RULES[self.start] if isinstance(self.start, str) else self.start
        return rule(key, self.num_allies, self.num_enemies, width, height)

    def draw_unit_types(self, key) -> jax.Array:
        """[U] int32 type ids for one episode."""
        if not self.random_unit_types:
            return jnp.array(self.unit_types, dtype=jnp.int32)
        n_mirrored = min(self.num_allies, self.num_enemies)
        drawn = _below(jax.random.uniform(key, (self.num_allies + self.num_enemies - n_mirrored,)), NUM_UNIT_TYPES)
        return jnp.concatenate([drawn[:self.num_allies], drawn[:n_mirrored], drawn[self.num_allies:]])

    def describe(self) -> str:
        """E.g. "2 stalker + 3 zealot vs 2 stalker + 3 zealot"."""
        if self.random_unit_types:
            return f"{self.num_allies} vs {self.num_enemies} random units"

        def side(types):
            return " + ".join(f"{n} {UNIT_TYPES[t].name}" for t, n in collections.Counter(types).items())

        return f"{side(self.allies)} vs {side(self.enemies)}"


def _smacv2(n: int) -> Scenario:
    return Scenario(team(marine=n), team(marine=n), start="surround_or_reflect", random_unit_types=True)


_SCENARIOS: dict[str, Scenario] = {
    "3m": Scenario(team(marine=3), team(marine=3)),
    "8m": Scenario(team(marine=8), team(marine=8)),
    "25m": Scenario(team(marine=25), team(marine=25)),
    "5m_vs_6m": Scenario(team(marine=5), team(marine=6)),
    "10m_vs_11m": Scenario(team(marine=10), team(marine=11)),
    "27m_vs_30m": Scenario(team(marine=27), team(marine=30)),
    "2s3z": Scenario(team(stalker=2, zealot=3), team(stalker=2, zealot=3)),
    "3s5z": Scenario(team(stalker=3, zealot=5), team(stalker=3, zealot=5)),
    "3s5z_vs_3s6z": Scenario(team(stalker=3, zealot=5), team(stalker=3, zealot=6)),
    "3s_vs_5z": Scenario(team(stalker=3), team(zealot=5)),
    "6h_vs_8z": Scenario(team(hydralisk=6), team(zealot=8)),
    "smacv2_5_units": _smacv2(5),
    "smacv2_10_units": _smacv2(10),
    "smacv2_20_units": _smacv2(20),
}


def register_scenario(name: str, scenario: Scenario, *, overwrite: bool = False) -> None:
    """Make `envs.make("smax", scenario=name)` build `scenario`."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"expected a Scenario, got {type(scenario).__name__}")
    if name in _SCENARIOS and not overwrite:
        raise ValueError(f"scenario {name!r} is already registered (pass overwrite=True to replace it)")
    _SCENARIOS[name] = scenario


def scenario_names() -> list[str]:
    """Registered scenario names, in registration order."""
    return list(_SCENARIOS)


def get_scenario(name: str | Scenario) -> Scenario:
    """The scenario registered as `name` (a Scenario passes through); unknown names list the known ones."""
    if isinstance(name, Scenario):
        return name
    if name not in _SCENARIOS:
        raise ValueError(f"unknown SMAX scenario {name!r}; known scenarios: {', '.join(_SCENARIOS)}")
    return _SCENARIOS[name]
