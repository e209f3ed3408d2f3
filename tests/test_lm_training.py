"""Text SFT and GRPO on a pretrained-format model (jaxrl.models): tasks posed through the chat template, replies
verified on the host, a user's dataset file, the run directory's model files, evaluation, loading and export to
Hugging Face format. The model here is a tiny random Llama with SmolLM2's chat template and special tokens over a
small vocabulary, written as a Hugging Face directory (what a user brings); learning on the real SmolLM2 is
benchmarks' and the docs'."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text
from envs.text.chat import ChatTask, DatasetTask, check, final_answer
from jaxrl import models, train
from jaxrl.models import hf
from jaxrl.models.decoder import Decoder


def small_tokenizer(files):
    """`files` (SmolLM2's tokenizer, chat template and special tokens) with a byte-level BPE of 384 tokens trained
    here on the tests' own kind of text in place of its 49,152: the same ids for <|endoftext|>, <|im_start|> and
    <|im_end|> (0, 1, 2), so prompts render as SmolLM2's do, at a vocabulary whose logits and sampling cost little."""
    import dataclasses

    import tokenizers
    from tokenizers import decoders, models as bpe, pre_tokenizers, trainers

    words = ("You are a helpful AI assistant named SmolLM trained by Hugging Face. Be brief. What is the answer? "
             "Answer: I think so. Tom has apples and buys more. How many apples does he have?")
    corpus = [f"What is {a} + {b}? {a} + {b} = {a + b}." for a in range(0, 100, 7) for b in range(0, 100, 3)]
    tokenizer = tokenizers.Tokenizer(bpe.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(t, special=True, normalized=False)
                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    tokenizer.train_from_iterator(corpus + [words] * 20, trainers.BpeTrainer(
        vocab_size=384, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    assert [tokenizer.token_to_id(t.content) for t in specials] == [0, 1, 2]
    return dataclasses.replace(files, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A Hugging Face directory: a 2-layer Llama (random weights) with SmolLM2-135M-Instruct's chat template and
    special tokens over a small vocabulary (small_tokenizer)."""
    _, smollm2 = models.read_spec("smollm2-135m-instruct")
    tokenizer = small_tokenizer(smollm2)
    config = models.ModelConfig(family="llama", vocab_size=tokenizer.tokenizer.get_vocab_size(), hidden_size=64,
                                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                                max_len=512, eos_ids=(2,), pad_id=2, bos_id=1, norm_eps=1e-5)
    tokens = jnp.zeros((1, 4), jnp.int32)
    params = Decoder(config).init(jax.random.key(0), tokens, tokens, jnp.ones((1, 4), bool))
    directory = str(tmp_path_factory.mktemp("tiny_llama"))
    hf.save_directory(config, params, directory, extra_files=tokenizer.files())
    return directory


def lm_config(model: str, algorithm: str = "text_sft", **overrides):
    from jaxrl import algos, config as config_lib

    config = algos.default_config(algorithm)
    config.model.name = model
    config.task.name, config.task.kwargs = "addition", {"min_digits": 1, "max_digits": 1}
    config.task.reply_length = 12
    config.num_prompts = 4
    config.eval.episodes, config.eval.pass_k = 8, 0
    config.log.progress_bar, config.log.artifacts = False, False  # (the dataset test reads sample completions)
    config.optim.learning_rate, config.optim.warmup_updates = 3e-3, 0
    config.total_steps = 4 * 12
    config.log.every_steps = 4
    config.eval.every_steps = config.checkpoint.every_steps = config.total_steps
    for key, value in overrides.items():
        node = config
        *parents, last = key.split(".")
        for parent in parents:
            node = node[parent]
        node[last] = value
    return config_lib.finalize(config)


def test_the_answer_is_read_from_free_text():
    assert final_answer("So 7 * 8 is 56.\nAnswer: **56**.") == "56"
    assert final_answer("no marker here, 56") is None
    assert final_answer("49 + 56 = 105", marker="") == "105"
    assert final_answer("(3 + 5) * 3 = 24", marker="", kind="expression") == "(3 + 5) * 3"
    assert final_answer("64 + 79 is 143, not 173. So no, it is not.", marker="", kind="verdict") == "no"
    assert final_answer("Yes! 64 + 79 = 143.", marker="", kind="verdict") == "Yes"
    assert final_answer("143", marker="", kind="verdict") is None
    judge = text.make_task("addition_judge")
    assert check(judge, np.array([64, 79, 173]), 143, "no") == (True, True)
    assert check(judge, np.array([64, 79, 173]), 143, "Yes") == (False, True)
    assert check(judge, np.array([64, 79, 143]), 143, "**Yes**") == (True, True)
    assert check(judge, np.array([64, 79, 143]), 143, "143") == (False, False)
    assert check(judge, np.array([64, 79, 173]), 143, "64 + 79 = 143. No") == (True, True)  # the last yes or no
    task = text.make_task("addition")
    assert check(task, np.array([12, 30]), 42, "42") == (True, True)
    assert check(task, np.array([12, 30]), 42, "1,042") == (False, True)
    assert check(task, np.array([12, 30]), 42, "forty-two") == (False, False)
    countdown = text.make_task("countdown")
    assert check(countdown, np.array([3, 5, 7, 1]), 24, "3 * (7 + 1)") == (True, True)
    assert check(countdown, np.array([3, 5, 7, 1]), 24, "(3 + 5) * (7 - 1) / 2") == (False, True)  # 2 not given


def test_a_chat_task_poses_questions_through_the_template_and_scores_replies(tiny_model):
    config, tokenizer = models.read_spec(tiny_model)
    task = ChatTask(text.make_task("addition", max_digits=2), tokenizer.encode, tokenizer.decode, tokenizer.render_chat,
                    pad_id=2, eos_id=2, answer_length=16, system_prompt="Be brief.")
    problems = task.heldout(3)
    prompts = np.asarray(jax.jit(task.prompts)(problems))
    assert prompts.shape == (3, task.prompt_length)
    numbers, target = np.asarray(problems.numbers), np.asarray(problems.target)
    real = np.cumsum(prompts[0] != 2) > 0  # left padding (pad = <|im_end|>, which the prompt also holds)
    first = tokenizer.decode(prompts[0][real], skip_special_tokens=False)
    assert first.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert f"What is {numbers[0, 0]} + {numbers[0, 1]}?" in first and first.endswith("<|im_start|>assistant\n")
    replies = [f"Answer: {target[0]}", f"I think {target[1]}", f"Answer: {target[2] + 1}"]
    completions = np.full((3, 16), 2, np.int32)
    for row, reply in enumerate(replies):
        ids = [*tokenizer.encode(reply), 2]
        completions[row, :len(ids)] = ids
    rewards_of = jax.jit(task.jax_rewards)  # (eager calls compile each primitive separately)
    rewards = np.asarray(rewards_of(problems, jnp.asarray(completions)))
    np.testing.assert_array_equal(rewards, [[1, 1], [0, 0], [0, 1]])
    # Groups: completions [B, G, N] of problems [B] (each member scored against its own problem).
    grouped = np.asarray(rewards_of(problems, jnp.asarray(np.stack([completions, completions[::-1]], 1))))
    np.testing.assert_array_equal(grouped[:, 0], rewards)
    np.testing.assert_array_equal(grouped[1, 1], [0, 0])  # problem 1 scored on problem 1's target
    answers = np.asarray(jax.jit(task.reference_answers)(problems))
    assert tokenizer.decode([i for i in answers[0] if i != 2]) == f"Answer: {target[0]}"


def test_a_chat_judge_is_asked_about_a_claim_and_scored_by_its_last_yes_or_no(tiny_model):
    config, tokenizer = models.read_spec(tiny_model)
    task = ChatTask(text.make_task("addition_judge"), tokenizer.encode, tokenizer.decode, tokenizer.render_chat,
                    pad_id=2, eos_id=2, answer_length=24, marker="")
    problems = task.heldout(64)
    numbers, target = np.asarray(problems.numbers), np.asarray(problems.target)
    right = numbers[:, 2] == target
    assert 0.3 < right.mean() < 0.7 and set(np.abs(numbers[~right, 2] - target[~right])) <= {1, 2, 10}
    prompt = tokenizer.decode([i for i in np.asarray(jax.jit(task.prompts)(problems))[0] if i != 2],
                              skip_special_tokens=False)
    assert f"Is {numbers[0, 0]} + {numbers[0, 1]} = {numbers[0, 2]}?\nGive the final answer as Yes or No." in prompt
    # the truth, its opposite after working that says the other word first, and a reply with no verdict
    replies = [*(("Yes." if r else "No.") for r in right[:2]),
               *((f"Not sure... {'no' if r else 'yes'}") for r in right[2:4]), "It is 143."]
    completions = np.full((5, 24), 2, np.int32)
    for row, reply in enumerate(replies):
        ids = [*tokenizer.encode(reply), 2]
        completions[row, :len(ids)] = ids
    rewards = np.asarray(jax.jit(task.jax_rewards)(problems[:5], jnp.asarray(completions)))
    np.testing.assert_array_equal(rewards, [[1, 1], [1, 1], [0, 1], [0, 1], [0, 0]])
    answers = np.asarray(jax.jit(task.reference_answers)(problems[:2]))
    assert [tokenizer.decode([i for i in a if i != 2]) for a in answers] == [
        f"{a} + {b} = {t}. {'Yes' if r else 'No'}" for (a, b, _), t, r in zip(numbers[:2], target[:2], right[:2])]


@pytest.fixture(scope="module")
def sft_run(tiny_model, tmp_path_factory):
    """An SFT run of 40 updates on tiny_model: (its directory, its metric rows). The SFT test checks it and the GRPO
    test starts from it (one run's compiles and updates for both; read only)."""
    workdir = str(tmp_path_factory.mktemp("sft") / "run")
    return workdir, train.run(lm_config(tiny_model, total_steps=4 * 40), workdir).metrics


def test_sft_learns_the_reference_replies_of_a_pretrained_format_model(sft_run):
    """The loss on "Answer: <n><|im_end|>" falls (the model learns the task's reply format), the run directory
    keeps model/ (architecture, tokenizer, chat template), and jaxrl.evaluate reproduces the run's evaluation."""
    workdir, metrics = sft_run
    rows = [r for r in metrics if "loss" in r]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    # it learns to end its reply too: its EOS (<|im_end|>, also its padding) is learned, so greedy replies stop
    # short of lm_config's reply_length of 12 (4 tokens after the fix; 12 when the EOS was masked out with padding)
    assert metrics[-1]["eval_length"] < 12
    model_dir = os.path.join(workdir, "model")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(model_dir))
    from jaxrl.run import policies

    summary = policies.evaluate_run(workdir)
    assert summary["eval_accuracy"] == pytest.approx(metrics[-1]["eval_accuracy"])
    assert summary["eval_length"] == pytest.approx(metrics[-1]["eval_length"])


def test_grpo_from_the_sft_run_trains_loads_and_exports_to_hugging_face_format(tiny_model, sft_run, tmp_path):
    config = lm_config(tiny_model, "text_grpo", **{"init_from": sft_run[0], "group.size": 2,
                                                    "total_steps": 4 * 2 * 2, "log.every_steps": 8})
    result = train.run(config, str(tmp_path / "grpo"))
    last = result.metrics[-1]
    for key in ("reward_correct", "reward_well_formed", "completion_length", "policy_loss", "eval_accuracy"):
        assert key in last, key
    actor = jaxrl_load_policy(str(tmp_path / "grpo"))
    replies = actor.complete(["What is 2 + 3?", "What is 4 + 4?"])
    assert len(replies) == 2 and all(isinstance(r, str) for r in replies)
    from jaxrl.run import policies

    out = policies.export_policy(str(tmp_path / "grpo"), str(tmp_path / "hf"), format="hf")
    lm = models.from_pretrained(out)
    params = jax.tree.map(lambda x: x[0], train_params(str(tmp_path / "grpo")))
    ids = jnp.asarray([lm.tokenizer.encode("What is 2 + 3?").ids])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    expected, _ = Decoder(lm.config).apply(params, ids, positions, jnp.ones(ids.shape, bool))
    np.testing.assert_allclose(np.asarray(lm.logits(ids)), np.asarray(expected), atol=1e-5)
    assert lm.render_chat([{"role": "user", "content": "hi"}]).startswith("<|im_start|>system")


def test_a_multi_turn_task_is_played_and_trained_through_the_chat_template(tiny_model, tmp_path):
    """The guessing game posed in words, each answer a user message of the template; SFT on the demonstrations,
    then GiGPO: episodes of several turns, the same rewards when re-played from the tokens."""
    sft = lm_config(tiny_model, **{"task.name": "guess", "task.kwargs": {"max_turns": 4}, "total_steps": 4 * 6})
    train.run(sft, workdir=str(tmp_path / "sft"))
    config = lm_config(tiny_model, "text_grpo", **{"init_from": str(tmp_path / "sft"), "group.size": 2,
                                                   "task.name": "guess", "task.kwargs": {"max_turns": 4},
                                                   "advantage.estimator": "gigpo", "total_steps": 4 * 2 * 2})
    rows = train.run(config, workdir=str(tmp_path / "grpo")).metrics
    assert all(np.isfinite(row["policy_loss"]) for row in rows if "policy_loss" in row)
    assert [1 <= row["turns"] <= 4 for row in rows if "turns" in row] == [True, True]
    assert 0.0 <= rows[-1]["eval_success"] <= 1.0 and "eval_solved@4" in rows[-1]
    config_spec, tokenizer = models.read_spec(tiny_model)
    task = text.ChatTurns(text.make_task("guess", max_turns=4), tokenizer.encode, tokenizer.decode,
                          tokenizer.render_chat, vocab_size=config_spec.vocab_size, pad_id=2, eos_id=2)
    problems = task.sample(jax.random.key(0), 3, "train")
    shown = tokenizer.decode([int(i) for i in task.reference_answers(problems)[0] if i != 2],
                             skip_special_tokens=False)
    assert shown.startswith("512\n<|im_start|>user\n") and "<|im_start|>assistant\n" in shown
    vocab = text.ModelVocab(config_spec.vocab_size, 2, 2)
    np.testing.assert_allclose(task.rewards(problems, task.reference_answers(problems), vocab)[:, 1], 1.0)
    # SFT imitates each of the model's turns through its EOS, <|im_end|>, which is also the padding
    episodes = np.asarray(task.reference_answers(problems))
    imitated = np.asarray(task.imitated_slots(jnp.asarray(episodes), vocab))
    first_turn = episodes[0, :task.turn_length]
    assert tokenizer.decode([int(i) for i in first_turn[imitated[0, :task.turn_length]]],
                            skip_special_tokens=False) == "512<|im_end|>"
    assert not imitated[0, task.turn_length:task.turn_span].any()  # the environment's reply is attended, not imitated
    # a task of roles keeps them through the template: the critic's turn is credited with the revision's success
    refine = text.ChatTurns(text.make_task("countdown_refine", num_numbers=2), tokenizer.encode, tokenizer.decode,
                            tokenizer.render_chat, vocab_size=config_spec.vocab_size, pad_id=2, eos_id=2)
    problems = refine.sample(jax.random.key(0), 3, "train")
    turns = refine.replay(problems, refine.reference_answers(problems), vocab)
    assert refine.roles == ("actor", "critic", "actor")
    np.testing.assert_array_equal(turns["reward"][:, 1], turns["solved"][:, 2])
    assert bool(turns["solved"][:, 2].all())


def jaxrl_load_policy(path):
    import jaxrl

    return jaxrl.load_policy(path)


def train_params(workdir):
    from jaxrl.run import saved

    return saved.restore_run(workdir).state.params


def test_a_dataset_file_of_questions_and_answers_trains(tiny_model, tmp_path):
    """A GSM8K-style jsonl file (answers after ####, one row marked test): rows become problems, prompts hold the
    questions, a reply with the right number is correct."""
    rows = [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
             "answer": f"He has {i} + {i + 3} = {2 * i + 3} apples.\n#### {2 * i + 3}"} for i in range(40)]
    for row in rows[-8:]:
        row["split"] = "test"
    path = tmp_path / "apples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = DatasetTask(str(path))
    assert len(task.test_rows) == 8 and len(task.train_rows) == 32 and task.answers[5] == Fraction(13)
    assert check(task, np.array([5]), 0, "13") == (True, True)
    config = lm_config(tiny_model, **{"task.name": "dataset", "task.kwargs": {"path": str(path)}, "log.artifacts": True})
    with pytest.raises(ValueError, match="eval.episodes=9 held-out problems, but .*apples.jsonl holds 8"):
        train.run(lm_config(tiny_model, **{"task.name": "dataset", "task.kwargs": {"path": str(path)},
                                           "eval.episodes": 9}), str(tmp_path / "too_many"))
    result = train.run(config, str(tmp_path / "run"))
    assert "eval_accuracy" in result.metrics[-1]
    completions = open(tmp_path / "run" / "sample_completions.txt").read()
    assert "Tom has 32 apples" in completions  # the held-out rows' questions
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no number"}))
    with pytest.raises(ValueError, match="has no number"):
        DatasetTask(str(bad))
    with pytest.raises(ValueError, match="row 0 has no 'prompt' field"):
        DatasetTask(str(path), question_key="prompt")


def test_lora_trains_only_the_adapters_and_exports_them_merged(tiny_model, tmp_path):
    """model.lora_rank: the base weights end bit-identical to the pretrained ones, the adapters move and the SFT
    loss falls; the optimiser keeps state for the adapters only; GRPO with a KL term scores the reference with the
    adapters off (no copy of the model kept); the Hugging Face export folds the adapters into the weights."""
    from jaxrl.run import policies, saved

    sft = lm_config(tiny_model, **{"total_steps": 4 * 40, "model.lora_rank": 8, "optim.learning_rate": 1e-2})
    result = train.run(sft, str(tmp_path / "sft"))
    rows = [r for r in result.metrics if "loss" in r]
    # (the frozen random base, its output embedding included, leaves the adapters less room than full
    # fine-tuning; a run that learned nothing stays near ln(384) = 5.95, the uniform guess, and above)
    assert rows[-1]["loss"] < 0.92 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    run = saved.restore_run(str(tmp_path / "sft"))
    pretrained = models.read_params(tiny_model, models.read_spec(tiny_model)[0])["params"]
    trained = jax.tree.map(lambda x: np.asarray(x[0]), run.state.params)["params"]
    np.testing.assert_array_equal(trained["embed"], pretrained["embed"])
    for name, value in pretrained["layers"].items():
        np.testing.assert_array_equal(trained["layers"][name], value, err_msg=name)
    assert np.abs(trained["layers"]["q_lora_b"]).max() > 0
    state_bytes = sum(x.size for x in jax.tree.leaves(run.state.opt_state))
    adapter_size = sum(v.size for k, v in trained["layers"].items() if "_lora_" in k)
    assert state_bytes < 3 * adapter_size + 1000, (state_bytes, adapter_size)  # Adam's two moments of the adapters

    grpo = lm_config(tiny_model, "text_grpo", **{"init_from": str(tmp_path / "sft"), "group.size": 2,
                                                  "total_steps": 4 * 2 * 2, "model.lora_rank": 8,
                                                  "loss.kl_coef": 0.1})
    result = train.run(grpo, str(tmp_path / "grpo"))
    assert "kl" in result.metrics[-1] or "approx_kl" in result.metrics[-1]
    assert saved.restore_run(str(tmp_path / "grpo")).state.ref_params is None

    out = policies.export_policy(str(tmp_path / "sft"), str(tmp_path / "hf"), format="hf")
    lm = models.from_pretrained(out)
    ids = jnp.asarray([lm.tokenizer.encode("What is 2 + 3?").ids])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    config = models.read_spec(str(tmp_path / "sft" / "model"), lora_rank=8)[0]
    expected, _ = Decoder(config).apply(jax.tree.map(lambda x: x[0], run.state.params), ids, positions,
                                        jnp.ones(ids.shape, bool))
    np.testing.assert_allclose(np.asarray(lm.logits(ids)), np.asarray(expected), atol=1e-4)
    assert not np.allclose(np.asarray(lm.logits(ids)), np.asarray(models.from_pretrained(tiny_model).logits(ids)))


SHARDED_RUN = """
import json, sys
import jax, numpy as np
sys.path.insert(0, "tests")
from test_lm_training import lm_config
from jaxrl import train
from jaxrl.models import sharding
from jaxrl.run import saved

out = {}
for name, devices, model_devices in (("one", 1, 1), ("sharded", 8, 1), ("tensor", 8, 2)):
    config = lm_config(MODEL, "text_grpo", **{"group.size": 2, "num_prompts": 8, "total_steps": 8 * 2 * 2,
                                              "mesh.num_devices": devices, "mesh.model_devices": model_devices,
                                              "log.every_steps": 16, "loss.ent_coef": 0.01})
    workdir = f"{TMP}/{name}"
    result = train.run(config, workdir)
    state = saved.restore_run(workdir).state
    out[name] = {"loss": [r["policy_loss"] for r in result.metrics if "policy_loss" in r],
                 "grad_norm": [r["grad_norm"] for r in result.metrics if "grad_norm" in r],
                 "params": {k: np.asarray(v).tolist() for k, v in [
                     ("embed", state.params["params"]["embed"][0, :3, :5]),
                     ("q", state.params["params"]["layers"]["q"][0, 1, :4, 0, :3]),
                     ("down", state.params["params"]["layers"]["down"][0, 0, :4, :4])]}}
    if devices == 8:
        held = sharding.bytes_per_device(state.params)
        out[name]["held"] = max(held.values())
        out[name]["whole"] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
        out[name]["embed_spec"] = str(state.params["params"]["embed"].sharding.spec)
        out[name]["adam_spec"] = str(jax.tree.leaves(state.opt_state)[1].sharding.spec)
print("RESULT " + json.dumps(out))
"""


def test_a_pretrained_model_trains_fully_sharded_over_eight_devices(tiny_model, tmp_path, python_subprocess):
    """model.shard_params on 8 devices, as 8 data groups (FSDP) and as 4 data groups of 2 devices that split heads,
    MLP units and vocabulary (mesh.model_devices=2, tensor parallel): each device stores an eighth of the
    parameters (and of their Adam moments), and the run trains the same parameters as on one device (float
    summation order aside). The random model's rewards are all zero, so the entropy bonus is what moves the
    parameters."""
    code = f"MODEL, TMP = {tiny_model!r}, {str(tmp_path)!r}\n" + SHARDED_RUN
    done = python_subprocess(code, devices=8)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    for name in ("sharded", "tensor"):
        held, whole = result[name]["held"], result[name]["whole"]
        assert held <= whole / 8 + 4096, (name, held, whole)
    assert result["sharded"]["embed_spec"] == "P('runs', None, 'data')"
    # embed [V, D]: the vocabulary over `model`, the hidden dimension over `data`; Adam's moments alike
    assert result["tensor"]["embed_spec"] == "P('runs', 'model', 'data')"
    assert "model" in result["tensor"]["adam_spec"] and "data" in result["tensor"]["adam_spec"]
    assert len(result["one"]["grad_norm"]) == 2 and min(result["one"]["grad_norm"]) > 0
    for name in ("sharded", "tensor"):
        np.testing.assert_allclose(result[name]["loss"], result["one"]["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(result[name]["grad_norm"], result["one"]["grad_norm"], rtol=1e-5)
        for key, value in result["one"]["params"].items():
            np.testing.assert_allclose(result[name]["params"][key], value, rtol=1e-4, atol=1e-6, err_msg=(name, key))


def test_bfloat16_parameters_keep_their_fine_tuning_steps_in_float32_master_copies():
    """Adam at 1e-5 on bfloat16 weights near 0.05: each step (1e-5) is far below bfloat16's spacing there (2.4e-4),
    so plain optax leaves the weights exactly as they were; with `float32_master` the steps accumulate in the
    master copy and the weights move by the master's rounding (20 steps: 2e-4, one or two bfloat16 spacings)."""
    import optax

    from jaxrl.engine import float32_master

    params = {"w": jnp.full((4,), 0.05, jnp.bfloat16)}
    grads = {"w": jnp.ones((4,), jnp.bfloat16)}

    def run(optimizer, steps=20):
        p, state = params, optimizer.init(params)
        for _ in range(steps):
            updates, state = optimizer.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        return p, state

    plain, _ = run(optax.adam(1e-5))
    np.testing.assert_array_equal(np.asarray(plain["w"], np.float32), np.asarray(params["w"], np.float32))
    mastered, state = run(float32_master(optax.adam(1e-5)))
    assert mastered["w"].dtype == jnp.bfloat16 and state.master["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(state.master["w"]), np.float32(np.asarray(params["w"], np.float32)) - 2e-4,
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(mastered["w"]), np.asarray(state.master["w"].astype(jnp.bfloat16)))
    assert float(mastered["w"][0]) < float(params["w"][0])


def test_a_reward_model_learns_on_a_pretrained_model_s_body(tiny_model, sft_run, tmp_path):
    """text_reward_model on a pretrained-format model: the SFT run's body under a fresh value head learns from the
    labels of its sampler's chat replies (the SFT run's weights, frozen), and the saved run scores strings."""
    from jaxrl.run.saved import start_params

    config = lm_config(tiny_model, "text_reward_model", **{"init_from": sft_run[0], "group.size": 4,
                                                           "total_steps": 4 * 4 * 6, "log.every_steps": 16,
                                                           "reward_model.objective": "pointwise"})
    rows = [row for row in train.run(config, str(tmp_path / "rm")).metrics if "loss" in row]
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    sampler = start_params(str(tmp_path / "rm"))["sampler"]
    sampler = {k: v for k, v in sampler.items() if k != "value"}  # (a fresh value head, never used)
    for a, b in zip(jax.tree.leaves(sampler), jax.tree.leaves(start_params(sft_run[0])["params"]), strict=True):
        np.testing.assert_array_equal(a, b)
    scores = jaxrl_load_policy(str(tmp_path / "rm")).score(["What is 2 + 3?"] * 2, ["Answer: 5", "Answer: 7"])
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()
