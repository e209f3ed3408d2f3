"""`jit_method`: `jax.jit` for a method, compiled per instance and released with it.

`functools.partial(jax.jit, static_argnums=0)` on a method makes `self` part of the jit cache key, and
the cache holds it for the life of the process: every algorithm ever built would stay alive with all of
its compiled programs (each maps memory; a long test session or notebook then runs out of memory maps).
"""

from __future__ import annotations

import functools
import weakref

import jax


class jit_method:
    """Decorator: `@jit_method(static_argnums=(2,))`, argument numbers counted as for the method (self is 0).

    The first access through an instance makes a `jax.jit` of the method bound to a weak reference to
    the instance and keeps it in the instance's `__dict__`, so the compiled programs live exactly as
    long as the instance.
    """

    def __init__(self, fn=None, *, static_argnums: tuple[int, ...] = ()):
        self.static_argnums = tuple(i - 1 for i in static_argnums if i > 0)
        if fn is not None:  # used bare, as @jit_method
            self(fn)

    def __call__(self, fn):  # used as @jit_method(static_argnums=...)
        self.fn = fn
        functools.update_wrapper(self, fn)
        return self

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        ref, fn = weakref.ref(instance), self.fn
        jitted = jax.jit(functools.wraps(fn)(lambda *args: fn(ref(), *args)), static_argnums=self.static_argnums)
        instance.__dict__[self.name] = jitted  # later lookups find it first (this is a non-data descriptor)
        return jitted
