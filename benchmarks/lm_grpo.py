"""One GRPO step on a pretrained model (SmolLM2-135M-Instruct): jaxrl against TRL's GRPOTrainer and Tunix's GRPO
learner, same machine, same run, same batch and lengths, each side in a process of its own (so that its peak memory
is its own).

    python benchmarks/lm_grpo.py                           # 8 prompts x 8 completions of at most 48 tokens
    python benchmarks/lm_grpo.py --prompts 16 --steps 2
    python benchmarks/lm_grpo.py --tunix-python PATH       # Tunix too, run by PATH: a Python with google-tunix

Same on every side: the weights (jaxrl's float32 export of the GGUF file, which TRL and Tunix load as a Hugging Face
directory), the prompts (1-2 digit addition questions through the chat template, as text), the reward (1 when the
reply's last number is the sum), B prompts x G completions at temperature 1 (no top-k / top-p) of at most N tokens
(all stop once every completion has ended), group-normalised advantages, one optimisation pass of the clipped
(0.2) token-level loss (TRL's "dapo", Tunix's "token-mean") over the whole batch, no KL, AdamW at 5e-6 without
weight decay, gradient clipping at 1.0, float32, no rematerialisation (TRL's gradient checkpointing off), no vLLM.

The jaxrl side's process keeps freed memory for reuse (`jaxrl.host.keep_freed_memory`), as `python -m jaxrl.train`
does; the peers' run with glibc's malloc as it is, as their users run them (`--peers-malloc-pad-mb 256`: the same
setting for them, through their environment; `--malloc-pad-mb 0`: none for jaxrl).

Each side times `--steps` steps after `--warmup` untimed ones (jaxrl, Tunix: compilation) and reports the median
s/step and its process's peak resident memory.

The Tunix side runs without jaxrl (google-tunix pins its own jax, flax and safetensors, so it lives in an environment
of its own): this process first writes it the export and a JSON file of the prompts and targets. It builds
tunix.models.llama3 with the export's config.json, loads the safetensors with Tunix's loader and trains with
tunix.rl.grpo's GRPOLearner on an RLCluster (vanilla rollout engine; actor and rollout on one CPU mesh share the
weights), timing each of the learner's global steps. Where Tunix differs:
- the EOS token: its sampler cuts a completion before it, so the loss leaves it out (TRL's includes it);
- padding: Tunix masks every pad token and SmolLM2 pads with <|im_end|>, which the prompts hold, so this side pads
  with <|endoftext|>; prompts are left-padded to one length for all steps (the longest + 1, TRL's to each batch's);
- RoPE: Tunix 0.1.7's Llama 3 ignores the config's rope_theta (uses 1e6), so this side binds SmolLM2's 1e5 (its
  greedy replies then match transformers');
- sampling: the vanilla rollout draws with the same key (PRNGKey(0)) at every step;
- advantages: divided by the group's std + 1e-6 (TRL: + 1e-4), not settable.
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
    config.model.name = args.model
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

    from jaxrl import algos, host, mesh as mesh_lib
    from jaxrl.run import saved

    host.keep_freed_memory(args.malloc_pad_mb)  # as `python -m jaxrl.train` does

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
    stats = jax.devices()[0].memory_stats() or {}
    out = {"seconds": times, "tokens": float(metrics["sampled_tokens"][0])}
    if jax.devices()[0].platform == "gpu":
        out["device_peak_gb"] = stats.get("peak_bytes_in_use", 0) / 2 ** 30
    return out


def export_model(model: str, directory: str | None = None) -> str:
    """jaxrl's float32 Hugging Face export of `model` (into `directory`, else a new temporary one): the weights TRL
    and Tunix load."""
    from jaxrl import models

    return models.save_pretrained(models.from_pretrained(model), directory or tempfile.mkdtemp(prefix="lm_grpo_"))


def questions(args) -> tuple[list[str], list[int]]:
    """(prompts, targets) for warmup + timed steps of args.prompts each: the questions jaxrl's task poses, the
    prompts rendered by the chat template as text."""
    import jax
    import numpy as np

    from jaxrl import algos, mesh as mesh_lib

    algo, _ = algos.build(jaxrl_config(args), mesh_lib.make_mesh())
    task = algo.parts.policy.task
    problems = task.sample(jax.random.key(3), args.prompts * (args.warmup + args.steps), "train")
    return [prompt for prompt, _ in task.texts(problems)], [int(t) for t in np.asarray(problems.target)]


def trl_side(args) -> dict:
    import dataclasses
    import warnings

    import datasets
    import torch
    import transformers
    from grpo_tokens import StepTimer
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.backends.cuda.matmul.allow_tf32 = True  # on a GPU, float32 matmuls at TF32 as XLA's default precision
    export = export_model(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(export, padding_side="left")
    steps = args.warmup + args.steps
    prompts, targets = questions(args)
    dataset = datasets.Dataset.from_dict({"prompt": prompts, "target": targets})
    from envs.text.chat import final_answer

    def correct(completions, target, **_):
        return [float(final_answer(c, "") == str(t)) for c, t in zip(completions, target)]

    timer = StepTimer()
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    no_remat = {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
    trl_config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="lm_grpo_trl_"), use_cpu=not torch.cuda.is_available(), report_to="none",
        bf16=False, fp16=False, **no_remat, use_vllm=False, seed=0, max_steps=steps,
        per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1, num_generations=args.group_size, num_iterations=1,
        max_completion_length=args.new_tokens, temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", learning_rate=5e-6, lr_scheduler_type="constant", max_grad_norm=1.0,
        weight_decay=0.0, logging_strategy="no", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=trl_config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer.callback])
    trainer.train()
    out = {"seconds": timer.times[args.warmup:]}
    if torch.cuda.is_available():
        out["device_peak_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return out


def prepare_tunix_inputs(args, directory: str) -> str:
    """directory/inputs.json: what the Tunix side needs from jaxrl, which its environment cannot import: the model's
    export (written to directory/model) and the prompts and targets the TRL side trains on."""
    prompts, targets = questions(args)
    path = os.path.join(directory, "inputs.json")
    with open(path, "w") as f:
        json.dump({"model": export_model(args.model, os.path.join(directory, "model")), "prompts": prompts,
                   "targets": targets}, f)
    return path


def tunix_model(export: str):
    """(Tunix's Llama 3 with the shapes of the export's config.json and its float32 weights, its one-device mesh)."""
    import functools

    import jax.numpy as jnp
    from tunix.models.llama3 import model as llama3, params
    from tunix.utils import mesh as tunix_mesh

    with open(os.path.join(export, "config.json")) as f:
        hf = json.load(f)
    rope_theta = hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]  # transformers 5 nests it
    config = llama3.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=rope_theta, norm_eps=hf["rms_norm_eps"],
        weight_tying=hf["tie_word_embeddings"])
    # Tunix 0.1.7's attention calls apply_rope without the config's theta (so 1e6, its default): bind the model's.
    llama3.apply_rope = functools.partial(llama3.apply_rope, rope_theta=config.rope_theta)
    mesh = tunix_mesh.create_mesh((1, 1), ("fsdp", "tp"))  # its axis names; one CPU device
    return params.create_model_from_safe_tensors(export, config, mesh, dtype=jnp.float32), mesh


def last_number_reward(prompts, completions, target, **_) -> list[float]:
    """1.0 when the completion's last number is the target: envs.text.chat.final_answer(text, "") with its NUMBER
    pattern, restated since the Tunix side cannot import jaxrl's packages."""
    import re

    def last(text):
        numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
        return numbers[-1] if numbers else None

    return [float(last(c) == str(t)) for c, t in zip(completions, target)]


