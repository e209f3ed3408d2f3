"""Multi-turn episodes inside one compiled program: model turns and environment turns alternate, with the KV cache
carried across turns (`envs.text.turns` for the tasks and their slot layout).

    episodes = play(model, params, task, vocab, problems, prompts, keys, group_size=G, temperature=1.0)
    episodes.tokens      # int32 [B, G, N]: the episode after the prompt, N = K (T + O) slots
    episodes.mask        # float32: the model's tokens (what the loss trains)
    episodes.attend      # bool: every real token (the model's and the environment's: what attention sees)
    episodes.turns       # per turn [B, G, K]: reward, taken, well_formed, tool_call, tool_error, solved, anchor

Each prompt is prefilled once and its keys and values are shared by its G members (`TransformerLM.extend`, or a
pretrained `Decoder`'s); each member caches its own N slots. A turn is T single-token steps (stopping once every
member has ended its turn) and one step that writes the environment's O answer tokens; the logits of the last
real answer token predict the next turn. Slots a member leaves empty (after its EOS, after a short answer, after
its episode ended) are masked, and positions count real tokens only: the computation equals decoding the packed
conversation. The environment's turns are `task.respond`, vmapped over prompts and members. Member (b, g) draws
its token t of turn k with the uniform `jax.random.split(split(keys[b], G)[g], K * T)[k * T + t]`: a prompt's
episodes depend on its key only, not on the batch or the devices.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from envs.text.turns import episode_rewards
from jaxrl.loops import scan_until
from jaxrl.sampling import _draw_token, _token_log_prob, is_eos, prompt_layout

TURN_FIELDS = ("reward", "taken", "well_formed", "tool_call", "tool_error", "solved", "anchor")


class Episodes(NamedTuple):
    """`play`'s output: leaves [B, G, N] (N = K (T + O) slots), `turns` leaves [B, G, K]."""

    tokens: jax.Array  # int32, pad in empty slots
    log_probs: jax.Array  # float32: log p of the model's tokens at temperature 1; 0 elsewhere
    mask: jax.Array  # float32: 1 on the model's tokens
    attend: jax.Array  # bool: real tokens, the model's and the environment's
    values: jax.Array | None  # float32: the value head before each of the model's tokens; None without one
    turns: dict  # {field of TURN_FIELDS: [B, G, K]}; anchor: the environment's state id before the turn (0: not taken)
    rewards: jax.Array  # float32 [B, G, 2]: the episode's (correct, well_formed) (`envs.text.episode_rewards`)


def play(model, params, task, vocab, problems, prompts: jax.Array, keys: jax.Array, *, group_size: int,
         temperature=1.0, top_k: int = 0, top_p=1.0, turns: int | None = None) -> Episodes:
    """G episodes of each of B problems (leaves [B, ...]) from their prompts [B, P] (left-padded), keys [B]; with
    `turns`, only their first `turns` turns (the later slots empty, the episodes not ended: a learner's roll-in)."""
    member_keys = jax.vmap(lambda k: jax.random.split(k, group_size))(keys)  # [B, G]
    return _play(model, params, task, vocab, problems, prompts, member_keys, temperature, top_k, top_p,
                 task.max_turns if turns is None else min(turns, task.max_turns))


