"""What this machine's arithmetic allows for group sampling and one GRPO step on a pretrained model: each matmul of a
decoder layer timed alone in float32, under XLA (jaxrl's kernels) and under torch (transformers' and TRL's), and the
floor those rates set on the work of `lm_generate.py` and `lm_grpo.py` (issue 60's speed goals are ratios to
transformers and TRL, which the floor bounds); for the GRPO step also the floor of the smaller work jaxrl does (each
prompt once per group).

    python benchmarks/lm_ceiling.py                          # SmolLM2-135M-Instruct, both benchmarks' default shapes
    python benchmarks/lm_ceiling.py --trl-seconds 102.6 --transformers-rate 141.7   # and what the goals then need

The floor counts only the weight matmuls (every layer's q, k, v, o, gate, up and down projections and the vocabulary
projection), each at the rate measured for its own shape: attention, norms, sampling and the optimiser are left out,
so the true minimum is higher still. Its work:

- group sampling (`lm_generate.py`): B prompts' prefill (P rows each, shared by the group), then N decoding steps of
  B x G rows;
- one GRPO step (`lm_grpo.py`'s jaxrl side): that sampling with its N, then a forward and a backward pass over the
  B x G sequences of P + N slots in one batch (each forward matmul X W costs two more in the backward: X^T dY and
  dY W^T, timed at their own shapes). The old policy's log-probabilities come from sampling (one pass, no KL): no
  extra forward.

Prints each shape's GFLOP/s under both, the floor in seconds (and tokens/s for sampling) under each, and, given the
peers' measured figures from the same session, the rate each goal would need as a share of the floor's.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lm_generate import timed  # noqa: E402  (units a second, one figure per timed call)


def weight_shapes(config) -> list[tuple[str, int, int, int]]:
    """(name, count per model, K, N) of every weight matmul X [M, K] @ W [K, N] of a decoder-only model."""
    d, hd = config.hidden_size, config.head_dim
    kv = config.num_kv_heads * hd
    per_layer = [("q", d, config.num_heads * hd), ("k", d, kv), ("v", d, kv),
                 ("o", config.num_heads * hd, d), ("gate", d, config.intermediate_size),
                 ("up", d, config.intermediate_size), ("down", config.intermediate_size, d)]
    return [(name, config.num_layers, k, n) for name, k, n in per_layer] + [("vocab", 1, d, config.vocab_size)]


def inner_count(m: int, k: int, n: int) -> int:
    """Matmuls per timed call: about 2 GFLOP of them, so that a call's dispatch does not count against small shapes."""
    return max(1, int(2e9 / (2 * m * k * n)))


def xla_call(m: int, k: int, n: int, count: int):
    """A call of `count` float32 [m, k] @ [k, n] under XLA, compiled: one loop, the left operand scaled at each step
    so that none is hoisted out of it."""
    import jax
    import jax.numpy as jnp

    x, w = jax.random.normal(jax.random.key(0), (m, k)), jax.random.normal(jax.random.key(1), (k, n))

    @jax.jit
    def loop(x, w):
        def body(_, carry):
            x, total = carry
            return x * 1.0000001, total + jnp.dot(x, w)[0, 0]
        return jax.lax.fori_loop(0, count, body, (x, jnp.float32(0.0)))[1]

    return lambda: jax.block_until_ready(loop(x, w))


def torch_call(m: int, k: int, n: int, count: int):
    """A call of `count` float32 [m, k] @ [k, n] under torch."""
    import torch

    x, w, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)

    def call():
        for _ in range(count):
            torch.mm(x, w, out=out)
    return call


def flops_per_second(make_call, m: int, k: int, n: int, repeats: int) -> float:
    """One engine's float32 FLOP/s on [m, k] @ [k, n] (`make_call`: `xla_call` or `torch_call`): the median of
    `repeats` calls after a warm-up one, each of `inner_count` matmuls."""
    count = inner_count(m, k, n)
    call = make_call(m, k, n, count)
    call()
    return statistics.median(timed(call, repeats, 2 * m * k * n * count))


def matmul_seconds(make_call, shapes, rows: int, backward: bool, repeats: int, rates: dict) -> float:
    """Seconds of every weight matmul (`shapes`) on `rows` rows: forward, and with `backward` also X^T dY [k, rows] @
    [rows, n] and dY W^T [rows, n] @ [n, k]. Each distinct shape is timed once; `rates` keeps FLOP/s by shape."""
    total = 0.0
    for _, count, k, n in shapes:
        for shape in [(rows, k, n)] + ([(k, rows, n), (rows, n, k)] if backward else []):
            if shape not in rates:
                rates[shape] = flops_per_second(make_call, *shape, repeats)
            total += count * 2 * shape[0] * shape[1] * shape[2] / rates[shape]
    return total


def sampling_seconds(make_call, shapes, prompts: int, group: int, new_tokens: int, prompt_len: int, repeats: int,
                     rates: dict) -> float:
    """Seconds of group sampling's matmuls: the prompts' prefill (shared by each group), then `new_tokens` decoding
    steps of prompts x group rows."""
    prefill = matmul_seconds(make_call, shapes, prompts * prompt_len, False, repeats, rates)
    return prefill + new_tokens * matmul_seconds(make_call, shapes, prompts * group, False, repeats, rates)