def tunix_cluster(args, export: str, prompts: list[str]):
    """Tunix's RLCluster for the export: actor and vanilla rollout on one CPU mesh (one copy of the weights)."""
    import jax.numpy as jnp
    import optax
    import transformers
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.rollout import base_rollout

    model, mesh = tunix_model(export)
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    # Tunix takes every pad token for padding (masked from attention and the loss); SmolLM2 pads with <|im_end|>,
    # which the chat-rendered prompts hold, so pad with a token they do not.
    tokenizer.pad_token = "<|endoftext|>"
    # One prompt length for every batch, so that the sampler compiles once; +1 for the BOS its tokenize() prepends
    # to a text that does not start with one.
    prompt_length = 1 + max(len(tokenizer.encode(p)) for p in prompts)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens, max_prompt_length=prompt_length,
        kv_cache_size=prompt_length + args.new_tokens, temperature=1.0, top_p=1.0, top_k=None, data_type=jnp.float32,
        seed=None)  # PRNGKey(0) at every step: the rollout reuses its seed (a key given here is donated, then deleted)
    steps = args.warmup + args.steps
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(5e-6, weight_decay=0.0)),
        max_steps=steps, eval_every_n_steps=steps + 1)  # no evaluation
    return rl_cluster_lib.RLCluster(actor=model, tokenizer=tokenizer, cluster_config=rl_cluster_lib.ClusterConfig(
        role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.ROLLOUT: mesh}, rollout_engine="vanilla",
        offload_to_cpu=False, training_config=training, rollout_config=rollout))


