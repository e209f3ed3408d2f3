"""Group sampling on a pretrained model: jaxrl against transformers' `generate` and against llama.cpp, same machine,
same run, at RL batch sizes (B prompts x G completions of N tokens).

    python benchmarks/lm_generate.py                                   # SmolLM2-135M-Instruct, 16 x 8 x 64
    python benchmarks/lm_generate.py --prompts 8 --group-size 8 --new-tokens 128
    python benchmarks/lm_generate.py --llama-batched-bench /path/to/llama.cpp/build/bin/llama-batched-bench

Every engine generates exactly N tokens per completion at temperature 1 (no early stop at EOS, so every side
counts the same tokens), from the same B chat prompts (the addition task's questions through the model's chat
template, left-padded to the longest):

- jaxrl: the jitted `sampling.sample_groups` (one prefill per prompt, shared by its group through the KV cache),
  weights dequantised from the GGUF file (or read from a Hugging Face directory) in `--dtype`; timed after
  compilation, each call until the output is ready.
- transformers: `model.generate` on the prompt ids repeated G times ([B*G, P]), the model from its own GGUF loading
  of the same file or the same Hugging Face directory (`--dtype`, float32 by default; on a GPU, float32 matmuls at
  TF32 as XLA's default precision computes them), `do_sample=True`, top-k and top-p off,
  `min_new_tokens = max_new_tokens = N`.
- llama.cpp (when `--llama-batched-bench` names its binary, built from a checkout of llama.cpp): its own batched
  benchmark on the same file with B*G parallel sequences sharing one prompt of P tokens (`-pps`), N tokens each,
  2 threads; its text-generation rate `S_TG`. It computes with the Q4_1 weights as stored (4-bit matmuls).

The process applies `jaxrl.host.keep_freed_memory()`, as `python -m jaxrl.train` does (`--malloc-pad-mb 0`:
glibc's default); jaxrl and transformers, in this one process, share it. The engines are timed in `--repeats`
rounds of one call each, in turn, after each has compiled or warmed up: a drift of the machine's speed (this 2-core
machine's varies by a quarter within minutes) falls on every engine alike. Prints tokens/s per engine (the median
of its rounds) and jaxrl's ratio to each: of the medians, and round by round.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from envs import text  # noqa: E402
from jaxrl import host, models, sampling  # noqa: E402
from jaxrl.models import installed  # noqa: E402
from report import machine  # noqa: E402


def chat_prompts(lm, num: int) -> np.ndarray:
    """int32 [B, P]: `num` held-out addition questions through the model's chat template, left-padded."""
    files = lm.tokenizer_files
    task = text.ChatTask(text.make_task("addition", max_digits=2), files.encode, files.decode, files.render_chat,
                         pad_id=lm.pad_id, eos_id=lm.eos_ids[0], answer_length=8)
    questions = [q.split("user\n")[-1].split("\n")[0] for q, _ in task.texts(task.heldout(num))]
    return task.question_prompts(questions)


def timed(call, repeats: int, tokens: int) -> list[float]:
    rates = []
    for _ in range(repeats):
        tick = time.perf_counter()
        call()
        rates.append(tokens / (time.perf_counter() - tick))
    return rates


def warmed(call, tokens: int) -> Callable[[], float]:
    """`call` run once untimed (compilation, warm-up) -> a function timing one more call: tokens/s."""
    call()
    return lambda: timed(call, 1, tokens)[0]


def jaxrl_side(lm, prompts, args) -> Callable[[], float]:
    """One timed call of jaxrl's group sampling (compiled first) -> tokens/s, a fresh key each call."""
    keys = iter(jax.random.split(jax.random.key(0), args.repeats + 2))

    def call():
        out = sampling.sample_groups(lm.module, lm.params, jnp.asarray(prompts), next(keys), group_size=args.group_size,
                                     max_new_tokens=args.new_tokens, eos_id=-1, pad_id=lm.pad_id, temperature=1.0)
        return jax.block_until_ready(out.tokens)

    return warmed(call, prompts.shape[0] * args.group_size * args.new_tokens)  # (compiles)


def transformers_side(path: str, prompts, pad_id: int, args) -> Callable[[], float]:
    import torch
    import transformers

    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls at TF32 on a GPU, as XLA's default precision
    if os.path.isdir(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        folder, file = os.path.split(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=dtype)
    model = model.to(device).eval()
    ids = torch.from_numpy(np.asarray(prompts, np.int64)).repeat_interleave(args.group_size, dim=0).to(device)
    mask = (torch.cumsum((ids != pad_id).long(), dim=1) > 0).long()

    def call():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=pad_id)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return warmed(call, ids.shape[0] * args.new_tokens)


def llama_cpp_side(binary: str, path: str, prompt_len: int, args) -> Callable[[], float]:
    """One run of llama-batched-bench -> its text-generation rate (tokens/s)."""
    sequences = args.prompts * args.group_size
    context = prompt_len + sequences * args.new_tokens + 16
    command = [binary, "-m", path, "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(prompt_len),
               "-ntg", str(args.new_tokens), "-npl", str(sequences), "-pps", "-t", "2"]

    def rate():
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        # the table row: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
        row = [line for line in out.splitlines() if re.match(r"\|\s*\d+\s*\|", line)][-1]
        return float([c.strip() for c in row.strip("|").split("|")][7])

    return rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16, help="B")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--new-tokens", type=int, default=64, help="N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="weights and compute, on every side")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--llama-batched-bench", default=None, help="llama.cpp's llama-batched-bench binary")
    parser.add_argument("--malloc-pad-mb", type=int, default=256,
                        help="jaxrl.host.keep_freed_memory, as python -m jaxrl.train applies it (0: glibc's default). "
                             "Process-wide, so it holds for transformers too")
    args = parser.parse_args()

    host.keep_freed_memory(args.malloc_pad_mb)
    path = installed.resolve(args.model) if args.model in installed.INSTALLED else args.model
    lm = models.from_pretrained(path, dtype=args.dtype, param_dtype=args.dtype)
    prompts = chat_prompts(lm, args.prompts)
    B, P = prompts.shape
    print(f"{args.model} ({args.dtype}): {B} prompts x {args.group_size} completions x {args.new_tokens} tokens, "
          f"prompts of {P} tokens; {machine()}, {datetime.date.today()}; malloc pad (jaxrl.host) "
          f"{args.malloc_pad_mb} MiB (0: glibc's default)", flush=True)
    sides = {"jaxrl": jaxrl_side(lm, prompts, args)}
    if not args.no_transformers:
        sides["transformers"] = transformers_side(path, prompts, lm.pad_id, args)
    if args.llama_batched_bench:
        sides["llama.cpp"] = llama_cpp_side(args.llama_batched_bench, path, P, args)
    rates = {name: [] for name in sides}
    for _ in range(args.repeats):  # rounds: one call of each engine in turn
        for name, once in sides.items():
            rates[name].append(once())
    ours = statistics.median(rates["jaxrl"])
    for name, samples in rates.items():
        median = statistics.median(samples)
        ratio = ""
        if name != "jaxrl":
            rounds = [a / b for a, b in zip(rates["jaxrl"], samples)]
            ratio = (f"   jaxrl / {name}: {ours / median:.2f}x (round by round: "
                     f"{', '.join(f'{r:.2f}' for r in rounds)}; median {statistics.median(rounds):.2f}x)")
        print(f"{name:>13}: {median:8.1f} tokens/s  ({', '.join(f'{r:.1f}' for r in samples)}){ratio}")


if __name__ == "__main__":
    main()