@functools.partial(jax.jit, static_argnames=("model", "task", "vocab", "top_k", "turn_limit"))
def _play(model, params, task, vocab, problems, prompts, member_keys, temperature, top_k, top_p,
          turn_limit) -> Episodes:
    B, P = prompts.shape
    G = member_keys.shape[1]
    K, T, O = task.max_turns, task.turn_length, task.observation_length
    span, N = T + O, task.answer_length
    if P + N > model.config.max_len:
        raise ValueError(f"prompt {P} + {N} episode slots ({K} turns of {T} + {O} tokens) exceed the model's "
                         f"max_len {model.config.max_len}")
    real, positions, prompt_len = prompt_layout(prompts, vocab.pad_id)
    logits, value, prefix = model.apply(params, prompts, positions, real, method="prefill")
    logits = jnp.broadcast_to(logits[:, None], (B, G, logits.shape[-1]))
    value = None if value is None else jnp.broadcast_to(value[:, None], (B, G))
    # [K, T, B, G] uniforms: member (b, g)'s column k * T + t
    uniforms = jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (K * T,))))(member_keys)
    uniforms = jnp.moveaxis(uniforms, -1, 0).reshape(K, T, B, G)
    members = lambda fn: jax.vmap(jax.vmap(fn))  # noqa: E731  over [B, G]
    per_member = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (B, G, *x.shape[1:])), problems)
    state, anchor = members(task.start)(per_member)  # (made varying below, with the rest of the carry)

    # Zeros that vary over devices and runs as the episodes will (through the parameters, prompts and keys): a
    # loop's carry must start as it ends (`shard_map`'s varying types).
    zero = uniforms[0, 0] * 0.0 + logits[..., 0] * 0.0  # [B, G]
    vary = lambda x: x + zero.reshape(B, G, *[1] * (jnp.ndim(x) - 2)).astype(x.dtype)  # noqa: E731  x [B, G, ...]
    logits, value = vary(logits), None if value is None else vary(value)
    state, anchor = jax.tree.map(vary, (state, anchor))
    batch_axis = model.cache_batch_axis
    own_cache = jax.tree.map(lambda c: c + jnp.expand_dims(zero[:, 0].astype(c.dtype),
                                                           [a for a in range(c.ndim) if a != batch_axis]),
                             model.init_own_cache(B, G, N))

    def forward(cache, attend, tokens, token_positions, slot):
        logits, values, cache = model.apply(params, tokens, token_positions, attend, prefix, real, cache, slot,
                                            method="extend")
        return cache, logits, values

    def model_turn(carry, k):
        """T steps of every member still playing; a member's turn ends at its EOS."""
        def step(inner, xs):
            cache, attend, logits, value, count, writing = inner
            t, uniform = xs
            token = _draw_token(logits, uniform[..., None], temperature, top_k, top_p)
            log_p = _token_log_prob(logits, token)
            token = jnp.where(writing, token, jnp.int32(vocab.pad_id))
            slot = k * span + t
            attend = jax.lax.dynamic_update_slice_in_dim(attend, writing[..., None], slot, axis=2)
            cache, new_logits, new_value = forward(cache, attend, token[..., None], count[..., None], slot)
            out = (token, jnp.where(writing, log_p, 0.0), writing,
                   None if value is None else jnp.where(writing, value, 0.0))
            inner = (cache, attend, new_logits[:, :, 0], None if new_value is None else new_value[..., 0],
                     count + writing, writing & ~is_eos(token, vocab.eos_id))
            return inner, out

        cache, attend, logits, value, count, playing, state, anchor, buffers = carry
        inner = (cache, attend, logits, value, count, playing)
        inner, (tokens, log_probs, written, values) = scan_until(
            step, inner, (jnp.arange(T), uniforms[k]), lambda inner: ~inner[5].any())
        cache, attend, logits, value, count, _ = inner
        turn = jnp.moveaxis(jnp.where(written, tokens, jnp.int32(vocab.pad_id)), 0, -1)  # [B, G, T]
        reply = members(lambda p, s, x: task.respond(p, s, x, k, vocab))(per_member, state, turn)
        # the environment's answer, written after the turn (also the last one, for the record)
        shown = playing[..., None] & (jnp.arange(O) < reply.observation_length[..., None])  # [B, G, O]
        observation = jnp.where(shown, reply.observation, jnp.int32(vocab.pad_id))
        attend = jax.lax.dynamic_update_slice_in_dim(attend, shown, k * span + T, axis=2)
        obs_positions = count[..., None] + jnp.cumsum(shown, axis=-1, dtype=jnp.int32) - 1
        cache, obs_logits, obs_values = forward(cache, attend, observation, obs_positions, k * span + T)
        last = jnp.maximum(reply.observation_length - 1, 0)[..., None]
        logits = jnp.where(playing[..., None], jnp.take_along_axis(obs_logits, last[..., None], axis=2)[:, :, 0],
                           logits)
        if value is not None:
            value = jnp.where(playing, jnp.take_along_axis(obs_values, last, axis=2)[..., 0], value)
        count = count + shown.sum(-1, dtype=jnp.int32)
        outcome = {"reward": reply.reward * playing, "taken": playing, "well_formed": reply.well_formed & playing,
                   "tool_call": reply.tool_call & playing, "tool_error": reply.tool_error & playing,
                   "solved": reply.solved & playing, "anchor": jnp.where(playing, anchor, 0)}
        state = jax.tree.map(lambda new, old: jnp.where(playing.reshape(*playing.shape, *[1] * (old.ndim - 2)),
                                                        new, old), reply.state, state)
        anchor = jnp.where(playing, reply.anchor, anchor)
        block = {"tokens": jnp.concatenate([turn, observation], -1),
                 "log_probs": jnp.concatenate([jnp.moveaxis(log_probs, 0, -1), jnp.zeros((B, G, O))], -1),
                 "mask": jnp.concatenate([jnp.moveaxis(written, 0, -1), jnp.zeros((B, G, O), bool)], -1)}
        if values is not None:
            block["values"] = jnp.concatenate([jnp.moveaxis(values, 0, -1), jnp.zeros((B, G, O))], -1)
        buffers = {**{name: jax.lax.dynamic_update_slice_in_dim(buffers[name], x, k * span, axis=2)
                      for name, x in block.items()},
                   "turns": {name: buffers["turns"][name].at[:, :, k].set(outcome[name]) for name in TURN_FIELDS}}
        playing = playing & ~reply.done
        return cache, attend, logits, value, count, playing, state, anchor, buffers

    no = vary(jnp.zeros((B, G, N), bool))
    buffers = {"tokens": jnp.where(no, 0, jnp.int32(vocab.pad_id)), "log_probs": no * 0.0, "mask": no,
               "turns": {name: vary(jnp.zeros((B, G, K), jnp.float32 if name == "reward" else
                                              jnp.int32 if name == "anchor" else bool)) for name in TURN_FIELDS}}
    if value is not None:
        buffers["values"] = no * 0.0
    carry = (own_cache, no, logits, value, vary(jnp.broadcast_to(prompt_len[:, None], (B, G))), ~no[..., 0], state,
             anchor, buffers)

    def keep_going(loop):
        k, carry = loop
        return (k < turn_limit) & carry[5].any()

    def body(loop):
        k, carry = loop
        return k + 1, model_turn(carry, k)

    _, carry = jax.lax.while_loop(keep_going, body, (jnp.int32(0), carry))
    attend, buffers = carry[1], carry[8]
    mask = buffers["mask"].astype(jnp.float32)
    turns = task.credit(buffers["turns"])
    return Episodes(buffers["tokens"], buffers["log_probs"], mask, attend, buffers.get("values"), turns,
                    episode_rewards(turns))


