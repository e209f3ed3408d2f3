"""The orthogonal initialiser: flax's values, and no batched LAPACK QR however it is vmapped."""

import re

import flax.linen as nn
import jax
import numpy as np

from jaxrl import networks


def qr_operand_shapes(hlo: str) -> list[str]:
    """The f32 shapes of the LAPACK QR calls (geqrf) in compiled HLO text."""
    return re.findall(r"= \(f32\[([0-9,]*)\][^\n]*lapack_sgeqrf", hlo)


def test_orthogonal_gives_flax_s_values_under_nested_vmap():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    for shape in [(6, 4), (4, 6), (2, 3, 5)]:  # tall, wide, and a kernel of more than two axes
        def nested(init):
            return jax.vmap(lambda k: jax.vmap(lambda kk: init(kk, shape))(jax.random.split(k, 2)))(keys)
        ours, flax_s = nested(networks.orthogonal(1.5)), nested(nn.initializers.orthogonal(1.5))
        assert ours.shape == (3, 2, *shape)
        np.testing.assert_array_equal(ours, flax_s)


def test_a_vmapped_ensemble_init_runs_one_qr_per_matrix():
    # Two seeds of a two-critic ensemble (nn.vmap inside jax.vmap): every QR of the compiled init is of one
    # matrix, where flax's initialiser batches them (a batched QR can hang XLA:CPU's 2-thread LAPACK pool).
    net = networks.ActorAndCritics(num_outputs=2, hidden_sizes=(8, 8), num_critics=2)  # 1 action dimension
    obs = np.zeros((1, 3), np.float32)

    def init(key):
        return net.init(key, (), obs)

    hlo = jax.jit(jax.vmap(init)).lower(jax.random.split(jax.random.PRNGKey(0), 2)).compile().as_text()
    shapes = qr_operand_shapes(hlo)
    assert shapes and all(len(s.split(",")) == 2 for s in shapes), shapes
