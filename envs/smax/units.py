"""StarCraft II unit types as SMAX uses them: one row per type, looked up by integer type id."""

from __future__ import annotations

from typing import NamedTuple


class UnitType(NamedTuple):
    name: str
    short: str  # the letter used in scenario names ("3s5z": stalkers and zealots)
    speed: float  # map units per second of game time
    damage: float  # health removed per successful attack
    attack_range: float
    sight_range: float
    radius: float
    health: float
    cooldown: float  # seconds between attacks, before jitter


UNIT_TYPES: tuple[UnitType, ...] = (
    UnitType("marine", "m", 3.15, 9.0, 5.0, 9.0, 0.375, 45.0, 0.61),
    UnitType("marauder", "M", 2.25, 10.0, 6.0, 10.0, 0.5625, 125.0, 1.07),
    UnitType("stalker", "s", 4.13, 13.0, 6.0, 10.0, 0.625, 160.0, 1.87),
    UnitType("zealot", "Z", 3.15, 8.0, 2.0, 9.0, 0.5, 150.0, 0.86),
    UnitType("zergling", "z", 4.13, 5.0, 2.0, 8.0, 0.375, 35.0, 0.5),
    UnitType("hydralisk", "h", 3.15, 12.0, 5.0, 9.0, 0.625, 80.0, 0.59),
)
NUM_UNIT_TYPES = len(UNIT_TYPES)


def unit_type_id(ref: int | str) -> int:
    """Type id from an id, a full name ("stalker") or a shorthand ("s"; case matters: "M" vs "m")."""
    if isinstance(ref, int):
        if not 0 <= ref < NUM_UNIT_TYPES:
            raise ValueError(f"unit type id {ref} out of range [0, {NUM_UNIT_TYPES})")
        return ref
    for i, t in enumerate(UNIT_TYPES):
        if ref in (t.name, t.short):
            return i
    known = ", ".join(f"{t.name} ({t.short})" for t in UNIT_TYPES)
    raise ValueError(f"unknown unit type {ref!r}; known: {known}")
