"""GRPO on tokens, jaxrl side by side with TRL's GRPOTrainer (PyTorch): the same tiny GPT, the same task,
on the same kind of device (the GPU when torch and jax both see one, else the CPU).

    python benchmarks/grpo_tokens.py --steps 5 --repeats 3
    python benchmarks/grpo_tokens.py --no-trl            # jaxrl only (needs no torch)

Two figures per library, each after a warm-up (jaxrl: compilation; TRL: the first `--warmup` steps), as
the median of `--repeats` timed repetitions of `--steps` calls each:

- sampled tokens/s, generation only: B prompts x G completions of N = `--new-tokens` tokens at
  temperature 1. jaxrl: the jitted `sampling.sample_groups` (KV cache, one prefill per prompt shared by
  its group). TRL: `model.generate` with the trainer's own `generation_config`, on the same left-padded
  prompt ids repeated G times ([B*G, P], as GRPOTrainer feeds it). Tokens are counted up to and
  including EOS (nothing after it), on both sides.
- s per GRPO step: sample B prompts -> G completions each -> rewards -> group advantages -> one pass
  of the clipped policy loss -> one optimiser step. jaxrl: text GRPO's `run_chunk(state, hp, 1)`, the config of
  experiments/text_grpo.py with the sizes below and `init_from=""` (random init), each call timed with
  `jax.block_until_ready`. TRL: `trainer.train()` for warm-up + steps x repeats steps, a callback timing
  each step (end to end: data loading, generation, reward, loss, backward, optimiser).

Same on both sides: depth, width, heads, d_ff (4 x d_model), the character vocabulary of envs.text's
tokenizer, max positions (the config's model.max_len), prompts (the addition task, training split),
completion length (task.answer_length for the step), group size, one optimisation pass per step
(TRL: per_device_train_batch_size = B x G, gradient_accumulation_steps = 1, num_iterations = 1),
temperature 1 without top-k / top-p, no reference model and no KL (beta = 0), clip 0.2, group-normalised
advantages (mean and std over the group), token-level loss aggregation over the batch (TRL's "dapo",
jaxrl's "token"), float32, global-norm gradient clipping at 1.0, Adam(W) without weight decay, and the reward:
the addition verifier's `correct` (digits, then EOS, equal to the canonical sum; jaxrl's well_formed
component is weighted 0). TRL runs without vLLM, without gradient checkpointing, without logging or
checkpoints (`report_to="none"`; `use_cpu=True` unless torch sees a GPU, where it runs on that GPU as jax does).

Both sides run in one process, with glibc's malloc told to keep up to `--malloc-pad-mb` MiB of freed memory
(`jaxrl.host.keep_freed_memory`, which `python -m jaxrl.train` applies; `--malloc-pad-mb 0` for glibc's default).

Needs the `bench` extra: pip install -e ".[bench]" (torch, trl). Install a CPU build of torch first: on Linux
an unconstrained `pip install torch` pulls the CUDA build (GBs).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.metadata
import os
import shlex
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # experiments/ is a folder of config files, not an installed package

from envs import text  # noqa: E402
from envs.text.tokenizer import BOS, EOS, PAD  # noqa: E402
from jaxrl import algos, host, loops, mesh as mesh_lib, sampling  # noqa: E402
from jaxrl.engine import describe_xla_choice  # noqa: E402
from report import machine, markdown_table  # noqa: E402  (benchmarks/, the script's folder, is on sys.path)

# ---------------------------------------------------------------------------------------------------


def generation_rates(generate, count, args) -> list[float]:
    """Tokens per second of `--repeats` repetitions of `--steps` timed calls `generate(i)` (i = 0, 1, ...
    over all calls; it returns when the output is ready), `count(output)` tokens each."""
    rates = []
    for r in range(args.repeats):
        tokens = seconds = 0.0
        for i in range(args.steps):
            tick = time.perf_counter()
            out = generate(r * args.steps + i)
            seconds += time.perf_counter() - tick
            tokens += count(out)
        rates.append(tokens / seconds)
    return rates


# ---------------------------------------------------------------------------------------------------
# jaxrl


def jaxrl_config(args):
    """experiments/text_grpo.py:addition with this benchmark's sizes, from a random init."""
    from experiments import text_grpo

    config = text_grpo.get_config("addition")
    config.init_from = ""
    config.num_prompts = args.prompts
    config.group.size = args.group_size
    config.group.oversample = 1  # TRL samples each prompt's group once
    config.model.num_layers, config.model.d_model, config.model.num_heads = args.layers, args.d_model, args.heads
    config.model.d_ff = 0  # 4 * d_model, as on the TRL side
    if args.max_digits is not None:
        config.task.kwargs.max_digits = args.max_digits
    config.reward_weights = (1.0, 0.0)  # correct only: the reward the TRL side computes
    if args.xla_options is not None:
        config.xla_options = args.xla_options
    config.total_steps = max(config.total_steps, 10 ** 6 * args.prompts * args.group_size)  # flat cosine
    algos.validate(config)
    return config


