"""Reward models on Countdown (issue 63's acceptance): how well a reward model trained from outcome labels ranks
held-out completions, what GRPO gains with it as its only reward against the verifier's, and best-of-16 reranking by
a process reward model against an outcome one and majority vote.

    python benchmarks/reward_models.py --runs-dir runs/reward_models --update-results

Every run is `python -m jaxrl.train` (runs already in `--runs-dir` are reused, so an interrupted script picks up
where it stopped); evaluations go through `python -m jaxrl.evaluate` (cached beside the runs). Each item below is
a section of the results page, published (with `--update-results`) only from a runs directory that holds all of its
runs finished, so a directory with some of them updates those sections and leaves the others. The policies are the
experiments' small transformer (2 layers, width 128), one SFT run each (the same warm start for every seed after it);
the reward models start from it too:

1. Countdown (3 numbers): SFT on 640,000 demonstrations; a reward model started from the SFT run (its body under a
   fresh value head) and trained on 640,000 of the SFT policy's labelled completions (Bradley-Terry, 3 seeds):
   held-out ranking accuracy. (Probes on 2 cores, 1 seed: from the SFT run, 128,000 completions gave 0.70-0.74;
   4 layers from scratch, 64,000, gave 0.66-0.69: depth alone did not help at that budget.) Beside it, a verifier
   that calls the calculator (`reward_model.critique_by=calculator`: the completion's value written by the tool,
   the goal shown after it, the verdict learned from the same labels), 128,000 completions, 3 seeds.
2. GRPO from the SFT run for 64,000 completions, 3 seeds, with the verifier's reward and with the calculator
   verifier's alone (`orm_calculator`, reward.model_weight=1): held-out accuracy, greedy and sampled, gained over the
   SFT run, and the learned reward against the verifier's during training (the plot). (The Bradley-Terry model's
   reward, 2026-11-30, was hacked: its GRPO run lost 0.41 of greedy accuracy while its learned reward rose.)
3. Critique RL: a judge of Countdown solutions (`countdown_judge`: the candidate's value as its critique, then a
   verdict) warm-started by SFT on 6,400 demonstrations, then GRPO on the verdict's correctness for 128,000
   completions at learning rate 3e-4, 3 seeds: held-out judging accuracy before and after. (The rate from the runs'
   own evaluations on 512 held-out problems at 61,440 completions: 3e-4 0.816 and 1e-3 0.771, one seed each from
   one warm start; 1e-4 0.785, the earlier 3-seed run from its own.)
4. Critique-guided refinement (`countdown_refine`): SFT on 192,000 demonstration episodes (answer, truthful
   critique, revision to the reference), then GRPO for 32,000 episodes, 3 seeds, each role advantaged by its own
   reward; the same without the critique turn (`critic=False`), and with a critic that calls the calculator
   (`critique_by=calculator`: the answer's value is the tool's, the verdict the critic's): the revision's held-out
   success in each. Two sections, each critic beside the baseline trained in the same runs directory.
5. Countdown in steps: SFT on 640,000 demonstrations; process reward models (Monte Carlo step labels, 4
   continuations) and outcome reward models, each from the SFT run, on 64,000 labelled completions each, each under
   both losses (pointwise cross-entropy, Math-Shepherd's; pairwise, Bradley-Terry's: for the process model over every
   two steps of a prompt's completions, `reward_model.step_loss`); on 512
   held-out problems, 16 samples each: the verifier's verdict on the completion each picks, against majority vote
   (a uniform pick among the completions of the most common final result), a random pick and pass@16; the process
   model under each of its step scores (`reward_model.step_score`: min, product, last), from the same training; and
   both process models again under Math-Shepherd's hard estimate of the step labels (`reward_model.step_label=hard`:
   1 where any continuation ends right, so that a step that can still succeed is not marked down by the sampler's
   own success rate, which the weakest-step score would otherwise compare against the last step's verdict).
6. Expressions evaluated in steps (`expression_steps`): Countdown's wrong answers in steps mostly err in their last
   step only (they write the target whatever their operands give; 89% of the SFT policy's wrong samples, 2026-12-04),
   where a step's label and the outcome's are one; here the value is not shown, so a slip carries into the later
   steps. SFT on 160,000 demonstrations (a policy that often errs), then the pairwise hard-label process model and the
   Bradley-Terry outcome model of item 5 on 64,000 labelled completions each: best-of-16 as in item 5.
7. Sums of 5 numbers in 4 steps to a target shown (`countdown_steps`, `operators=+`, `use_all=True`): a slip can lie
   in any step, and every answer ends on the target, so majority vote cannot tell one. SFT on 160,000 demonstrations;
   the pairwise process model with its steps checked by the verifier (`reward_model.step_label=checked`, PRM800K's
   labels) and the Bradley-Terry outcome model, 64,000 labelled completions each, 9 seeds of each (three runs of 3):
   best-of-16 as in item 5 on 4,096 problems, each process pick against the outcome model's and majority vote's with
   a bootstrap interval over problems and seeds (`report.paired_difference`); and the same two judges on 256,000
   each (`prm_sums_256k`, `orm_sums_256k`: at 64,000 neither has learned to check an addition), 3 seeds, 4,096 problems.
8. Judges of another policy's samples: a model that learned sums of 8 numbers (SFT on 160,000 demonstrations, `model.
   max_len` for 8) and then sums of 5 (64,000 more, `sft_sums_from8`: its slips carry on to a wrong result, where
   item 7's policy writes the target whatever its sums gave), the judges of item 7 trained from it on 64,000 of its
   labelled completions, 3 seeds each; best-of-16 on its own samples (1,024 problems), then on item 7's `sft_sums`
   samples (4,096 problems), where the outcome model's cue in training, whether the chain reaches the target, is
   gone and only a step's check is left.
"""

