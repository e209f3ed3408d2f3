"""`jit_method`: `jax.jit` for a method, compiled per instance and released with it.

`functools.partial(jax.jit, static_argnums=0)` on a method makes `self` part of the jit cache key, and
the cache holds it for the life of the process: every algorithm ever built would stay alive with all of
its compiled programs (each maps memory; a long test session or notebook then runs out of memory maps).
"""

from __future__ import annotations

import functools
import weakref

import jax


# XLA options for a program that runs once (a run's initial states, an episode to draw): compiled without the
# backend's optimisations, as `jax_disable_most_optimizations` does for every program. SMAX 3m's drawn episode:
# 4.2 s to compile optimised, for a program that then runs in milliseconds; QMIX on 3m's initial states, 9.6 s.
RUNS_ONCE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


class jit_method:
    """Decorator: `@jit_method(static_argnums=(2,))`, argument numbers counted as for the method (self is 0);
    `compiler_options` as `jax.jit` takes them (e.g. `RUNS_ONCE`).

    The first access through an instance makes a `jax.jit` of the method bound to a weak reference to
    the instance and keeps it in the instance's `__dict__`, so the compiled programs live exactly as
    long as the instance.
    """

    def __init__(self, fn=None, *, static_argnums: tuple[int, ...] = (), compiler_options: dict | None = None):
        self.static_argnums = tuple(i - 1 for i in static_argnums if i > 0)
        self.compiler_options = compiler_options
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
        jitted = jax.jit(functools.wraps(fn)(lambda *args: fn(ref(), *args)), static_argnums=self.static_argnums,
                         compiler_options=self.compiler_options)
        instance.__dict__[self.name] = jitted  # later lookups find it first (this is a non-data descriptor)
        return jitted