def jaxrl_bench(args, config):
    """(tokens/s samples, s/step samples, algo, the generation row's prompts [B, P]) for jaxrl."""
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    policy = algo.parts.policy
    task, vocab, model = policy.task, policy.vocab, policy.model
    B, G, N = args.prompts, args.group_size, args.new_tokens

    # Generation only: the jitted sampler on a fixed batch of prompts, a fresh key per call.
    params = policy.init_params(jax.random.PRNGKey(0))
    prompts = task.prompts(task.sample(jax.random.key(1), B, "train"), vocab)

    keys = list(jax.random.split(jax.random.PRNGKey(2), 2 + args.repeats * args.steps))  # made before the clock runs

    def generate(i):
        out = sampling.sample_groups(model, params, prompts, keys[i], group_size=G, max_new_tokens=N,
                                     eos_id=vocab.eos_id, pad_id=vocab.pad_id, temperature=hp.temperature)
        return jax.block_until_ready(out)

    for i in range(2):  # compile, then one warm call
        generate(args.repeats * args.steps + i)
    tokens_per_s = generation_rates(generate, lambda out: float(out.mask.sum()), args)

    # Full GRPO steps: run_chunk(state, hp, 1), compiled on its first call (not timed). The hyperparameters
    # get their run axis once, as the training loop gives them.
    state, run_hp = algo.init_seeds(0, 1), mesh_lib.runs_of(hp, 1, algo.mesh)
    for _ in range(max(args.warmup, 1)):
        state, _ = jax.block_until_ready(algo.run_chunk(state, run_hp, 1))
    if algo.xla_choice:
        print(f"jaxrl {describe_xla_choice(algo.xla_choice)}")
    step_s = []
    for _ in range(args.repeats):
        times = []
        for _ in range(args.steps):
            tick = time.perf_counter()
            state, metrics = jax.block_until_ready(algo.run_chunk(state, run_hp, 1))
            times.append(time.perf_counter() - tick)
        step_s.append(sum(times) / len(times))
    return tokens_per_s, step_s, algo, prompts


# ---------------------------------------------------------------------------------------------------
# TRL


def hf_tokenizer(tok):
    """The jaxrl character tokenizer as a transformers tokenizer (same ids), left padding as GRPOTrainer wants."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                 padding_side="left")
    if (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) != (0, 1, 2) or len(hf) != tok.get_vocab_size():
        raise RuntimeError("the transformers tokenizer does not reproduce the jaxrl vocabulary")
    return hf


def gpt2(args, vocab_size: int, max_len: int):
    """A randomly initialised GPT-2 with jaxrl's sizes (no download), float32, no dropout."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab_size, n_positions=max_len, n_embd=args.d_model, n_layer=args.layers,
                        n_head=args.heads, n_inner=4 * args.d_model, activation_function="gelu_new",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-6,  # flax's
                        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    return GPT2LMHeadModel(config).float()


def correct_reward(tokenizer, eos_id: int):
    """TRL reward function: 1 when a completion is digits then EOS and equals the sum, else 0 (jaxrl's
    `correct`). Reads the completion ids, which GRPOTrainer cuts after the first EOS."""
    special = set(tokenizer.all_special_ids)

    def correct(completions, completion_ids, target, **_):
        rewards = []
        for ids, answer in zip(completion_ids, target):
            ok = len(ids) > 1 and ids[-1] == eos_id and not special.intersection(ids[:-1])
            rewards.append(float(ok and "".join(tokenizer.convert_ids_to_tokens(ids[:-1])) == str(answer)))
        return rewards

    return correct