from __future__ import annotations

import collections
import functools
import os
import sys

import numpy as np

from jaxrl.algos.reward_model import STEP_SCORE as STEP_SCORE_KNOB
from jaxrl.reward_models import STEP_SCORES
from jaxrl.sweep import confidence_interval

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the experiments

from experiments.text_sft import model_length  # noqa: E402
from report import (evaluated, fmt_ci, fmt_interval, markdown_table, paired_difference, publish_sections,  # noqa: E402
                    run_rows, runs_arguments, save_figure, seed_band, seed_values, train_run)

SEEDS = 3
JUDGE = ["--config.optim.learning_rate=1e-3", f"--config.num_seeds={SEEDS}", "--config.eval.episodes=512",
         "--config.eval.every_steps=128000", "--config.checkpoint.every_steps=16000"]
GRPO = ["--config.total_steps=64000", "--config.eval.every_steps=16000", "--config.eval.pass_k=0",
        f"--config.num_seeds={SEEDS}"]
NO_CRITIC = ["--config.task.kwargs.critic=False"]  # revision without a critique
# the critic calls the calculator: its critique's value is the tool's, its verdict its own (longer episodes)
TOOL_CRITIC = ["--config.task.kwargs.critique_by=calculator",
               f"--config.model.max_len={model_length('countdown_refine', critique_by='calculator')}"]


def sums_task(num_numbers: int, positions_for: int | None = None) -> list[str]:
    """The flags of sums in steps to a target shown (`countdown_steps`, `operators=+`, `use_all`) of `num_numbers`
    numbers, on a model whose `max_len` fits answers of `positions_for` numbers (default: these)."""
    max_len = model_length("countdown_steps", num_numbers=positions_for or num_numbers, operators="+", use_all=True)
    return [f"--config.task.kwargs.num_numbers={num_numbers}", "--config.task.kwargs.operators=+",
            "--config.task.kwargs.use_all=True", f"--config.model.max_len={max_len}"]


SUMS, SUMS8 = sums_task(5), sums_task(8)
SUMS_ON_8 = sums_task(5, positions_for=8)  # sums of 5 on the sums-of-8 model, so that it can be warm-started from it
HARD = ["--config.reward_model.step_label=hard"]  # Math-Shepherd's hard estimate of a step's label
JUDGE_LEARNING_RATE = "3e-4"  # critique RL's GRPO (see item 3 above)
CHECKED_PROCESS = ["--config.reward_model.objective=process", "--config.reward_model.step_loss=pairwise",
                   "--config.reward_model.step_label=checked"]  # PRM800K's labels under the pairwise step loss


def sums_sft(demonstrations: int, task: list[str] = SUMS, init_from: str | None = None) -> tuple:
    """An SFT run on the sums (`task`'s flags) for `demonstrations`, evaluated and saved every 32,000."""
    return ("text_sft.py:countdown_steps", init_from, [
        *task, f"--config.total_steps={demonstrations}", "--config.eval.every_steps=32000",
        "--config.checkpoint.every_steps=32000", "--config.eval.pass_k=0"])