def token_turns(task) -> jax.Array:
    """int32 [N]: the turn each slot of the task's layout belongs to."""
    return jnp.asarray(task.turn_slots()[0])


def turn_to_tokens(per_turn: jax.Array, task) -> jax.Array:
    """Per-turn values [..., K] -> per slot [..., N] (each slot gets its turn's value)."""
    return jnp.take(per_turn, token_turns(task), axis=-1)


def first_slots(mask: jax.Array, task) -> jax.Array:
    """bool [..., N]: the first model token of each turn (mask [..., N]: the model's tokens)."""
    return (mask > 0) & (jnp.arange(task.answer_length) % task.turn_span == 0)


def summary(turns: dict) -> dict[str, jax.Array]:
    """Per-episode metrics [B, G] from `Episodes.turns`: turns taken, tool calls, tool errors, solved, the turn
    solved at (K + 1 if not), and each turn's reward (`turn_rewards` [B, G, K]: in a task of roles, each role's)."""
    taken = turns["taken"].sum(-1)
    solved_at = jnp.where(turns["solved"].any(-1), jnp.argmax(turns["solved"], -1) + 1, turns["solved"].shape[-1] + 1)
    return {"turns": taken.astype(jnp.float32), "tool_calls": turns["tool_call"].sum(-1).astype(jnp.float32),
            "tool_errors": turns["tool_error"].sum(-1).astype(jnp.float32),
            "solved": turns["solved"].any(-1).astype(jnp.float32), "solved_at": solved_at,
            "turn_rewards": turns["reward"]}

