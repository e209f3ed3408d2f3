"""One GRPO step on a pretrained model (SmolLM2-135M-Instruct): jaxrl against TRL's GRPOTrainer, same machine, same
run, same batch and lengths, each side in a process of its own (so that its peak memory is its own).

    python benchmarks/lm_grpo.py                           # 8 prompts x 8 completions of at most 48 tokens
    python benchmarks/lm_grpo.py --prompts 16 --steps 2

Same on both sides: the weights (jaxrl's float32 export of the GGUF file, which TRL loads as a Hugging Face
directory), the prompts (1-2 digit addition questions through the chat template, as text), the reward (1 when the
reply's last number is the sum), B prompts x G completions at temperature 1 (no top-k / top-p) of at most N tokens
(both stop once every completion has ended), group-normalised advantages, one optimisation pass of the clipped
(0.2) token-level loss (TRL's "dapo") over the whole batch, no KL, AdamW at 5e-6 without weight decay, gradient
clipping at 1.0, float32, no rematerialisation (TRL's gradient checkpointing off), no vLLM.

Each side times `--steps` steps after `--warmup` untimed ones (jaxrl: compilation) and reports the median s/step
and its process's peak resident memory. Tunix's GRPO learner is not run here yet (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODEL = "smollm2-135m-instruct"


def jaxrl_config(args):
    from experiments import lm_grpo
    from jaxrl import algos

    config = lm_grpo.get_config("addition")
    config.task.kwargs.min_digits, config.task.kwargs.max_digits = 1, 2
    config.task.answer_marker = ""
    config.task.reply_length = args.new_tokens
    config.num_prompts, config.group.size, config.group.oversample = args.prompts, args.group_size, 1
    config.optim.num_minibatches, config.model.remat = 1, False
    config.loss.clip_high = 0.2
    config.reward_weights = (1.0, 0.0)  # correct only, as the TRL side's reward
    config.optim.learning_rate, config.optim.warmup_updates, config.optim.schedule = 5e-6, 0, "constant"
    config.total_steps = 10 ** 6
    algos.validate(config)
    return config


def jaxrl_side(args) -> dict:
    import jax

    from jaxrl import algos, mesh as mesh_lib
    from jaxrl.run import saved

    algo, hp = algos.build(jaxrl_config(args), mesh_lib.make_mesh())
    state = algo.init_seeds(0, 1, start_params=saved.start_params(algo.starts_from))
    run_hp = mesh_lib.runs_of(hp, 1, algo.mesh)
    for _ in range(args.warmup):
        state, _ = jax.block_until_ready(algo.run_chunk(state, run_hp, 1))
    times = []
    for _ in range(args.steps):
        tick = time.perf_counter()
        state, metrics = jax.block_until_ready(algo.run_chunk(state, run_hp, 1))
        times.append(time.perf_counter() - tick)
    return {"seconds": times, "tokens": float(metrics["sampled_tokens"][0])}


def trl_side(args) -> dict:
    import dataclasses
    import warnings

    import datasets
    import torch
    import transformers
    from grpo_tokens import StepTimer
    from trl import GRPOConfig, GRPOTrainer

    from jaxrl import models

    warnings.filterwarnings("ignore", category=FutureWarning)
    export = models.save_pretrained(models.from_pretrained(MODEL), tempfile.mkdtemp(prefix="lm_grpo_"))
    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(export, padding_side="left")
    config = jaxrl_config(args)
    # The same questions as jaxrl's task poses, rendered by the chat template as text.
    from jaxrl import algos, mesh as mesh_lib

    algo, _ = algos.build(config, mesh_lib.make_mesh())
    task = algo.parts.policy.task
    import jax
    import numpy as np

    steps = args.warmup + args.steps
    problems = task.sample(jax.random.key(3), args.prompts * steps, "train")
    dataset = datasets.Dataset.from_dict({"prompt": [prompt for prompt, _ in task.texts(problems)],
                                          "target": [int(t) for t in np.asarray(problems.target)]})
    from envs.text.chat import final_answer

    def correct(completions, target, **_):
        return [float(final_answer(c, "") == str(t)) for c, t in zip(completions, target)]

    timer = StepTimer()
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    no_remat = {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
    trl_config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="lm_grpo_trl_"), use_cpu=True, report_to="none", bf16=False, fp16=False,
        **no_remat, use_vllm=False, seed=0, max_steps=steps, per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1, num_generations=args.group_size, num_iterations=1,
        max_completion_length=args.new_tokens, temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", learning_rate=5e-6, lr_scheduler_type="constant", max_grad_norm=1.0,
        weight_decay=0.0, logging_strategy="no", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=trl_config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer.callback])
    trainer.train()
    return {"seconds": timer.times[args.warmup:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="B")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--new-tokens", type=int, default=48, help="N: the most tokens a completion may take")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--side", choices=("jaxrl", "trl"), default=None, help="(internal) run one side")
    parser.add_argument("--no-trl", action="store_true")
    args = parser.parse_args()
    if args.side:
        out = (jaxrl_side if args.side == "jaxrl" else trl_side)(args)
        out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        print("RESULT " + json.dumps(out), flush=True)
        return
    from report import machine

    print(f"{MODEL}: one GRPO step, {args.prompts} prompts x {args.group_size} completions of at most "
          f"{args.new_tokens} tokens; {machine()}, {datetime.date.today()}", flush=True)
    results = {}
    for side in ("jaxrl",) + (() if args.no_trl else ("trl",)):
        command = [sys.executable, __file__, f"--side={side}", f"--prompts={args.prompts}",
                   f"--group-size={args.group_size}", f"--new-tokens={args.new_tokens}", f"--steps={args.steps}",
                   f"--warmup={args.warmup}"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
        results[side] = json.loads(lines[-1][len("RESULT "):])
        r = results[side]
        print(f"{side:>6}: {statistics.median(r['seconds']):7.1f} s/step ({', '.join(f'{s:.1f}' for s in r['seconds'])}), "
              f"peak memory {r['peak_rss_gb']:.1f} GB", flush=True)
    if "trl" in results:
        ratio = statistics.median(results["trl"]["seconds"]) / statistics.median(results["jaxrl"]["seconds"])
        print(f"jaxrl is {ratio:.2f}x TRL's speed per step")


if __name__ == "__main__":
    main()