def sums_judge(completions: int, *flags: str, sft: str = "sft_sums", task: list[str] = SUMS) -> tuple:
    """A judge of the sums (`task`'s flags) from the SFT run `sft` on `completions` labelled completions: the outcome
    model, or with `flags` another kind."""
    return ("text_reward_model.py:countdown_steps", sft, [*task, f"--config.total_steps={completions}", *flags, *JUDGE])


# name -> (experiment, init_from run or None, flags); in the order they run
RUNS = {
    "sft": ("text_sft.py:countdown", None, ["--config.total_steps=640000", "--config.eval.pass_k=0"]),
    "orm": ("text_reward_model.py:countdown", "sft", ["--config.total_steps=640000", *JUDGE]),
    # the verdict read after the calculator's value of the completion (a tool call; only the verdict is learned)
    "orm_calculator": ("text_reward_model.py:countdown", "sft", [
        "--config.total_steps=128000", "--config.reward_model.objective=generative",
        "--config.reward_model.critique_by=calculator", *JUDGE]),
    "grpo_verifier": ("text_grpo.py:countdown", "sft", GRPO),
    "grpo_learned": ("text_grpo.py:countdown", "sft", [*GRPO, "--config.reward.model_weight=1.0"]),
    "sft_judge": ("text_sft.py:countdown_judge", None, ["--config.total_steps=6400", "--config.eval.pass_k=0"]),
    "grpo_judge": ("text_grpo.py:countdown_judge", "sft_judge", [
        *GRPO[1:], "--config.total_steps=128000", f"--config.optim.learning_rate={JUDGE_LEARNING_RATE}"]),
    "sft_refine": ("text_sft.py:countdown_refine", None, ["--config.total_steps=192000", "--config.eval.pass_k=0"]),
    "sft_revise": ("text_sft.py:countdown_refine", None, ["--config.total_steps=192000", "--config.eval.pass_k=0",
                                                          *NO_CRITIC]),
    "grpo_refine": ("text_grpo.py:countdown_refine", "sft_refine", [*GRPO[1:], "--config.total_steps=32000"]),
    "grpo_revise": ("text_grpo.py:countdown_refine", "sft_revise", [*GRPO[1:], "--config.total_steps=32000",
                                                                    *NO_CRITIC]),
    "sft_refine_tool": ("text_sft.py:countdown_refine", None, ["--config.total_steps=192000", "--config.eval.pass_k=0",
                                                               *TOOL_CRITIC]),
    "grpo_refine_tool": ("text_grpo.py:countdown_refine", "sft_refine_tool", [
        *GRPO[1:], "--config.total_steps=32000", *TOOL_CRITIC]),
    "sft_steps": ("text_sft.py:countdown_steps", None, ["--config.total_steps=640000", "--config.eval.pass_k=0"]),
    # (64,000 labelled completions each, 3 seeds: 22 min for the process model, whose Monte Carlo labels cost 4
    # continuations from each step, and 11 min for the outcome model, 2026-12-02 on 2 AMD EPYC cores shared with
    # one other run)
    "prm_steps": ("text_reward_model.py:countdown_steps", "sft_steps", [
        "--config.total_steps=64000", "--config.reward_model.objective=process", *JUDGE]),
    # the process model under the outcome model's pairwise loss (Bradley-Terry over every two steps of a prompt)
    "prm_steps_pairwise": ("text_reward_model.py:countdown_steps", "sft_steps", [
        "--config.total_steps=64000", "--config.reward_model.objective=process",
        "--config.reward_model.step_loss=pairwise", *JUDGE]),
    # the same two under Math-Shepherd's hard estimate: a step labelled 1 where any of its continuations ends right
    "prm_steps_hard": ("text_reward_model.py:countdown_steps", "sft_steps", [
        "--config.total_steps=64000", "--config.reward_model.objective=process", *HARD, *JUDGE]),
    "prm_steps_pairwise_hard": ("text_reward_model.py:countdown_steps", "sft_steps", [
        "--config.total_steps=64000", "--config.reward_model.objective=process",
        "--config.reward_model.step_loss=pairwise", *HARD, *JUDGE]),
    "orm_steps": ("text_reward_model.py:countdown_steps", "sft_steps", ["--config.total_steps=64000", *JUDGE]),
    # the outcome model under the process model's own loss (pointwise cross-entropy; Math-Shepherd's ORM): the two
    # then differ only in their labels, the steps' Monte Carlo shares against the outcome alone
    "orm_steps_pointwise": ("text_reward_model.py:countdown_steps", "sft_steps", [
        "--config.total_steps=64000", "--config.reward_model.objective=pointwise", *JUDGE]),
    # Expressions evaluated in steps (the value not shown, so a slip carries on: where step labels can say more than
    # the outcome), from a weaker SFT policy than Countdown's (160,000 demonstrations: greedy 0.77 held out; 320,000
    # gave 0.96, 96,000 0.16), so that its samples often err
    "sft_expressions": ("text_sft.py:expression_steps", None, [
        "--config.total_steps=160000", "--config.eval.every_steps=32000", "--config.checkpoint.every_steps=32000",
        "--config.eval.pass_k=0"]),
    "prm_expressions": ("text_reward_model.py:expression_steps", "sft_expressions", [
        "--config.total_steps=64000", "--config.reward_model.objective=process",
        "--config.reward_model.step_loss=pairwise", *HARD, *JUDGE]),
    "orm_expressions": ("text_reward_model.py:expression_steps", "sft_expressions", [
        "--config.total_steps=64000", *JUDGE]),
    # Sums of 5 numbers in 4 steps to a target shown (`operators=+`, `use_all`): every answer ends on the target, so
    # majority vote cannot tell a slip, which can lie in any step, each an addition; the process model's steps checked
    # by the verifier (PRM800K's labels: Monte Carlo labels from 4 continuations of each of 3 inner steps of 60-token
    # answers were estimated at 7.5 hours for the 3 seeds on 2 shared cores, 2026-12-04)
    "sft_sums": sums_sft(160000),
    "prm_sums": sums_judge(64000, *CHECKED_PROCESS),
    "orm_sums": sums_judge(64000),
    # 3 more seeds of each (from `config.seed=1`'s keys), pooled with the 3 above in the section
    "prm_sums_more": sums_judge(64000, *CHECKED_PROCESS, "--config.seed=1"),
    "orm_sums_more": sums_judge(64000, "--config.seed=1"),
    # and 3 more again (`config.seed=2`): 9 seeds of each judge in the section
    "prm_sums_seed2": sums_judge(64000, *CHECKED_PROCESS, "--config.seed=2"),
    "orm_sums_seed2": sums_judge(64000, "--config.seed=2"),
    # the same two judges on 4x the labelled completions (256,000: on one H200 about 3 and 2 minutes for 3 seeds, on
    # 2 CPU cores about 2 hours each), where the process model's pick beats majority vote but ties the outcome model's
    "prm_sums_256k": sums_judge(256000, *CHECKED_PROCESS),
    "orm_sums_256k": sums_judge(256000),
    # Judges of another policy's sums (item 8): a body that learned sums of 8 and then of 5, whose own slips carry
    # on to a wrong result, judges trained on its completions, then reranking `sft_sums`'s, which end on the target
    "sft_sums8": sums_sft(160000, SUMS8),
    "sft_sums_from8": sums_sft(64000, SUMS_ON_8, init_from="sft_sums8"),
    "prm_sums_from8": sums_judge(64000, *CHECKED_PROCESS, sft="sft_sums_from8", task=SUMS_ON_8),
    "orm_sums_from8": sums_judge(64000, sft="sft_sums_from8", task=SUMS_ON_8),
}
REWARD_MODEL_OF = {"grpo_learned": "orm_calculator"}  # reward.model


