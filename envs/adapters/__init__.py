"""Other JAX environment libraries in the `envs` API. Each library is an optional extra, imported only when
one of its environments is built.

- `DictAgents(env)`, `FromJaxMARL(env_or_id)`: JaxMARL's dict-keyed multi-agent API (`envs.adapters.jaxmarl`).
- `FromGymnax(env_or_id)`: gymnax 1.x (classic control, MinAtar, bsuite, misc) (`envs.adapters.gymnax`).
- `FromBrax(env_name)`: Brax's locomotion envs, continuous actions (`envs.adapters.brax`).
- `FromCraftax(env_id)`: Craftax and Craftax-Classic, symbolic observations (`envs.adapters.craftax`).
- `FromXMiniGrid(env_id)`: XLand-MiniGrid's grid worlds (`envs.adapters.xminigrid`; imported on its own, as
  `envs.make("xminigrid", ...)` does).
"""

from envs.adapters.brax import FromBrax
from envs.adapters.craftax import FromCraftax
from envs.adapters.gymnax import FromGymnax
from envs.adapters.jaxmarl import DictAgents, FromJaxMARL

__all__ = ["DictAgents", "FromBrax", "FromCraftax", "FromGymnax", "FromJaxMARL"]