class StepTimer:
    """A TrainerCallback recording the wall time of every optimiser step (end to end)."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_train_begin(self, *a, **k):
                timer.last = time.perf_counter()

            def on_step_end(self, *a, **k):
                now = time.perf_counter()
                timer.times.append(now - timer.last)
                timer.last = now

        self.times, self.last, self.callback = [], None, Callback()


def trl_bench(args, algo, prompts: jax.Array):
    """(tokens/s samples, s/step samples) for TRL's GRPOTrainer."""
    import dataclasses
    import warnings

    import datasets
    import torch
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices inside transformers / trl

    task, vocab = algo.parts.task, algo.parts.vocab
    B, G, N = args.prompts, args.group_size, args.new_tokens
    tokenizer = hf_tokenizer(algo.parts.policy.tokenizer)
    on_gpu = torch.cuda.is_available() and jax.default_backend() == "gpu"  # both sides on one kind of device
    model = gpt2(args, vocab.size, algo.parts.model.config.max_len)

    # Prompts: the same task and split, as text ("<bos>12+345="); the sum rides along for the reward.
    total_steps = args.warmup + args.steps * args.repeats
    problems = task.sample(jax.random.key(3), B * total_steps, "train")
    dataset = datasets.Dataset.from_dict({
        "prompt": [BOS + prompt for prompt, _ in task.texts(problems)],
        "target": [int(t) for t in np.asarray(problems.target)]})

    timer = StepTimer()
    # GRPOConfig turns gradient checkpointing on by default; transformers 5 renamed it activation_checkpointing.
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    no_remat = {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo_tokens_"), use_cpu=not on_gpu, report_to="none", bf16=False,
        fp16=False, **no_remat, use_vllm=False, seed=0, max_steps=total_steps,
        per_device_train_batch_size=B * G, gradient_accumulation_steps=1, num_generations=G, num_iterations=1,
        max_completion_length=task.answer_length, temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", learning_rate=1e-4, max_grad_norm=1.0, weight_decay=0.0,
        logging_strategy="no", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct_reward(tokenizer, vocab.eos_id)], args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[timer.callback])
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm it prints the run's summary metrics
    if config.gradient_checkpointing or trainer.model.is_gradient_checkpointing:
        raise RuntimeError("gradient checkpointing is on: jaxrl does not rematerialise")

    # Generation only: model.generate as GRPOTrainer calls it, on jaxrl's very prompt ids, each repeated G times.
    ids = torch.from_numpy(np.asarray(prompts, np.int64)).repeat_interleave(G, dim=0)  # [B*G, P], left-padded
    attention_mask = (torch.cumsum((ids != vocab.pad_id).long(), dim=1) > 0).long()
    ids, attention_mask = ids.to(trainer.model.device), attention_mask.to(trainer.model.device)
    generation_config = copy.deepcopy(trainer.generation_config)  # the trainer's keeps N = answer_length
    generation_config.max_new_tokens = N

    def generate():
        with torch.no_grad():
            out = trainer.model.generate(input_ids=ids, attention_mask=attention_mask,
                                         generation_config=generation_config)
        if on_gpu:
            torch.cuda.synchronize()  # timed until the output is ready, as jax.block_until_ready does
        return out

    def count(out):  # generated tokens up to and including the first EOS
        is_eos = (out[:, ids.shape[1]:] == vocab.eos_id).long()
        return int((torch.cumsum(is_eos, dim=1) - is_eos == 0).sum())

    for _ in range(args.warmup):
        generate()
    tokens_per_s = generation_rates(lambda _: generate(), count, args)

    trainer.train()
    if len(timer.times) != total_steps:
        raise RuntimeError(f"TRL ran {len(timer.times)} steps, expected {total_steps}")
    timed = timer.times[args.warmup:]
    step_s = [sum(timed[i * args.steps:(i + 1) * args.steps]) / args.steps for i in range(args.repeats)]
    return tokens_per_s, step_s