def train(runs_dir: str, name: str) -> None:
    experiment, init_from, flags = RUNS[name]
    flags = list(flags)
    if name in REWARD_MODEL_OF:
        flags.append(f"--config.reward.model={os.path.join(runs_dir, REWARD_MODEL_OF[name])}")
    train_run(runs_dir, name, experiment, init_from, flags)


STEP_SCORE = STEP_SCORE_KNOB.key  # the config key of how a process model's step values make its score
OUTCOME_BT = "outcome reward model, pairwise (Bradley-Terry)"  # best-of-16's row the process models are compared with


def reranking_judges() -> list[tuple[str, str, dict]]:
    """Best-of-16's reward models: (row label, run, config keys that change how it scores, not what it learned)."""
    pointwise = [(f"process reward model, pointwise, step score {how}", "prm_steps", {STEP_SCORE: how})
                 for how in STEP_SCORES]
    pairwise = [(f"process reward model, pairwise, step score {how}", "prm_steps_pairwise", {STEP_SCORE: how})
                for how in ("min", "last")]
    hard = [(f"process reward model, {loss}, hard labels, step score min", run, {})
            for loss, run in (("pointwise", "prm_steps_hard"), ("pairwise", "prm_steps_pairwise_hard"))]
    return pointwise + pairwise + hard + [("outcome reward model, pointwise", "orm_steps_pointwise", {}),
                                          (OUTCOME_BT, "orm_steps", {})]