def grpo_seconds(make_call, shapes, prompts: int, group: int, new_tokens: int, prompt_len: int, repeats: int,
                 rates: dict, shared_prompts: bool = False) -> float:
    """Seconds of one GRPO step's matmuls: its sampling, then the forward and backward pass over its sequences: every
    completion with its prompt (TRL's work), or with `shared_prompts` as jaxrl's `sampling.score_groups` runs it,
    each prompt once for its group and the members' fed tokens after it (prompts x prompt_len + prompts x group x
    (new_tokens - 1) rows; the vocabulary projection only on the columns that predict a completion token)."""
    if shared_prompts:
        fed = prompts * group * (new_tokens - 1)
        train = (matmul_seconds(make_call, shapes[:-1], prompts * prompt_len + fed, True, repeats, rates)
                 + matmul_seconds(make_call, shapes[-1:], prompts + fed, True, repeats, rates))
    else:
        train = matmul_seconds(make_call, shapes, prompts * group * (prompt_len + new_tokens), True, repeats, rates)
    return sampling_seconds(make_call, shapes, prompts, group, new_tokens, prompt_len, repeats, rates) + train


class Floor(NamedTuple):
    """One engine's floor, in seconds: the sampling, one GRPO step with every completion and its prompt (TRL's
    work), and the same step with each prompt once per group (jaxrl's)."""

    sampling: float
    grpo: float
    grpo_shared_prompts: float


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16, help="sampling's B (lm_generate.py)")
    parser.add_argument("--group-size", type=int, default=8, help="G, both")
    parser.add_argument("--new-tokens", type=int, default=64, help="sampling's N")
    parser.add_argument("--prompt-len", type=int, default=64, help="sampling's P (lm_generate.py's padded prompts)")
    parser.add_argument("--grpo-prompts", type=int, default=8, help="the GRPO step's B (lm_grpo.py)")
    parser.add_argument("--grpo-new-tokens", type=int, default=48)
    parser.add_argument("--grpo-prompt-len", type=int, default=0, help="0: the addition task's own prompt length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trl-seconds", type=float, default=None, help="TRL's measured s/step, same session")
    parser.add_argument("--transformers-rate", type=float, default=None,
                        help="transformers' measured sampling tokens/s, same session")
    args = parser.parse_args()

    import torch

    from jaxrl import models
    from report import machine

    config, _ = models.read_spec(args.model)
    if not args.grpo_prompt_len:
        from lm_grpo import jaxrl_config

        from jaxrl import algos, mesh as mesh_lib

        grpo_args = argparse.Namespace(model=args.model, new_tokens=args.grpo_new_tokens, prompts=args.grpo_prompts,
                                       group_size=args.group_size)
        algo, _ = algos.build(jaxrl_config(grpo_args), mesh_lib.make_mesh())
        args.grpo_prompt_len = algo.parts.policy.task.prompt_length
    shapes = weight_shapes(config)
    print(f"{args.model}: sampling {args.prompts} x {args.group_size} x {args.new_tokens} "
          f"(prompts of {args.prompt_len}); "
          f"GRPO step {args.grpo_prompts} x {args.group_size} x {args.grpo_new_tokens} (prompts of "
          f"{args.grpo_prompt_len}); float32; torch {torch.__version__} on {torch.get_num_threads()} threads; "
          f"{machine()}, {datetime.date.today()}", flush=True)
    floor, rates = {}, {"XLA": {}, "torch": {}}
    for side, make_call in (("XLA", xla_call), ("torch", torch_call)):
        grpo = functools.partial(grpo_seconds, make_call, shapes, args.grpo_prompts, args.group_size,
                                 args.grpo_new_tokens, args.grpo_prompt_len, args.repeats, rates[side])
        floor[side] = Floor(sampling_seconds(make_call, shapes, args.prompts, args.group_size, args.new_tokens,
                                             args.prompt_len, args.repeats, rates[side]),
                            grpo(), grpo(shared_prompts=True))
    print(f"{'[m, k] @ [k, n]':>20} {'XLA GFLOP/s':>12} {'torch GFLOP/s':>14}")
    for shape in sorted(rates["XLA"], key=lambda s: -s[0] * s[1] * s[2]):
        print(f"{str(list(shape)):>20} {rates['XLA'][shape] / 1e9:12.1f} {rates['torch'][shape] / 1e9:14.1f}")
    tokens = args.prompts * args.group_size * args.new_tokens
    for side, (sampling, grpo, shared) in floor.items():
        print(f"{side:>5} floor: sampling {sampling:.2f} s ({tokens / sampling:.0f} tokens/s at most); one GRPO step "
              f"{grpo:.1f} s ({shared:.1f} s with each prompt once per group, as jaxrl computes it)")
    if args.trl_seconds:
        need = args.trl_seconds / 3
        print(f"3x TRL ({args.trl_seconds} s/step) is {need:.1f} s/step, against XLA's floor of "
              f"{floor['XLA'].grpo:.1f} s ({floor['XLA'].grpo_shared_prompts:.1f} s for jaxrl's own work); "
              f"TRL itself takes {args.trl_seconds / floor['torch'].grpo:.2f}x torch's floor")
    if args.transformers_rate:
        need = 3 * args.transformers_rate
        print(f"3x transformers ({args.transformers_rate} tokens/s) is {need:.0f} tokens/s: "
              f"{need / (tokens / floor['XLA'].sampling):.0%} of XLA's ceiling")


if __name__ == "__main__":
    main()
