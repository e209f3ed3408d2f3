"""SMAX-style StarCraft battles: allied agents against a heuristic enemy (see `envs.smax.env`).

    env = envs.make("smax", scenario="2s3z")
    envs.smax.register_scenario("4s_vs_6z", Scenario(team(stalker=4), team(zealot=6)))
"""

from envs import rendering
from envs.smax.env import SMAX, SMAXParams, SMAXState
from envs.smax.scenarios import (START_RULES, Scenario, get_scenario, register_scenario, scenario_names,
                                 team)
from envs.smax.units import UNIT_TYPES, UnitType


def _render_frames(env: SMAX, states, params=None) -> list:
    from envs.smax.render import render_frames  # matplotlib is loaded only when something is drawn
    return render_frames(env, states, params)


rendering.register_renderer(SMAX, _render_frames)

__all__ = ["SMAX", "SMAXParams", "SMAXState", "START_RULES", "Scenario", "UNIT_TYPES", "UnitType",
           "get_scenario", "register_scenario", "scenario_names", "team"]
