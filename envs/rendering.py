"""Rendering helpers shared by the environments that can draw themselves.

An env type that can draw its states registers `render_frames(env, states, params=None) -> list of PIL
images` here (`register_renderer`, done by the env's package, so that the env module itself never imports its
drawing code); the training loop then saves a GIF of an evaluation episode.
"""

from __future__ import annotations

from typing import Callable

_RENDERERS: dict[type, Callable] = {}


def register_renderer(env_type: type, render_frames: Callable) -> None:
    """Make `render_frames(env, states, params=None)` draw the states of `env_type` (and its subclasses)."""
    _RENDERERS[env_type] = render_frames


def renderer(env) -> Callable | None:
    """The registered `render_frames` for `env` (looked up on the unwrapped env's type), or None."""
    base = getattr(env, "unwrapped", env)
    return next((_RENDERERS[t] for t in type(base).__mro__ if t in _RENDERERS), None)


def render_frames(env, states, params=None) -> list:
    """One RGB PIL image per state of `env`; a ValueError when its type draws nothing."""
    draw = renderer(env)
    if draw is None:
        raise ValueError(f"{env!r} cannot draw its states (no renderer registered for its type)")
    return draw(getattr(env, "unwrapped", env), states, params)


def save_gif(frames: list, path: str, fps: float = 4.0) -> str:
    """Write PIL images as an endlessly looping animated GIF; returns the path."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to save")
    # Each frame's palette by the fast octree: Pillow's default (median cut) takes three times as long.
    frames = [f.quantize(256, method=Image.Quantize.FASTOCTREE) if f.mode == "RGB" else f for f in frames]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return path
