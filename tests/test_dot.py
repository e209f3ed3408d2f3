"""jaxrl.dot: dot_general gives the same values and gradients as lax.dot_general in Flax's dense layers, and Dense
the same parameters, values and gradients as nn.Dense."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.dot import Dense, bias_grad, dot_general, weight_grad


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


@pytest.mark.parametrize("x_shape, use_bias", [((128, 6, 16), True), ((5, 7), True), ((16,), True), ((3, 4, 9), False)])
def test_dense_has_nn_dense_parameters_values_and_gradients(x_shape, use_bias):
    x = jax.random.normal(jax.random.key(0), x_shape)
    ours, reference = Dense(12, use_bias=use_bias), nn.Dense(12, use_bias=use_bias)
    params = ours.init(jax.random.key(1), x)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference.init(jax.random.key(1), x)), strict=True):
        np.testing.assert_array_equal(a, b)
    cotangent = jax.random.normal(jax.random.key(2), (*x_shape[:-1], 12))
    np.testing.assert_allclose(ours.apply(params, x), reference.apply(params, x), rtol=1e-5, atol=1e-5)

    def loss(layer, params, x):
        return jnp.sum(layer.apply(params, x) * cotangent)

    got = jax.jit(jax.grad(lambda p, x: loss(ours, p, x), argnums=(0, 1)))(params, x)
    expected = jax.grad(lambda p, x: loss(reference, p, x), argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_bias_grad_is_the_sum_over_rows():
    dy = jax.random.normal(jax.random.key(0), (300, 7))
    np.testing.assert_allclose(jax.jit(bias_grad)(dy), dy.sum(0), rtol=1e-5, atol=1e-5)
