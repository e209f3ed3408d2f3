"""Rendering helpers shared by the environments that can draw themselves.

An env that can draw its states offers `render_frames(states, params=None) -> list of PIL images`;
the training loop then saves a GIF of an evaluation episode.
"""

from __future__ import annotations


def save_gif(frames: list, path: str, fps: float = 4.0) -> str:
    """Write PIL images as an endlessly looping animated GIF; returns the path."""
    if not frames:
        raise ValueError("no frames to save")
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return path
