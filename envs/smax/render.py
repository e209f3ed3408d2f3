"""Draw SMAX episodes: a sequence of states -> an animated GIF and a PNG frame (matplotlib + Pillow).

    states = episode_states(env, jax.random.PRNGKey(0))          # random legal allies
    gif, png = render_episode(env, states, "out/")               # in a notebook:
    IPython.display.Image(filename=gif)

From a shell: `python -m envs.smax.render --scenario 3m --out DIR [--seed 0] [--fps 4]` (random legal actions).
A trained policy's battle is drawn on jaxrl's side (envs never imports jaxrl): `python -m jaxrl.evaluate
--workdir=RUN` writes its `eval_episode.gif`, and in Python
`render_episode(actor.env, actor.episode_states(key), DIR)` with `actor = jaxrl.load_policy(RUN)`.
Units are circles (allies blue, enemies red) sized by radius and labelled with their type letter, a
health bar above each; a line joins every attacker to the unit it attacked in the last step.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envs.rendering import save_gif
from envs.smax.env import SMAX, SMAXState
from envs.smax.heuristic import sample_true
from envs.smax.units import UNIT_TYPES

TEAM_COLOURS = ("tab:blue", "tab:red")

# (key, obs [A, obs_dim], mask bool [A, num_actions]) -> actions int32 [A]
RenderPolicy = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def random_policy(key, obs, mask):
    """Uniformly random legal actions."""
    return sample_true(key, mask)


def episode_states(env: SMAX, key: jax.Array, policy: RenderPolicy = random_policy, params=None) -> list[SMAXState]:
    """The states of one episode, from the reset to the last step (at most `max_episode_steps` + 1)."""
    reset_key, key = jax.random.split(key)
    num_steps = int(env._params(params).max_steps)

    @jax.jit
    def run(reset_key, key):
        obs, state = env.reset(reset_key, params)

        def body(carry, step_key):
            obs, state, over = carry
            act_key, env_key = jax.random.split(step_key)
            actions = policy(act_key, obs, env.avail_actions(state, params))
            obs, state, _, _, info = env.step(env_key, state, actions, params)
            return (obs, state, info["episode_over"]), (state, info["episode_over"])

        _, (states, over) = jax.lax.scan(body, (obs, state, jnp.bool_(False)), jax.random.split(key, num_steps))
        return state, states, over

    first, states, over = jax.device_get(run(reset_key, key))
    length = int(np.argmax(over)) + 1 if over.any() else num_steps
    return [first] + [jax.tree.map(lambda x: x[t], states) for t in range(length)]


def _frame_axes(ax, env: SMAX, params=None) -> None:
    """The map's extent and background, without ticks: what every frame shares."""
    p = env._params(params)
    ax.set_xlim(0, float(p.map_width))
    ax.set_ylim(0, float(p.map_height))
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_facecolor("#f4f1ea")


def _draw_units(ax, env: SMAX, state: SMAXState, targets: np.ndarray, step: int | None) -> list:
    """Add one state's units, health bars and attack lines to `ax` (limits fixed already: `add_artist` skips
    matplotlib's data-limit updates, most of a frame's time); returns the artists added."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, Rectangle

    position = np.asarray(state.position)
    health = np.asarray(state.health)
    unit_type = np.asarray(state.unit_type)
    alive = health > 0
    team = (np.arange(env.num_units) >= env.num_allies).astype(int)
    artists = []
    for u in np.flatnonzero(alive & (targets >= 0)):
        (x0, y0), (x1, y1) = position[u], position[targets[u]]
        artists.append(Line2D([x0, x1], [y0, y1], color=TEAM_COLOURS[team[u]], lw=1.2, alpha=0.8, zorder=1))
    for u in range(env.num_units):
        x, y = position[u]
        kind = UNIT_TYPES[unit_type[u]]
        colour = TEAM_COLOURS[team[u]]
        if not alive[u]:
            artists.append(Line2D([x], [y], marker="x", color=colour, alpha=0.3, ms=4, zorder=1))
            continue
        bar_w, bar_y = 1.2, y + kind.radius + 0.25
        frac = float(np.clip(health[u] / kind.health, 0.0, 1.0))
        artists += [Circle((x, y), kind.radius, color=colour, zorder=2),
                    Rectangle((x - bar_w / 2, bar_y), bar_w, 0.22, color="0.75", zorder=2),
                    Rectangle((x - bar_w / 2, bar_y), bar_w * frac, 0.22,
                              color="tab:green" if frac > 0.3 else "tab:orange", zorder=3)]
    for artist in artists:
        ax.add_artist(artist)
    for u in np.flatnonzero(alive):
        x, y = position[u]
        artists.append(ax.text(x, y, UNIT_TYPES[unit_type[u]].short, ha="center", va="center", fontsize=6,
                               color="white", zorder=3))
    allies, enemies = int(alive[:env.num_allies].sum()), int(alive[env.num_allies:].sum())
    title = f"{env.scenario_name}   allies {allies}/{env.num_allies}   enemies {enemies}/{env.num_enemies}"
    ax.set_title(title if step is None else f"step {step}   {title}", fontsize=8)
    return artists


def render_frames(env: SMAX, states: Sequence[SMAXState], params=None, size_px: int = 480) -> list:
    """One RGB PIL image per state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    if not states:
        return []
    dpi = 100
    fig = Figure(figsize=(size_px / dpi, size_px / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.9))
    _frame_axes(ax, env, params)
    # every state's attack targets in one call (one dispatch, not one per frame)
    targets = np.asarray(jax.vmap(env.attack_targets)(jax.tree.map(lambda *x: np.stack(x), *states)))
    frames = []
    for t, state in enumerate(states):
        artists = _draw_units(ax, env, state, targets[t], t)
        canvas.draw()
        frames.append(Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy()))
        for artist in artists:  # the next frame draws on the same axes
            artist.remove()
    return frames


def render_episode(env: SMAX, states: Sequence[SMAXState], out_dir: str, name: str | None = None,
                   fps: float = 4.0, frame: int | None = None, params=None) -> tuple[str, str]:
    """Write `<name>.gif` (the episode) and `<name>.png` (frame `frame`, default the middle) to `out_dir`.

    Returns the two paths.
    """
    if not states:
        raise ValueError("no states to render")
    os.makedirs(out_dir, exist_ok=True)
    name = name or f"smax_{env.scenario_name}"
    frames = render_frames(env, states, params)
    gif = os.path.join(out_dir, f"{name}.gif")
    png = os.path.join(out_dir, f"{name}.png")
    save_gif(frames, gif, fps)
    frames[len(frames) // 2 if frame is None else frame].save(png)
    return gif, png


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Render one SMAX episode to an animated GIF and a PNG frame.")
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=float, default=4.0)
    args = parser.parse_args(argv)
    env = SMAX(args.scenario)
    states = episode_states(env, jax.random.PRNGKey(args.seed))
    gif, png = render_episode(env, states, args.out, fps=args.fps)
    print(f"{len(states) - 1} steps -> {gif}, {png}")


if __name__ == "__main__":
    main()
