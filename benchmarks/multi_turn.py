"""Multi-turn episodes per second: jaxrl's compiled conversation loop against TRL's environment interface
(GRPOTrainer with `environment_factory`, its multi-turn tool-calling rollout), in one process on one machine.

    python benchmarks/multi_turn.py                    # B = 16 prompts x G = 8 episodes of the guessing game
    python benchmarks/multi_turn.py --prompts 32 --repeats 5
    python benchmarks/multi_turn.py --no-trl           # jaxrl only (needs no torch)
    python benchmarks/multi_turn.py --prompts 8 --repeats 3 --update-results

The same game on both sides: guess a number in 1..1024, answered higher / lower / found, 13 turns at most; the
same transformer body (2 layers, width 128, 4 heads, MLP 512, random weights, float32), the same batch (B
prompts x G episodes each, temperature 1). Both sides play every episode to its 13th turn (a random policy
finds the number by chance only), so both do the same number of turns.

- jaxrl: `jaxrl.multi_turn.play` (jitted; timed after compiling, with `jax.block_until_ready`) with the small
  transformer over the guessing game's character vocabulary: each turn the model writes a guess (at most 5
  tokens), the environment answers in one token, the KV cache carries over.
- TRL: `GRPOTrainer._generate_and_score_completions` on one batch (B x G rows, each prompt repeated G times as
  its sampler gives them): per turn a `model.generate` over every conversation so far, parsing of the tool call
  (`parse_response`), the environment's Python method, the tool response rendered by the chat template, and at
  the end the environment's reward and GRPO's advantages. Its interface needs a chat template with tool calls, so
  the model is a GPT-2 of the same body over a byte-level BPE with Qwen3's special tokens, rendered by TRL's own
  Qwen3 template. A random model does not write tool calls, so a logits processor forces each turn to be
  `<tool_call>{"name": "guess", "arguments": {"number": N}}</tool_call><|im_end|>` with a random N: the model still
  runs its forward pass for every token, and TRL parses and executes every call.

Figures: episodes per second (the median of `--repeats` timed batches after `--warmup` untimed ones) and, for
reference, the model's tokens per second (a TRL turn is a JSON tool call of about 20 tokens, a jaxrl turn at most 5:
the interfaces differ, and episodes per second is what the issue asks of them).

Needs the `bench` extra (torch, trl) for the TRL side.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import random
import shlex
import statistics
import sys
import tempfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from envs import text  # noqa: E402
from jaxrl import multi_turn  # noqa: E402
from jaxrl.transformer import TransformerConfig, TransformerLM  # noqa: E402
from report import machine, markdown_table, publish  # noqa: E402

LOW, HIGH, TURNS = 1, 1024, 13
MARKERS = ("<!-- multi_turn:start -->", "<!-- multi_turn:end -->")


def timed(call, args) -> list[float]:
    """Seconds of `--repeats` calls after `--warmup` untimed ones (call returns when its output is ready)."""
    for _ in range(args.warmup):
        call()
    out = []
    for _ in range(args.repeats):
        tick = time.perf_counter()
        call()
        out.append(time.perf_counter() - tick)
    return out


# ---------------------------------------------------------------------------------------------------
# jaxrl


def jaxrl_bench(args) -> tuple[list[float], float]:
    """(seconds per batch, model tokens per batch) of `multi_turn.play`."""
    task = text.make_task("guess", low=LOW, high=HIGH, max_turns=TURNS)
    tokenizer = text.train_tokenizer(text.corpus([task], 256), alphabet=task.alphabet)
    vocab = text.Vocab.from_tokenizer(tokenizer)
    model = TransformerLM(TransformerConfig(vocab.size, max_len=task.prompt_length + task.answer_length,
                                            num_layers=args.layers, d_model=args.d_model, num_heads=args.heads))
    problems = task.sample(jax.random.key(0), args.prompts, "train")
    prompts = task.prompts(problems, vocab)
    params = model.init(jax.random.key(1), prompts, prompts * 0, prompts > 0)
    keys = iter(jax.random.split(jax.random.key(2), args.warmup + args.repeats))
    tokens = []

    def play():
        episodes = multi_turn.play(model, params, task, vocab, problems, prompts,
                                   jax.random.split(next(keys), args.prompts), group_size=args.group_size)
        jax.block_until_ready(episodes)
        turns = multi_turn.summary(episodes.turns)["turns"]
        if float(turns.min()) < TURNS and not bool(episodes.turns["solved"].any()):
            raise RuntimeError("a jaxrl episode ended before its last turn")
        tokens.append(float(episodes.mask.sum()))

    return timed(play, args), statistics.median(tokens)


# ---------------------------------------------------------------------------------------------------
# TRL


def qwen_style_tokenizer():
    """A byte-level BPE with Qwen3's special tokens and TRL's own Qwen3 chat template (which TRL knows how to parse
    tool calls from), trained here on the game's kind of text."""
    import tokenizers
    import trl
    from tokenizers import decoders, models as bpe, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import add_response_schema

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>", "<think>", "</think>"]
    corpus = ['{"name": "guess", "arguments": {"number": %d}}' % n for n in range(LOW, HIGH + 1)]
    corpus += ["system user assistant You are a helpful assistant. Guess the secret number. higher lower found "
               "Tools function description parameters properties type integer object required"] * 50
    tokenizer = tokenizers.Tokenizer(bpe.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=[tokenizers.AddedToken(t, special=True, normalized=False) for t in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen3.jinja")) as f:
        template = f.read()
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 padding_side="left", chat_template=template)
    return add_response_schema(hf)


class GuessEnv:
    """The guessing game as TRL's environment: `reset` draws the secret, `guess` is the tool, `get_reward` scores."""

    def reset(self, **kwargs):
        self.secret, self.turns, self.found = random.randint(LOW, HIGH), 0, False
        return None

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: the guess, between 1 and 1024.

        Returns:
            ">" if the secret number is higher, "<" if it is lower, "=" if it is the guess.
        """
        self.turns += 1
        if int(number) == self.secret:
            self.found = True
            return "="
        return ">" if self.secret > int(number) else "<"

    def get_reward(self) -> float:
        return max(1.0 - 0.05 * (self.turns - 1), 0.0) if self.found else 0.0


def forcing_generate(model, tokenizer):
    """`model.generate` with a logits processor that makes every row write a guess as a tool call with a random
    number, then `<|im_end|>` (the model's forward pass still runs for every token)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generate = model.generate

    class ForceToolCall(LogitsProcessor):
        def __init__(self):
            self.start, self.script = None, None

        def __call__(self, input_ids, scores):
            if self.start is None:
                self.start = input_ids.shape[1]
                self.script = [tokenizer.encode('<tool_call>\n{"name": "guess", "arguments": {"number": %d}}\n'
                                                '</tool_call>' % random.randint(LOW, HIGH)) + [eos]
                               for _ in range(input_ids.shape[0])]
            t = input_ids.shape[1] - self.start
            forced = torch.tensor([s[t] if t < len(s) else eos for s in self.script])
            out = torch.full_like(scores, -float("inf"))
            out[torch.arange(scores.shape[0]), forced] = 0.0
            return out

    def forced(*a, **k):
        return generate(*a, logits_processor=LogitsProcessorList([ForceToolCall()]), **k)

    model.generate = forced


def trl_bench(args) -> tuple[list[float], float]:
    """(seconds per batch, model tokens per batch) of GRPOTrainer's rollout with an `environment_factory`."""
    import dataclasses
    import warnings

    import datasets
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    random.seed(0)
    torch.manual_seed(0)
    tokenizer = qwen_style_tokenizer()
    B, G = args.prompts, args.group_size
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=2048, n_embd=args.d_model, n_layer=args.layers, n_head=args.heads,
        n_inner=4 * args.d_model, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)).float()
    forcing_generate(model, tokenizer)
    prompt = [{"role": "user", "content": f"Guess my secret number between {LOW} and {HIGH}."}]
    dataset = datasets.Dataset.from_dict({"prompt": [prompt] * B})
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    no_remat = {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="multi_turn_"), use_cpu=True, report_to="none", bf16=False, fp16=False,
        **no_remat, use_vllm=False, seed=0, max_steps=1, per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1, num_generations=G, max_completion_length=1024, temperature=1.0, top_k=0,
        top_p=1.0, beta=0.0, max_tool_calling_iterations=TURNS - 1, logging_strategy="no", save_strategy="no",
        disable_tqdm=True, log_completions=False)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                          environment_factory=GuessEnv)
    batch = [row for row in dataset for _ in range(G)]  # each prompt G times, as GRPOTrainer's sampler deals them
    tokens = []

    def rollout():
        out = trainer._generate_and_score_completions(batch)
        model_tokens = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
        tokens.append(float(model_tokens.sum()))
        turns = [env.turns for env in trainer.environments]
        if min(turns) < TURNS - 1 and not any(env.found for env in trainer.environments):
            raise RuntimeError(f"TRL episodes ended early: turns {sorted(set(turns))}")

    return timed(rollout, args), statistics.median(tokens)


