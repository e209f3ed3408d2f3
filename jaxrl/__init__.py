"""jaxrl: pure-functional, jitted RL on device meshes (see README.md)."""

__version__ = "0.1.0"
