"""jaxrl.dot.dot_general: the same values and gradients as lax.dot_general for Flax's Dense layers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.dot import dot_general, weight_grad


@pytest.mark.parametrize("features, axis, x_shape", [
    (24, -1, (2, 3, 5, 16)),  # Dense on [B, G, S, D]; K=16 < N=24: x is transposed
    (8, -1, (6, 40)),  # K=40 > N=8: dy is transposed
    ((3, 2, 4), -1, (2, 7, 16)),  # DenseGeneral to [3, H, Dh] (a qkv projection)
    (16, (-2, -1), (2, 7, 2, 4)),  # DenseGeneral from [H, Dh] (an attention output)
])
def test_dense_values_and_gradients_match_lax(features, axis, x_shape):
    x = jax.random.normal(jax.random.key(0), x_shape)
    layer = lambda dg: nn.DenseGeneral(features, axis=axis, dot_general=dg)
    params = layer(jax.lax.dot_general).init(jax.random.key(1), x)
    cotangent = jax.random.normal(jax.random.key(2), layer(jax.lax.dot_general).apply(params, x).shape)

    def loss(dg, params, x):
        return jnp.sum(layer(dg).apply(params, x) * cotangent)

    np.testing.assert_allclose(layer(dot_general).apply(params, x), layer(jax.lax.dot_general).apply(params, x),
                               rtol=1e-5, atol=1e-5)
    ours = jax.jit(jax.grad(lambda p, x: loss(dot_general, p, x), argnums=(0, 1)))(params, x)
    reference = jax.grad(lambda p, x: loss(jax.lax.dot_general, p, x), argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_batched_contractions_fall_back_to_lax():
    x, w = jnp.ones((3, 4, 5)), jnp.ones((3, 5, 2))
    numbers = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(dot_general(x, w, numbers), jax.lax.dot_general(x, w, numbers))


def test_weight_grad_is_x_transposed_dy():
    x, dy = jax.random.normal(jax.random.key(0), (9, 3)), jax.random.normal(jax.random.key(1), (9, 5))
    np.testing.assert_allclose(jax.jit(weight_grad)(x, dy), x.T @ dy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(weight_grad)(dy, x), dy.T @ x, rtol=1e-5, atol=1e-5)
