r"""GRPO on a pretrained model (SmolLM2-135M-Instruct): held-out greedy accuracy before and after a time budget.

    python benchmarks/lm_learning.py                         # trains runs/lm_learning-full, then reports
    python benchmarks/lm_learning.py --lora                  # LoRA (rank 16) instead of every weight
    python benchmarks/lm_learning.py --seeds 3               # three seeds in one program (vmapped): for a GPU
    python benchmarks/lm_learning.py --report runs/lm_learning-full   # report a finished (or running) run
    python benchmarks/lm_learning.py --task addition_judge   # critique RL: SmolLM2 judging claimed sums
    python benchmarks/lm_learning.py --task addition_judge --workdir runs/judge-lr1e-5 \
        --warm-start runs/lm_learning-addition_judge-full-sft -- --config.optim.learning_rate=1e-5

The run is experiments/lm_grpo.py:<task> with the settings below (1-2 digit addition, 48-token replies, the
reply's last number as the answer, 8 prompts x 8 completions per update, 2 minibatches, rematerialised layers),
passed on the command line of `python -m jaxrl.train` so that the run directory records them. With `--task
addition_judge` the model judges claimed sums of 1-3 digit numbers ("Is 64 + 79 = 173?", half of them off by a slip)
and the reward is whether its reply's last yes or no is right: the critique RL of issue 63 (J1, Critique-Coder), its
working free text before the verdict, from a warm start SFT on 512 demonstrations (`JUDGE_SFT`, in
runs/lm_learning-addition_judge-full-sft), then GRPO on 16 claims x 8 replies per update (`JUDGE`). The report gives:

- the held-out greedy accuracy at the start (the pretrained model, or the judge's warm start: the run's own
  evaluation, on the same held-out problems, 128 or the judge's 256, computed here from the starting parameters), and
  at every evaluation of the run, with wall-clock minutes;
- the greedy replies to the first held-out problems before and after;
- benchmarks/lm_learning.json (the curve: every evaluation, with wall-clock minutes), keyed by the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TASK_FLAGS = ["--config.task.kwargs.min_digits=1", "--config.task.answer_marker=", "--config.task.reply_length=48"]
# operands of up to 2 digits; the judge's of up to 3: after its warm start SmolLM2 adds most 2-digit numbers right
# (15 of the first 16 held-out sums), which leaves its judgement little to learn
MAX_DIGITS = {"addition": 2, "addition_judge": 3}
FLAGS = ["--config.optim.num_minibatches=2", "--config.num_prompts=8", "--config.group.size=8",
         "--config.log.every_steps=64", "--config.eval.every_steps=704", "--config.eval.episodes=128",
         "--config.checkpoint.every_steps=704"]
FULL = ["--config.optim.learning_rate=5e-6", "--config.total_steps=2816"]  # 44 updates: about 55 min on 2 cores
LORA = ["--config.model.lora_rank=16", "--config.optim.learning_rate=1e-4", "--config.total_steps=1408"]  # 22 updates
# The judge's warm start: the model as shipped mostly answers "Is 64 + 79 = 173?" with a bare "Yes." (greedy probes:
# 12 of 12 claims under four phrasings, 4 of 8 under a fifth), and GRPO straight from it stood at 0.414 after 11
# updates; so, as the small model's critique RL starts from SFT, a few demonstrations first teach the form of a
# judgement (the sum, then the verdict: "64 + 79 = 143. No"); the judge's evaluations use 256 held-out claims.
JUDGE_SFT = ["--config.model.name=smollm2-135m-instruct", "--config.model.remat=True",
             "--config.num_prompts=32", "--config.total_steps=512", "--config.optim.learning_rate=2e-5",
             "--config.optim.warmup_updates=2", "--config.log.every_steps=64", "--config.eval.every_steps=512",
             "--config.eval.episodes=256", "--config.eval.pass_k=0", "--config.checkpoint.every_steps=512"]
# The judge's GRPO: 16 claims x 8 replies per update, 66 updates. With 8 x 8 it stood at 0.73-0.75 from update 11 on
# (+13.3 at the end); with twice the replies per gradient, +14.8 after 44 updates and +16.2 after 66 (3 seeds each).
JUDGE = ["--config.num_prompts=16", "--config.total_steps=8448", "--config.eval.every_steps=1408",
         "--config.checkpoint.every_steps=1408", "--config.log.every_steps=128", "--config.eval.episodes=256"]


def train(workdir: str, task: str, lora: bool, seeds: int, sft: str | None = None, more: tuple[str, ...] = ()) -> None:
    """The GRPO run in `workdir` (the judge's from its warm start `sft`, by default `workdir`-sft, trained first where
    it has no checkpoint); `more`: further --config flags, after (so overriding) the settings above."""
    warm_start = []
    if task == "addition_judge":
        sft = sft or f"{workdir}-sft"
        if not os.path.exists(os.path.join(sft, "checkpoints")):
            run_train([f"--config=experiments/text_sft.py:{task}", f"--workdir={sft}", *task_flags(task), *JUDGE_SFT])
        warm_start = [f"--config.init_from={sft}", *JUDGE]
    run_train([f"--config=experiments/lm_grpo.py:{task}", f"--workdir={workdir}", *task_flags(task), *FLAGS,
               *(LORA if lora else FULL), f"--config.num_seeds={seeds}", *warm_start, *more])


def task_flags(task: str) -> list[str]:
    return [*TASK_FLAGS, f"--config.task.kwargs.max_digits={MAX_DIGITS[task]}"]


def run_train(flags: list[str]) -> None:
    command = [sys.executable, "-m", "jaxrl.train", *flags]
    print(" ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def start_evaluation(workdir: str, show: int = 6) -> tuple[float, list[str]]:
    """The run's evaluation of its starting parameters: (greedy held-out accuracy, the first replies)."""
    import jax

    from jaxrl import algos, mesh as mesh_lib
    from jaxrl.run import saved
    from jaxrl.run.program import evaluation_key

    config = saved.saved_config(os.path.join(workdir, "config.json"))
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    params = saved.start_params(algo.starts_from)
    state = algo.init_seeds(config.seed, 1, start_params=params)
    accuracy = float(algo.evaluate(state.params, evaluation_key(config.seed, 0), config.eval.episodes)
                     ["eval_accuracy"][0])
    policy = algo.parts.policy
    problems = policy.task.heldout(min(16, config.eval.episodes), seed=policy.eval_seed)[:show]  # (the artifacts')
    replies = policy.decode(policy.actor(jax.tree.map(lambda x: x[0], state.params))(policy.task.prompts(problems)))
    questions = [q for q, _ in policy.task.texts(problems)]
    return accuracy, [f"{q.split('user')[-1].strip().splitlines()[0]} -> {r!r}" for q, r in zip(questions, replies)]


