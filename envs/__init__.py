"""JAX-native vectorisable environments with one functional API (see `envs.core`).

    env = envs.make("CartPole-v1")
    obs, state = env.reset(key)
    env = envs.make("smax", scenario="3m")        # multi-agent: obs [agents, obs_dim]
"""

from __future__ import annotations

from typing import Callable

from envs.core import Box, Discrete, Environment, unknown_name
from envs.wrappers import AgentAxis, AutoReset, EpisodeStatistics, Wrapper, as_multi_agent, episode_over

_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str, factory: Callable[..., Environment], *, overwrite: bool = False) -> None:
    """Make `envs.make(name, **kwargs)` call `factory(**kwargs)`."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"environment {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    """Names accepted by `make`, sorted."""
    return sorted(_REGISTRY)


def make(name: str, **kwargs) -> Environment:
    """Build a registered environment; an unknown name lists the known ones."""
    if name not in _REGISTRY:
        raise unknown_name("environment", name, _REGISTRY)
    return _REGISTRY[name](**kwargs)


def _cartpole(**kwargs):
    from envs.classic.cartpole import CartPole
    return CartPole(**kwargs)


def _smax(scenario="3m", **kwargs):
    from envs.smax import SMAX
    return SMAX(scenario, **kwargs)


def _jaxmarl(env_id: str, **kwargs):
    from envs.adapters import FromJaxMARL
    return FromJaxMARL(env_id, **kwargs)


def _gymnax(env_id: str, **kwargs):
    from envs.adapters import FromGymnax
    return FromGymnax(env_id, **kwargs)


def _brax(env_name: str, **kwargs):
    from envs.adapters import FromBrax
    return FromBrax(env_name, **kwargs)


def _craftax(env_id: str = "Craftax-Classic-Symbolic-v1", **kwargs):
    from envs.adapters import FromCraftax
    return FromCraftax(env_id, **kwargs)


def _xminigrid(env_id: str = "MiniGrid-Empty-8x8", **kwargs):
    from envs.adapters.xminigrid import FromXMiniGrid
    return FromXMiniGrid(env_id, **kwargs)


def _gymnasium(env_id: str = "CartPole-v1", **kwargs):
    from envs.adapters.gymnasium import FromGymnasium
    return FromGymnasium(env_id, **kwargs)


def _jaxmarl_smax(scenario="3m", **kwargs):
    from envs.smax.parity import reference_env
    return reference_env(scenario, **kwargs)


register("CartPole-v1", _cartpole)
register("smax", _smax)
register("jaxmarl", _jaxmarl)  # any jaxmarl env in our array-first API: make("jaxmarl", env_id=...)
register("gymnax", _gymnax)  # any gymnax 1.x env: make("gymnax", env_id="Acrobot-v1")
register("brax", _brax)  # make("brax", env_name="halfcheetah", backend="generalized")
register("craftax", _craftax)  # make("craftax", env_id="Craftax-Classic-Symbolic-v1")
register("xminigrid", _xminigrid)  # make("xminigrid", env_id="MiniGrid-DoorKey-6x6")
register("gymnasium", _gymnasium)  # stepped on the host: make("gymnasium", env_id="ALE/Pong-v5", obs_type="ram")
register("jaxmarl-smax", _jaxmarl_smax)  # jaxmarl's HeuristicEnemySMAX by scenario name (the reference)

def __getattr__(name: str):
    """Import subpackages on first use (`envs.smax.register_scenario(...)` after a plain `import envs`)."""
    if name in ("smax", "classic", "adapters", "rendering"):
        import importlib
        return importlib.import_module(f"envs.{name}")
    raise AttributeError(f"module 'envs' has no attribute {name!r}")


__all__ = ["AgentAxis", "AutoReset", "Box", "Discrete", "Environment", "EpisodeStatistics", "Wrapper", "as_multi_agent", "episode_over",
           "make", "register", "registered"]
