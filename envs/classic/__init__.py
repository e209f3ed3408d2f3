"""Classic single-agent control tasks."""
from envs.classic.cartpole import CartPole, CartPoleParams, CartPoleState

__all__ = ["CartPole", "CartPoleParams", "CartPoleState"]