def pairwise_judges(process_runs, outcome_runs, labels: str = "hard") -> list[tuple[str, object, dict]]:
    """Best-of-16's reward models on a task in steps: the pairwise process model (its step labels `labels`) under
    each step score, and the Bradley-Terry outcome model (the two best forms on Countdown); each from its runs (a
    run's name, or a tuple of runs whose seeds are pooled)."""
    return [(f"process reward model, pairwise, {labels} labels, step score {how}", process_runs, {STEP_SCORE: how})
            for how in STEP_SCORES] + [(OUTCOME_BT, outcome_runs, {})]


def reranking(runs_dir: str, problems: int = 512, samples: int = 16, judges=None, sampler_run: str = "sft_steps",
              heldout_seed: int = 4321) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Best-of-`samples` on held-out problems of a task in steps (the task of `sampler_run`, the policy sampled):
    the verifier's verdict on each problem's pick, float [seeds, problems] per judge (the same completions judged by
    each seed of each reward model; one row for a judge without seeds), for the process and the outcome reward
    models, the sampler's own likelihood (a judge with no training), majority vote (its expected verdict), a random
    pick (likewise) and pass@k (any of them); and where the wrong samples first go wrong (`first_slips`). judges:
    (label, runs, config keys) of the reward models, `reranking_judges()` by default; a judge's seeds are those of
    its runs (one run's name, or a tuple of runs of one configuration trained from other seeds), in order.
    heldout_seed: which held-out problems (the task's `heldout` draw; another seed, another set to replicate on)."""
    import jax

    import jaxrl
    from envs.text.verify import check_countdown_steps

    sampler = jaxrl.load_policy(os.path.join(runs_dir, sampler_run))
    task = sampler.task
    heldout = task.heldout(problems, seed=heldout_seed)
    prompts = [prompt for prompt, _ in task.texts(heldout)]
    completions = [sampler.complete(prompts, jax.random.key(k)) for k in range(samples)]  # [k][problem]
    numbers, targets = np.asarray(heldout.numbers), np.asarray(heldout.target)
    checked = [[check_countdown_steps(completions[k][i], numbers[i], int(targets[i]), task.use_all)
                for k in range(samples)] for i in range(problems)]  # [problem][k]: (correct, well_formed, steps)
    right = np.array([[correct for correct, _, _ in row] for row in checked])  # [problem, k]

    def scored(score):  # score(prompts, completions) -> [problems] (or {how: [problems]}) -> [problems, samples]
        return jax.tree.map(lambda *columns: np.stack(columns, axis=1),
                            *(score(prompts, completions[k]) for k in range(samples)))

    def best_of(scores: np.ndarray) -> np.ndarray:  # [problems, samples] -> the pick's verdict [problems]
        return right[np.arange(problems), scores.argmax(1)].astype(np.float64)

    step_passes = {}  # (run, its other keys) -> per seed, {how: [problems, samples]}: one pass, every step score

    def seed_scores(run: str, keys: dict) -> list[np.ndarray]:  # each seed's [problems, samples]
        how = keys.get(STEP_SCORE)
        if how is None:
            return [scored(scorer.score) for scorer in judges_of(os.path.join(runs_dir, run), keys)]
        others = {key: value for key, value in keys.items() if key != STEP_SCORE}
        cached = (run, tuple(sorted(others.items())))
        if cached not in step_passes:
            step_passes[cached] = [scored(scorer.step_scores)
                                   for scorer in judges_of(os.path.join(runs_dir, run), others)]
        return [scores[how] for scores in step_passes[cached]]

    picked = {label: np.stack([best_of(scores) for run in ((runs,) if isinstance(runs, str) else runs)
                               for scores in seed_scores(run, keys)])
              for label, runs, keys in judges or reranking_judges()}
    finals = [[(c.rsplit("=", 1)[-1] if c else None) for c in row] for row in zip(*completions)]  # [problem][k]
    return {**picked, "the sampler's likelihood (no training)": best_of(scored(sampler.log_likelihood))[None],
            "majority vote": np.array([[majority_vote(row, right[i]) for i, row in enumerate(finals)]]),
            "a random sample": right.mean(1)[None], f"pass@{samples}": right.any(1)[None].astype(np.float64)}, \
        first_slips(checked)


def first_slips(checked: list) -> dict[str, float]:
    """Where the wrong samples first go wrong: checked [problem][k] of `check_countdown_steps` verdicts -> the share
    of the well-formed wrong samples whose first wrong step is each step ("step 1", ... , "last", "none": every step
    right, the result wrong)."""
    slips = collections.Counter()
    for correct, well_formed, steps in (verdict for row in checked for verdict in row):
        if well_formed and not correct:
            first = next((k for k, step_right in enumerate(steps) if not step_right), None)
            slips["none" if first is None else "last" if first == len(steps) - 1 else f"step {first + 1}"] += 1
    total = sum(slips.values())
    order = lambda where: (where == "none", where == "last", where)  # noqa: E731  (step 1, step 2, ..., last, none)
    return {where: slips[where] / total for where in sorted(slips, key=order)}


def slips_line(slips: dict[str, float]) -> str:
    """A sentence saying where the sampler's wrong answers first go wrong (`first_slips`)."""
    shares = ", ".join(f"{where} {share:.1%}" for where, share in slips.items())
    return f"The sampler's well-formed wrong answers, by their first wrong step: {shares}."


def judges_of(run: str, keys: dict) -> list:
    """Each seed of a reward model run as a scorer of strings, with config `keys` changed (how it scores, not what it
    learned: a process model's `reward_model.step_score`); the run is built and restored once."""
    import jax

    from jaxrl import algos, config as config_lib, mesh as mesh_lib
    from jaxrl.run.saved import start_params

    config = config_lib.set_values(algos.saved_config(os.path.join(run, "config.json")), keys)
    algo, _ = algos.build(config, mesh_lib.make_mesh(), run_dir=run)
    params = start_params(run)
    return [algo.actor(jax.tree.map(lambda x: x[seed], params)) for seed in range(config.num_seeds)]


def majority_vote(finals: list, right: np.ndarray) -> float:
    """Majority vote's expected verdict on one problem: a uniform pick among the completions whose final result is
    the most common one (`finals` [k], None where there is none; `right` bool [k]). Countdown's completions mostly
    end at the target, right or wrong, so the vote narrows the pick without settling it; 0 where none has a result."""
    counts = collections.Counter(f for f in finals if f)
    if not counts:
        return 0.0
    voted = counts.most_common(1)[0][0]
    return float(np.mean([r for f, r in zip(finals, right) if f == voted]))


# refinement sections -> (heading, (row label, run) ...): the critic that writes the value itself and the one that
# calls the calculator, each against the baseline without a critique trained in the same runs directory
REFINEMENT = {
    "refinement": ("Critique-guided refinement: revision success with a critique and without", (
        ("SFT, with the critique", "sft_refine"), ("SFT, without", "sft_revise"),
        ("GRPO, with the critique", "grpo_refine"), ("GRPO, without", "grpo_revise"))),
    "refinement_tool": ("Refinement with a critic that calls the calculator, and without a critique", (
        ("SFT, with the calculator's critique", "sft_refine_tool"), ("SFT, without", "sft_revise"),
        ("GRPO, with the calculator's critique", "grpo_refine_tool"), ("GRPO, without", "grpo_revise")))}
REFINEMENT_SETTING = (
    "One model answers, critiques its answer (the value, then Y or N) and revises (`countdown_refine`); the baseline "
    "revises without the critique turn (`critic=False`). GRPO: 32,000 episodes, each role's turn advantaged by its "
    "own reward (CTRL's for the critic: the revision's success). With the calculator's critique "
    "(`critique_by=calculator`, CRITIC), the critic calls the calculator on the answer and writes only its verdict.")

from8_judges = functools.partial(pairwise_judges, "prm_sums_from8", "orm_sums_from8", "checked")  # item 8's
# best-of-16 sections -> (heading, what the task is, the judges, the sampler's run, held-out problems)
RERANKING = {"reranking": ("Countdown in steps", "", reranking_judges, "sft_steps", 512),
             "reranking_expressions": ("expressions evaluated in steps", "`expression_steps` (`12+11*6=` -> "
                                       "`11*6=66;12+66=78`, the value not shown): ",
                                       functools.partial(pairwise_judges, "prm_expressions", "orm_expressions"),
                                       "sft_expressions", 512),
             # (4,096 problems: on 512, a judge's pick spread over its seeds 1.3-2x as far as on 4,096)
             "reranking_sums": ("sums of 5 numbers in steps to a target", "`countdown_steps` with `num_numbers=5`, "
                                "`operators=+` and `use_all=True` (`24 9 9 2 13>57=` -> "
                                "`9+24=33;2+13=15;9+15=24;24+33=57`): ",
                                functools.partial(pairwise_judges, ("prm_sums", "prm_sums_more", "prm_sums_seed2"),
                                                  ("orm_sums", "orm_sums_more", "orm_sums_seed2"), "checked"),
                                "sft_sums", 4096),
             "reranking_sums_256k": ("sums of 5 numbers in steps to a target, judges on 256,000 labelled completions",
                                     "the same task as above: ", functools.partial(
                                         pairwise_judges, "prm_sums_256k", "orm_sums_256k", "checked"), "sft_sums",
                                     4096),
             "reranking_sums_from8": ("sums of 5 numbers in steps, judges and sampler from a model of sums of 8",
                                      "`sft_sums_from8` samples (its slips carry on to a wrong result, so majority "
                                      "vote finds most of them) and the judges were trained on its completions: ",
                                      from8_judges, "sft_sums_from8", 1024),
             "reranking_sums_other_sampler": ("sums of 5 numbers in steps, judges trained on another policy's "
                                              "completions", "`sft_sums` samples (every answer ends on the target); "
                                              "the judges of the section above, trained on `sft_sums_from8`'s "
                                              "completions, pick: ", from8_judges, "sft_sums", 4096)}

# section -> the runs it reports (`report.publish_sections`)
SECTIONS = {"orm": ["orm", "orm_calculator"],
            "reward_model_grpo": ["sft", REWARD_MODEL_OF["grpo_learned"], "grpo_verifier", "grpo_learned"],
            "critique_rl": ["sft_judge", "grpo_judge"],
            "refinement": [run for _, run in REFINEMENT["refinement"][1]],
            "refinement_tool": [run for _, run in REFINEMENT["refinement_tool"][1]],
            "reranking": ["sft_steps", "prm_steps", "prm_steps_pairwise", "prm_steps_hard", "prm_steps_pairwise_hard",
                          "orm_steps", "orm_steps_pointwise"],
            "reranking_expressions": ["sft_expressions", "prm_expressions", "orm_expressions"],
            "reranking_sums": ["sft_sums", "prm_sums", "orm_sums", "prm_sums_more", "orm_sums_more", "prm_sums_seed2",
                               "orm_sums_seed2"],
            "reranking_sums_256k": ["sft_sums", "prm_sums_256k", "orm_sums_256k"],
            "reranking_sums_from8": ["sft_sums8", "sft_sums_from8", "prm_sums_from8", "orm_sums_from8"],
            "reranking_sums_other_sampler": ["sft_sums", "sft_sums8", "sft_sums_from8", "prm_sums_from8",
                                             "orm_sums_from8"]}


def share_of_gain(verifier: np.ndarray, learned: np.ndarray) -> str:
    """What share of the verifier-reward run's gain (per seed) the learned-reward run's gain is, said only where the
    verifier's gain is measurable (its interval's low end above 0)."""
    _, low, _ = confidence_interval(verifier)
    if low > 0:
        return f"the reward model's run gains {learned.mean() / verifier.mean():.2f} of the verifier's"
    return "the verifier's own run gains nothing measurable (its interval reaches 0), so the share is undefined"


def section_lines(runs_dir: str, name: str) -> list[str]:
    """Section `name`'s heading and tables, from the runs in `runs_dir`."""
    if name == "orm":
        models = [evaluated(runs_dir, run, episodes=512) for run in ("orm", "orm_calculator")]
        return ["### Outcome reward models' ranking (Countdown, held-out)", markdown_table(
            ["metric", "Bradley-Terry, 640,000 completions", "the verdict after the calculator's value, 128,000"],
            [[key, *(fmt_ci(seed_values(model, key), (0, 1)) for model in models)] for key in
             ("eval_ranking_accuracy", "eval_label_accuracy", "eval_best_of_n", "eval_sampled_accuracy")])]
    if name == "reward_model_grpo":
        rows, shares = [], []
        for sample, decoding in ((False, "greedy"), (True, "sampled at temperature 1")):
            sft = evaluated(runs_dir, "sft", sample=sample)["eval_accuracy"]
            verifier, learned = (np.asarray(seed_values(evaluated(runs_dir, run, sample=sample), "eval_accuracy")) - sft
                                 for run in ("grpo_verifier", "grpo_learned"))
            rows.append([decoding, f"{sft:.3f}", fmt_ci(verifier), fmt_ci(learned)])
            shares.append(f"{decoding}: {share_of_gain(verifier, learned)}")
        return ["### GRPO with the reward model alone against the verifier's reward, 64,000 completions",
                f"The reward model is `{REWARD_MODEL_OF['grpo_learned']}` (the verdict after the calculator's value; "
                "each GRPO seed reads the same seed of it), its sigmoid(score) the only reward "
                "(`reward.model_weight=1`). Held-out accuracy on 1,024 problems, gained over the SFT run both start "
                "from:", "",
                markdown_table(["decoding", "SFT", "gain, the verifier's reward", "gain, the reward model's alone"],
                               rows), "", "; ".join(shares) + ".", "",
                "![learned and true reward during GRPO](reward_models.png)"]
    if name == "critique_rl":
        before = evaluated(runs_dir, "sft_judge")["eval_accuracy"]
        after = seed_values(evaluated(runs_dir, "grpo_judge"), "eval_accuracy")
        return ["### Critique RL: judging Countdown solutions (held-out, greedy)",
                markdown_table(["judge", "accuracy"], [["SFT warm start, 6,400 demonstrations", f"{before:.3f}"],
                                                        ["then GRPO on the verdict, 128,000 completions (learning "
                                                         f"rate {JUDGE_LEARNING_RATE})", fmt_ci(after, (0, 1))]])]
    if name in REFINEMENT:
        heading, runs = REFINEMENT[name]
        summaries = {run: evaluated(runs_dir, run) for _, run in runs}
        return [f"### {heading} (held-out, greedy)", REFINEMENT_SETTING, "", markdown_table(
            ["run", "first answer right", "revision right"],
            [[label, fmt_ci(seed_values(summaries[run], "eval_turn1_reward"), (0, 1)),
              fmt_ci(seed_values(summaries[run], "eval_success"), (0, 1))] for label, run in runs])]
    heading, setting, judges, sampler_run, problems = RERANKING[name]
    picked, slips = reranking(runs_dir, problems, judges=judges(), sampler_run=sampler_run)
    said = f"{setting}the same completions for every pick; each judge's figure over its seeds. {slips_line(slips)}"
    seeds = max(len(v) for v in picked.values())
    return [f"### Best-of-16 on {heading} ({problems:,} held-out problems, 16 samples each; {seeds} seeds of each "
            "reward model)", said[0].upper() + said[1:], "",
            markdown_table(["pick", "verifier accepts", "per seed"],
                           [[k, fmt_ci(v.mean(1), (0, 1), digits=3),
                             ", ".join(f"{x:.3f}" for x in v.mean(1)) if len(v) > 1 else ""]
                            for k, v in picked.items()]), "",
            "The process model's pick against the others' (a bootstrap's 95% interval, drawing the problems and "
            "each judge's seeds anew):", "", markdown_table(["pick", "minus", "verifier accepts, difference"], [
                [k, other, fmt_interval(*paired_difference(picked[k], picked[other]), digits=3, sign="+")]
                for k in picked if k.startswith("process") for other in (OUTCOME_BT, "majority vote")])]


def main():
    args = runs_arguments(__doc__.split("\n")[0], RUNS, train)
    publish_sections("reward_models", "Reward models (issue 63)", SECTIONS, args.runs_dir, args.update_results,
                     lambda name: section_lines(args.runs_dir, name),
                     "Intervals: 95% over the seeds (3 unless the heading says more).",
                     draw=lambda name: plot(args.runs_dir) if name == "reward_model_grpo" else None)


def plot(runs_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in run_rows(os.path.join(runs_dir, "grpo_learned")) if "reward_verified" in r]
    steps = np.asarray([r["env_steps"] for r in rows])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (("reward_correct", "learned reward"), ("reward_verified", "verifier's reward")):
        values = np.asarray([r.get(f"{key}_per_seed") or [r[key]] for r in rows], np.float64)
        seed_band(ax, steps, values, label)
    ax.set_xlabel("completions")
    ax.set_ylabel("mean reward of the samples")
    ax.legend()
    save_figure(fig, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reward_models.png"))


if __name__ == "__main__":
    main()