# ---------------------------------------------------------------------------------------------------


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def torch_threads(args) -> str:
    if args.no_trl:
        return ""
    import torch

    n = torch.get_num_threads()
    return f" ({n} thread{'s' * (n != 1)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32, help="B: prompts per GRPO step")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="N for the generation-only row (default: the task's answer_length, which the GRPO "
                             "step always uses)")
    parser.add_argument("--max-digits", type=int, default=None,
                        help="addition operands' digits (default: experiments/text_sft.py's); answer_length = "
                             "max_digits + 2")
    parser.add_argument("--steps", type=int, default=5,
                        help="GRPO steps (and generate calls) per timed repetition")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (the median is shown)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed TRL steps / generate calls first")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads for the TRL side (0: torch's default, one per core). On a "
                             "machine busy with other work, torch's spinning OpenMP threads can slow it many-fold")
    parser.add_argument("--no-trl", action="store_true", help="run the jaxrl side only")
    parser.add_argument("--xla-options", default=None,
                        help="jaxrl's config.xla_options for the GRPO step (default: the config's), e.g. auto")
    parser.add_argument("--malloc-pad-mb", type=int, default=256,
                        help="jaxrl.host.keep_freed_memory, as python -m jaxrl.train applies it (0: glibc's default). "
                             "Process-wide, so it holds for the TRL side too")
    args = parser.parse_args()
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be >= 1, --warmup >= 0")
    malloc_pad = host.keep_freed_memory(args.malloc_pad_mb)

    config = jaxrl_config(args)
    task = text.make_task("addition", **config.task.kwargs.to_dict())
    args.new_tokens = args.new_tokens or task.answer_length
    if task.prompt_length + max(args.new_tokens, task.answer_length) > config.model.max_len:
        parser.error(f"prompt {task.prompt_length} + {args.new_tokens} tokens exceed max_len {config.model.max_len}")

    torch_version = "-" if args.no_trl else version("torch")
    print(f"command: python {shlex.join(sys.argv)}\ndate: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
          f"\nmachine: {machine()}, "
          f"torch {torch_version}, trl {'-' if args.no_trl else version('trl')}, "
          f"transformers {'-' if args.no_trl else version('transformers')}")
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, d_ff {4 * args.d_model}, "
          f"max_len {config.model.max_len}; task addition {dict(config.task.kwargs)}: prompt {task.prompt_length} "
          f"tokens, answer {task.answer_length}; B={args.prompts} prompts x G={args.group_size}; generation row "
          f"N={args.new_tokens} new tokens, GRPO step N={task.answer_length}; median of {args.repeats} repeats "
          f"of {args.steps} calls (generate) or steps each; malloc pad (jaxrl.host, both sides): "
          f"{f'{args.malloc_pad_mb} MiB' if malloc_pad else 'glibc default'}\n")

    # jaxrl is timed before torch is imported: once loaded, torch's thread pools slow XLA's CPU programs
    # in the same process (measured: 0.046 s per step instead of 0.037).
    j_tok, j_step, algo, prompts = jaxrl_bench(args, config)
    if args.no_trl:
        t_tok = t_step = None
    else:
        import torch

        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        print(f"torch threads:{torch_threads(args)}")
        t_tok, t_step = trl_bench(args, algo, prompts)

    def cell(samples, fmt):
        return "-" if samples is None else fmt.format(statistics.median(samples))

    def ratio(j, t, invert=False):
        if t is None:
            return "-"
        j, t = statistics.median(j), statistics.median(t)
        return f"{(t / j if invert else j / t):.1f}x"

    rows = [["sampled tokens/s (generation only)", cell(j_tok, "{:,.0f}"), cell(t_tok, "{:,.0f}"),
             ratio(j_tok, t_tok)],
            ["s per GRPO step", cell(j_step, "{:.4f}"), cell(t_step, "{:.4f}"), ratio(j_step, t_step, invert=True)]]
    header = ["", "jaxrl", "TRL", "jaxrl / TRL"]
    print(markdown_table(header, rows))
    print("\njaxrl / TRL: speed-up of jaxrl (for the step time, TRL's seconds over jaxrl's). All repeats:")
    for name, samples, fmt in [("jaxrl tokens/s", j_tok, "{:,.0f}"), ("TRL tokens/s", t_tok, "{:,.0f}"),
                               ("jaxrl s/step", j_step, "{:.4f}"), ("TRL s/step", t_step, "{:.4f}")]:
        if samples is not None:
            print(f"  {name}: " + " ".join(fmt.format(x) for x in samples))
    print("Differences that remain: GPT-2 has biases in its attention projections (jaxrl's attention has none); "
          "TRL's generate\nprefills each of the B*G rows, jaxrl's sample_groups prefills each prompt once for its "
          "group; TRL stops\ngenerating once every row has emitted EOS, jaxrl after the chunk of "
          f"{loops.CHUNK} steps in which every row has (none\nat N <= {loops.CHUNK}: the steps before the first "
          "chunk always run).")


if __name__ == "__main__":
    main()