def report(workdir: str) -> dict:
    from jaxrl import metrics
    from jaxrl.run import saved

    seeds = saved.saved_config(os.path.join(workdir, "config.json")).num_seeds
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    evaluated = [(r["update"], r["wall_time"] / 60, metrics.per_seed(r, "eval_accuracy", seeds)) for r in rows
                 if "eval_accuracy" in r]
    start, before = start_evaluation(workdir)
    from jaxrl.run import policies

    final = policies.evaluate_run(workdir)  # the newest checkpoint: the run's own evaluation, and its replies
    after = open(final["files"][0]).read().splitlines()[1:7]
    from report import machine

    result = {"workdir": workdir, "machine": machine(), "seeds": seeds, "start_accuracy": start,
              "curve": [{"update": u, "minutes": round(m, 1), "eval_accuracy": sum(a) / len(a),
                         **({"eval_accuracy_per_seed": a} if seeds > 1 else {})} for u, m, a in evaluated],
              "replies_before": before, "replies_after": after}
    print(json.dumps(result, indent=1))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (rank 16) instead of every weight")
    parser.add_argument("--seeds", type=int, default=1, help="seeds trained at once (config.num_seeds)")
    parser.add_argument("--report", default=None, help="report this run directory instead of training one")
    parser.add_argument("--task", choices=("addition", "addition_judge"), default="addition")
    parser.add_argument("--workdir", default=None, help="the run's directory (default runs/lm_learning-NAME)")
    parser.add_argument("--warm-start", default=None, help="the judge's SFT run (default WORKDIR-sft)")
    parser.add_argument("more", nargs="*", help="after --: further --config flags of the GRPO run")
    args = parser.parse_args()
    name = ("" if args.task == "addition" else f"{args.task}-") + ("lora" if args.lora else "full") + (
        f"-{args.seeds}seeds" if args.seeds > 1 else "")
    workdir = args.report or args.workdir or os.path.join(ROOT, "runs", f"lm_learning-{name}")
    if not args.report:
        train(workdir, args.task, args.lora, args.seeds, args.warm_start, tuple(args.more))
    result = report(workdir)
    out = os.path.join(ROOT, "benchmarks", "lm_learning.json")
    results = json.load(open(out)) if os.path.exists(out) else {}
    results[os.path.basename(os.path.normpath(workdir)).removeprefix("lm_learning-")] = result
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