# ---------------------------------------------------------------------------------------------------


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16, help="B: prompts per batch")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per prompt")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches (the median is shown)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed batches first (jaxrl: compiling)")
    parser.add_argument("--no-trl", action="store_true", help="run the jaxrl side only")
    parser.add_argument("--update-results", action="store_true", help="write benchmarks/results/multi_turn.md")
    args = parser.parse_args()
    episodes = args.prompts * args.group_size
    rows, rates = [], {}
    sides = [("jaxrl", jaxrl_bench)] + ([] if args.no_trl else [("TRL", trl_bench)])
    for name, bench in sides:
        seconds, tokens = bench(args)
        rates[name] = episodes / statistics.median(seconds)
        rows.append([name, f"{rates[name]:.1f}", f"{tokens / statistics.median(seconds):,.0f}",
                     f"{tokens / episodes / TURNS:.1f}", ", ".join(f"{s:.2f}" for s in seconds)])
    lines = [f"{datetime.date.today()}, {machine()}"
             + ("" if args.no_trl else f"; trl {version('trl')}, transformers {version('transformers')}, "
                                       f"torch {version('torch')}"),
             f"command: `python benchmarks/multi_turn.py {shlex.join(sys.argv[1:])}`", "",
             f"The guessing game, {TURNS} turns, B={args.prompts} prompts x G={args.group_size} episodes.", "",
             markdown_table(["side", "episodes/s", "model tokens/s", "model tokens per turn", "s per batch"], rows)]
    if "TRL" in rates:
        lines += ["", f"jaxrl / TRL episodes per second: **{rates['jaxrl'] / rates['TRL']:.1f}x**"]
    publish("\n".join(lines), args.update_results, MARKERS, "Multi-turn episodes per second against TRL (issue 62)")


if __name__ == "__main__":
    main()