def tunix_side(args) -> dict:
    import jax
    import numpy as np
    from flax import nnx
    from tunix.rl.grpo import grpo_learner

    with open(args.inputs) as f:
        inputs = json.load(f)
    times = []

    class TimedLearner(grpo_learner.GRPOLearner):
        """Wall clock per global step (rollout, reward, advantages, update), to the update's end on the device:
        Tunix has no public hook spanning the rollout (its TrainingHooks see the update only, a step late)."""

        def _run_global_step(self, *a, **k):
            tick = time.perf_counter()
            super()._run_global_step(*a, **k)
            jax.block_until_ready(nnx.state(self.rl_cluster.actor_trainer.model))
            times.append(time.perf_counter() - tick)

    # Its sampler cuts each completion before the EOS, so the loss leaves that token out (TRL's includes it); the
    # advantages' std gets + 1e-6 (TRL's + 1e-4), not settable.
    grpo = grpo_learner.GRPOConfig(num_generations=args.group_size, num_iterations=1, beta=0.0, epsilon=0.2,
                                   loss_agg_mode="token-mean")
    learner = TimedLearner(rl_cluster=tunix_cluster(args, inputs["model"], inputs["prompts"]), algo_config=grpo,
                           reward_fns=[last_number_reward])
    # The learner repeats each prompt (and its target) G times.
    learner.train([{"prompts": np.array(inputs["prompts"][i:i + args.prompts]),
                    "target": np.array(inputs["targets"][i:i + args.prompts])}
                   for i in range(0, len(inputs["prompts"]), args.prompts)])
    return {"seconds": times[args.warmup:]}


SIDES = {"jaxrl": jaxrl_side, "trl": trl_side, "tunix": tunix_side}
RIVALS = {"trl": "TRL", "tunix": "Tunix"}


def run_side(side: str, python: str, args, *extra: str) -> dict:
    """One side's RESULT, run by `python` in a process of its own (a peer's with `--peers-malloc-pad-mb`'s
    malloc setting in its environment)."""
    from jaxrl import host

    command = [python, __file__, f"--side={side}", f"--model={args.model}", f"--prompts={args.prompts}",
               f"--group-size={args.group_size}", f"--new-tokens={args.new_tokens}", f"--steps={args.steps}",
               f"--warmup={args.warmup}", f"--malloc-pad-mb={args.malloc_pad_mb}", *extra]
    env = {**os.environ, **(host.freed_memory_environment(args.peers_malloc_pad_mb) if side != "jaxrl" else {})}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=MODEL, help="an installed name, a Hugging Face directory or a .gguf file")
    parser.add_argument("--prompts", type=int, default=8, help="B")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--new-tokens", type=int, default=48, help="N: the most tokens a completion may take")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--side", choices=tuple(SIDES), default=None, help="(internal) run one side")
    parser.add_argument("--inputs", default=None, help="(internal) the Tunix side's inputs file")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--malloc-pad-mb", type=int, default=256,
                        help="the jaxrl side's jaxrl.host.keep_freed_memory, as python -m jaxrl.train applies it "
                             "(0: glibc's default)")
    parser.add_argument("--peers-malloc-pad-mb", type=int, default=0,
                        help="the same malloc setting for the TRL and Tunix sides, through their environment "
                             "(default 0: glibc's, as their users run them)")
    parser.add_argument("--tunix-python", default=None, metavar="PATH",
                        help="a Python with google-tunix installed: runs the Tunix side with it")
    args = parser.parse_args()
    if args.side:
        out = SIDES[args.side](args)
        out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        print("RESULT " + json.dumps(out), flush=True)
        return
    from report import machine

    print(f"{args.model}: one GRPO step, {args.prompts} prompts x {args.group_size} completions of at most "
          f"{args.new_tokens} tokens; {machine()}, {datetime.date.today()}; malloc pad (jaxrl.host): jaxrl "
          f"{args.malloc_pad_mb} MiB, peers {args.peers_malloc_pad_mb} MiB (0: glibc's default)", flush=True)
    runs = [("jaxrl", sys.executable)] + ([] if args.no_trl else [("trl", sys.executable)])
    runs += [("tunix", args.tunix_python)] if args.tunix_python else []
    results = {}
    for side, python in runs:
        with tempfile.TemporaryDirectory(prefix="lm_grpo_") as scratch:  # the Tunix side's inputs, then gone
            extra = [f"--inputs={prepare_tunix_inputs(args, scratch)}"] if side == "tunix" else []
            r = results[side] = run_side(side, python, args, *extra)
        device = f", GPU peak {r['device_peak_gb']:.1f} GB" if "device_peak_gb" in r else ""
        times = ", ".join(f"{s:.2f}" for s in r["seconds"])
        print(f"{side:>6}: {statistics.median(r['seconds']):7.2f} s/step ({times}), "
              f"peak memory {r['peak_rss_gb']:.1f} GB{device}", flush=True)
    for side, name in RIVALS.items():
        if side in results:
            ratio = statistics.median(results[side]["seconds"]) / statistics.median(results["jaxrl"]["seconds"])
            print(f"jaxrl is {ratio:.2f}x {name}'s speed per step")


if __name__ == "__main__":
    main()
