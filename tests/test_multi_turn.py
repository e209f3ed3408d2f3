"""Multi-turn text environments, their tools and the compiled conversation loop (`envs.text.turns`, `envs.text.tools`,
`jaxrl.multi_turn`), and the per-turn advantage estimators."""

import collections
import functools
import random
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text
from envs.text import tools, turns
from envs.text.verify import ExpressionError, parse_expression
from jaxrl import advantages, models, multi_turn, sampling
from jaxrl.models.decoder import Decoder
from jaxrl.transformer import TransformerConfig, TransformerLM

VOCAB = text.Vocab.from_alphabet(turns.Lookup.alphabet)
# Problems are drawn SAMPLED at a time (sliced where fewer are wanted), as many as `_episodes`' tokenizer corpus
# (`text.corpus(tasks, 64)`) draws of each split: each task's sampler compiles once (its batch size is static).
SAMPLED = 32


def _random_expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.3:
        return str(rng.choice([0, 1, 2, 3, 7, 12, 25, 100]))
    left, right = _random_expression(rng, depth + 1), _random_expression(rng, depth + 1)
    text_ = f"{left}{rng.choice('+-*/')}{right}"
    return f"({text_})" if rng.random() < 0.3 else text_


def _mangle(rng: random.Random, expression: str) -> str:
    """Malformed variants: a character dropped, doubled or swapped for another of the alphabet (some stay valid)."""
    i = rng.randrange(len(expression))
    choice = rng.randrange(3)
    if choice == 0:
        return expression[:i] + expression[i + 1:]
    if choice == 1:
        return expression[:i] + expression[i] + expression[i:]
    return expression[:i] + rng.choice("0123456789+-*/()a") + expression[i + 1:]


def _python(expression: str):
    """(value, literals) by the host's exact parser, or None where it is not an expression or divides by zero."""
    try:
        value, literals = parse_expression(expression)
    except ExpressionError:
        return None
    return None if value is None else (value, literals)


def test_the_calculator_agrees_with_python_on_random_and_malformed_expressions():
    rng = random.Random(0)
    expressions = [_random_expression(rng) for _ in range(300)]
    expressions += [_mangle(rng, e) for e in expressions] + ["", "(", "()", "1+", "+1", "01", "0", "7/0", "(1+2",
                                                             "1+2)", "2(3)", "(7-3)/8*6", "1/3+1/6", "3-10"]
    width = max(map(len, expressions))
    ids = np.full((len(expressions), width), VOCAB.pad_id, np.int32)
    for row, e in enumerate(expressions):
        ids[row, :len(e)] = [VOCAB.id_of(c) for c in e]
    lengths = jnp.asarray([len(e) for e in expressions])
    calc = jax.jit(jax.vmap(lambda t, n: tools.calculator(t, n, VOCAB)))(ids, lengths)
    errors = 0
    for row, e in enumerate(expressions):
        expected = _python(e)
        if expected is None or abs(expected[0].numerator) >= tools.MAX_MAGNITUDE or expected[0].denominator >= \
                tools.MAX_MAGNITUDE:
            assert bool(calc.error[row]), e
            errors += 1
            continue
        assert not bool(calc.error[row]), e
        assert Fraction(int(calc.numerator[row]), int(calc.denominator[row])) == expected[0], e
        assert list(np.asarray(calc.literals[row, :int(calc.num_literals[row])])) == expected[1], e
    assert 50 < errors < len(expressions) - 300  # both kinds were exercised


def test_values_render_as_text():
    calc = tools.Calculation(jnp.int32(-7), jnp.int32(2), jnp.bool_(False), jnp.zeros(1, jnp.int32), jnp.int32(0))
    ids, length = tools.render_value(calc, tools.value_width(), VOCAB)
    assert VOCAB.text(list(np.asarray(ids[:length])) + [VOCAB.eos_id]) == "-7/2"


def _turn(task, vocab, body: str) -> jax.Array:
    ids = [vocab.id_of(c) for c in body] + [vocab.eos_id]
    return jnp.asarray(ids + [vocab.pad_id] * (task.turn_length - len(ids)), jnp.int32)


def _observation(reply, vocab) -> str:
    return "".join(vocab.tokens[int(i)] for i in np.asarray(reply.observation)[:int(reply.observation_length)])


def test_tool_calls_and_malformed_calls_answer_without_ending_the_episode():
    task = text.make_task("lookup")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problem = task.sample(jax.random.key(3), SAMPLED, "train")[0]
    state, _ = task.start(problem)
    reply_to = jax.jit(lambda turn: task.respond(problem, state, turn, 0, vocab))
    respond = lambda body: reply_to(_turn(task, vocab, body))  # noqa: E731
    keys = "abcdef"
    value = int(problem.numbers[2])
    reply = respond("@c")
    assert _observation(reply, vocab) == str(value) and bool(reply.tool_call) and not bool(reply.tool_error)
    assert not bool(reply.done) and bool(reply.well_formed)
    assert _observation(respond("#3*(2+5)"), vocab) == "21"
    assert _observation(respond("#7/2"), vocab) == "7/2"
    for malformed in ("#3*+", "#1/0", "#", "@h", "@", "@ab"):
        reply = respond(malformed)
        assert _observation(reply, vocab) == "!", malformed
        assert bool(reply.tool_call) and bool(reply.tool_error) and not bool(reply.done), malformed
        assert not bool(reply.well_formed), malformed
    i, j, op = (int(x) for x in problem.recipe[0])
    right = respond(str(int(problem.target)))
    assert bool(right.done) and bool(right.solved) and float(right.reward) == 1.0 and not bool(right.tool_call)
    wrong = respond(str(int(problem.target) + 1))
    assert bool(wrong.done) and not bool(wrong.solved) and float(wrong.reward) == 0.0
    assert keys[i] != keys[j] and op in (0, 2)  # the prompt's question: a sum or a product of two keys


def test_the_guessing_game_answers_higher_lower_and_errors():
    task = text.make_task("guess")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problem = task.sample(jax.random.key(0), 1, "train")[0]
    secret = int(problem.target)
    state, _ = task.start(problem)
    reply_to = jax.jit(lambda turn, k: task.respond(problem, state, turn, k, vocab))
    step = lambda body, k=0: reply_to(_turn(task, vocab, body), k)  # noqa: E731
    assert _observation(step(str(secret - 1)), vocab) == ">" and _observation(step(str(secret + 1)), vocab) == "<"
    for malformed in ("<>", "0", "1025", "0012", "", "1-2"):
        reply = step(malformed)
        assert _observation(reply, vocab) == "!" and not bool(reply.done) and not bool(reply.well_formed), malformed
    found = step(str(secret), k=4)  # the fifth turn
    assert bool(found.done) and float(found.reward) == pytest.approx(1 - 4 * task.turn_cost)
    lower = step(str(secret + 1)).state
    assert int(lower[1]) == secret and int(lower[0]) == task.low  # the interval the answers leave


def test_every_secret_of_the_guessing_game_is_drawn_in_both_splits():
    task = text.make_task("guess", high=64)
    for split in ("train", "test"):
        secrets = np.asarray(task.sample(jax.random.key(0), 4096, split).target)
        assert secrets.min() == 1 and secrets.max() == 64 and len(np.unique(secrets)) == 64, split


@pytest.mark.parametrize("name", sorted(text.MULTI_TURN_TASKS))
def test_demonstrations_solve_every_task(name):
    task = text.make_task(name)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problems = task.sample(jax.random.key(1), SAMPLED, "train")
    outcome = task.replay(problems, task.reference_answers(problems, vocab), vocab)
    assert bool(outcome["solved"].any(-1).all()), name
    assert bool(outcome["well_formed"][outcome["taken"]].all()), name
    if name == "guess":  # binary search: at most 11 guesses in 1..1024
        assert int(outcome["taken"].sum(-1).max()) <= 11


def test_a_calculator_search_imitates_its_hit_and_its_answer_not_its_misses():
    """Supervised learning imitates a demonstration's check that hits the target and its answer; the checks that
    missed before it are played (the model reads them and their values) but not imitated, unless imitate_misses."""
    task = text.make_task("countdown_tools")  # (the problems and demonstrations of test_demonstrations_solve_every_task)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problems = task.sample(jax.random.key(1), SAMPLED, "train")
    episodes = task.reference_answers(problems, vocab)
    imitated = np.asarray(task.imitated_slots(episodes, vocab))
    every_turn = np.asarray(text.make_task("countdown_tools", imitate_misses=True).imitated_slots(episodes, vocab))
    episodes, targets = np.asarray(episodes), np.asarray(problems.target)
    turn_of, model_slot = task.turn_slots()
    np.testing.assert_array_equal(every_turn, (episodes != vocab.pad_id) & model_slot)
    misses = first_misses = 0
    for b in range(SAMPLED):
        for k in range(task.max_turns):
            slots = (turn_of == k) & model_slot & (episodes[b] != vocab.pad_id)
            said = "".join(vocab.tokens[i] for i in episodes[b][slots] if i != vocab.eos_id)
            if not said:
                continue
            value = _python(said[1:]) if said.startswith("#") else None
            missed = said.startswith("#") and (value is None or value[0] != targets[b])
            misses += missed
            first_misses += missed and k == 0
            assert (imitated[b][slots] == (not missed)).all(), (b, k, said, int(targets[b]))
    assert misses > 0
    assert 0.2 * SAMPLED < first_misses < 0.8 * SAMPLED  # miss_share 0.5 of the demonstrations check a miss first


def _said(task, vocab, episode: np.ndarray) -> list[str]:
    """The model turns of an episode [N] (slot layout) as text, EOS dropped, empty turns left out."""
    turn_of, model_slot = task.turn_slots()
    said = ["".join(vocab.tokens[i] for i in episode[(turn_of == k) & model_slot] if i not in (vocab.pad_id,
                                                                                              vocab.eos_id))
            for k in range(task.max_turns)]
    return [t for t in said if t]


def test_a_roll_in_is_continued_by_the_demonstrator_from_the_state_it_reached():
    """DAgger's roll-in (`reference_answers` with a prefix): after the learner's turns the demonstrator follows its
    own rule from the state they reached: a check that missed (or reached the target's value with numbers not given)
    is followed by a check of the reference and its answer, or by the answer when no check is left; a check that hit
    is answered as the learner wrote it; an answer ends the episode. Without a roll-in, its own search."""
    task = text.make_task("countdown_tools")  # 4 turns: up to three checks, then the answer
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problems = task.sample(jax.random.key(1), SAMPLED, "train")
    references = [answer for _, answer in task.base.texts(problems)]
    targets = [int(t) for t in np.asarray(problems.target)]
    rolled_in = [[[f"#{t + 1}"], [f"#{t}"], [f"#({r})"], [r], [], [f"#{t + 1}", f"#{t + 2}", f"#{t + 3}"]][b % 6]
                 for b, (t, r) in enumerate(zip(targets, references))]
    rolled_in = [turns if all(len(t) < task.turn_length for t in turns) else [] for turns in rolled_in]
    prefix = np.full((SAMPLED, task.answer_length), vocab.pad_id, np.int32)
    for b, turns in enumerate(rolled_in):
        for k, body in enumerate(turns):
            prefix[b, k * task.turn_span:k * task.turn_span + task.turn_length] = np.asarray(_turn(task, vocab, body))
    learner_turns = np.asarray([len(turns) for turns in rolled_in], np.int32)
    # (both with a prefix, the second of no turns: one compiled program)
    episodes, own = (np.asarray(task.reference_answers(problems, vocab, jnp.asarray(prefix), jnp.asarray(turns)))
                     for turns in (learner_turns, np.zeros_like(learner_turns)))
    solved = np.asarray(task.rewards(problems, jnp.asarray(episodes), vocab))[:, 0]
    kinds = collections.Counter()
    for b, (turns, reference, target) in enumerate(zip(rolled_in, references, targets)):
        said = _said(task, vocab, episodes[b])
        given = target in np.asarray(problems.numbers[b]).tolist()  # (the target alone is then a right answer)
        if not turns:
            np.testing.assert_array_equal(episodes[b], own[b])
            kind = "own"
        elif len(turns) == 3:
            assert said == [*turns, reference], (b, said)  # no check left: the answer
            kind = "three misses"
        elif turns[0].startswith("#(") or (turns[0] == f"#{target}" and given):
            assert said == [turns[0], turns[0][1:]], (b, said)  # the learner's hit, answered as written
            kind = "hit"
        elif turns[0].startswith("#"):
            assert said == [turns[0], f"#{reference}", reference], (b, said, reference)
            kind = "value without the numbers" if turns[0] == f"#{target}" else "miss"
        else:
            assert said == turns, (b, said)  # an answer ends the episode
            kind = "answer"
        kinds[kind] += 1
        assert solved[b] == 1.0, (b, said)
    assert min(kinds[k] for k in ("own", "three misses", "hit", "miss", "answer", "value without the numbers")) >= 2, \
        kinds


@functools.lru_cache(maxsize=None)  # (the tests share a task's episodes: playing compiles once)
def _episodes(task_name="lookup", group=3, seed=0, architecture="small"):
    task = text.make_task(task_name)
    tokenizer = text.train_tokenizer(text.corpus([task], 64), alphabet=task.alphabet)
    vocab = text.Vocab.from_tokenizer(tokenizer)
    max_len = task.prompt_length + task.answer_length
    if architecture == "small":
        model = TransformerLM(TransformerConfig(vocab.size, max_len=max_len, d_model=32, num_heads=2))
    else:  # a pretrained family's architecture (rotary positions, grouped-query attention, RMSNorm)
        model = Decoder(models.ModelConfig(family="llama", vocab_size=vocab.size, hidden_size=32, num_layers=2,
                                           num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                                           max_len=max_len, eos_ids=(vocab.eos_id,), pad_id=vocab.pad_id, bos_id=1))
    problems = jax.tree.map(lambda x: np.asarray(x)[:4], task.sample(jax.random.key(seed), SAMPLED, "train"))
    prompts = task.prompts(problems, vocab)
    # jitted: eager calls compile each primitive separately
    params = jax.jit(model.init)(jax.random.key(1), prompts, jnp.zeros_like(prompts), prompts > 0)
    episodes = multi_turn.play(model, params, task, vocab, problems, prompts, jax.random.split(jax.random.key(2), 4),
                               group_size=group)
    return task, vocab, model, params, problems, prompts, episodes


def test_the_loss_mask_covers_exactly_the_model_tokens():
    task, vocab, model, params, problems, prompts, episodes = _episodes()
    log_probs, entropy, _ = sampling.score_groups(model, params, prompts, episodes.tokens, episodes.mask, vocab.pad_id,
                                                  episodes.attend)
    # (read back as NumPy: eager jax operations would compile each separately)
    episodes, log_probs, entropy = jax.device_get((episodes, log_probs, entropy))
    _, model_slot = task.turn_slots()
    written = episodes.attend & model_slot
    np.testing.assert_array_equal(episodes.mask > 0, written)
    # the environment's tokens are real (attended to) but never learned: no log-probability, no loss weight
    environment = episodes.attend & ~model_slot
    assert environment.sum() > 0 and np.abs(episodes.log_probs * environment).max() == 0.0
    assert np.abs(log_probs * environment).max() == 0.0 and np.abs(entropy * environment).max() == 0
    # each turn's model tokens: from its first slot up to and including EOS (or the turn budget)
    turns_taken = episodes.turns["taken"]
    per_turn = (episodes.mask.reshape(*episodes.mask.shape[:2], task.max_turns, -1) > 0).sum(-1)
    assert (per_turn[turns_taken] >= 1).all() and (per_turn[~turns_taken] == 0).all()


@pytest.mark.parametrize("task_name, architecture", [("lookup", "small"), ("guess", "small"), ("guess", "llama")])
def test_the_kv_cache_across_turns_gives_the_logits_of_reencoding_the_conversation(task_name, architecture):
    task, vocab, model, params, problems, prompts, episodes = _episodes(task_name, architecture=architecture)
    # Each conversation packed (prompt, then its real tokens: no gaps, positions 0, 1, ...), right-padded to one width
    # (causal attention: the padding after a conversation changes nothing before it), all in one forward pass.
    conversations, learned = [], []
    # (read back as NumPy once: indexing them eagerly would compile each slice separately)
    attend, tokens, mask = np.asarray(episodes.attend), np.asarray(episodes.tokens), np.asarray(episodes.mask)
    for b in range(prompts.shape[0]):
        for g in range(episodes.tokens.shape[1]):
            prompt = [int(x) for x in np.asarray(prompts[b]) if x != vocab.pad_id]
            conversations.append(prompt + [int(x) for x in tokens[b, g][attend[b, g]]])
            learned.append([False] * len(prompt) + list(mask[b, g][attend[b, g]] > 0))
    width = max(map(len, conversations))
    ids = np.asarray([c + [vocab.pad_id] * (width - len(c)) for c in conversations])

    @jax.jit  # jitted once: eager calls compile each primitive separately
    def reencode(params, ids):
        logits, _ = model.apply(params, ids, jnp.broadcast_to(jnp.arange(width), ids.shape), jnp.ones_like(ids, bool))
        log_softmax = jax.nn.log_softmax(logits[:, :-1])
        return jnp.take_along_axis(log_softmax, ids[:, 1:, None], -1)[..., 0]

    reencoded = np.asarray(reencode(params, ids))
    cached = np.asarray(episodes.log_probs).reshape(len(conversations), -1)
    cached_mask = np.asarray(episodes.mask).reshape(len(conversations), -1) > 0
    checked = 0
    for row, (conversation, is_learned) in enumerate(zip(conversations, learned)):
        np.testing.assert_allclose(cached[row][cached_mask[row]],
                                   reencoded[row, :len(conversation) - 1][np.array(is_learned[1:])], atol=2e-5)
        checked += int(cached_mask[row].sum())
    assert checked > 20
    # scoring the slot layout (the loss's forward pass) agrees too
    scored, _, _ = sampling.score_groups(model, params, prompts, episodes.tokens, episodes.mask, vocab.pad_id,
                                         episodes.attend)
    np.testing.assert_allclose(scored, episodes.log_probs, atol=2e-5)


@pytest.mark.parametrize("task_name", ["lookup", "countdown_refine"])
def test_rewards_replayed_from_the_tokens_equal_the_loop_s(task_name):
    task, vocab, _, _, problems, _, episodes = _episodes(task_name)
    B, G, N = episodes.tokens.shape
    repeated = jax.tree.map(lambda x: jnp.repeat(x, G, axis=0), problems)
    np.testing.assert_array_equal(task.rewards(repeated, episodes.tokens.reshape(B * G, N), vocab),
                                  episodes.rewards.reshape(B * G, 2))
    outcome = task.replay(repeated, episodes.tokens.reshape(B * G, N), vocab)
    for name in multi_turn.TURN_FIELDS:
        np.testing.assert_array_equal(outcome[name], episodes.turns[name].reshape(B * G, -1), err_msg=name)


def _refinement(task, vocab, turns: list[str]) -> np.ndarray:
    """One episode [N] in the slot layout: each turn's text with EOS, each environment answer a pad (replay
    answers for itself)."""
    blocks = [np.concatenate([_turn(task, vocab, t), np.full((task.observation_length,), vocab.pad_id)])
              for t in turns]
    return np.concatenate(blocks)  # (NumPy: eager jax concatenations would compile one by one)


@pytest.mark.parametrize("critic_reward", ["revision", "verdict"])
def test_a_refinement_episode_routes_each_role_its_reward(critic_reward):
    task = text.make_task("countdown_refine", num_numbers=2, critic_reward=critic_reward)
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problem = task.sample(jax.random.key(0), 1, "train")
    a, b = (int(x) for x in np.asarray(problem.numbers[0]))
    target = int(problem.target[0])
    expressions = (f"{a}+{b}", f"{a}-{b}", f"{b}-{a}", f"{a}*{b}", f"{a}/{b}", f"{b}/{a}")
    right = next(e for e in expressions if eval(e) == target)
    wrong = next(e for e in expressions if eval(e) != target)
    cases = {  # (answer, critique, revision) -> rewards by turn: actor, critic, actor
        "wrong, judged wrong, revised right": ((wrong, "0N", right), (0, 1, 1), (0, 1, 1)),
        "right, judged wrong, revised wrong": ((right, "0N", wrong), (1, 0, 0), (1, 0, 0)),
        "wrong, judged right, revised right": ((wrong, "0Y", right), (0, 1, 1), (0, 0, 1)),
        "right, judged right, kept": ((right, f"{target}Y", right), (1, 1, 1), (1, 1, 1)),
    }
    episodes = np.stack([_refinement(task, vocab, turns) for turns, _, _ in cases.values()])
    problems = jax.tree.map(lambda x: np.repeat(x, len(cases), axis=0), problem)
    outcome = task.replay(problems, episodes, vocab)
    column = 1 if critic_reward == "revision" else 2
    expected = np.array([case[column] for case in cases.values()], np.float32)
    np.testing.assert_array_equal(outcome["reward"], expected)
    np.testing.assert_array_equal(outcome["solved"][:, -1], expected[:, 2] > 0)
    # with no discount between turns, each turn's advantage is against the group's same turn: the critic's by its
    # own reward alone (the revision's success for CTRL, its verdict's truth for critique RL)
    per_turn = jax.jit(functools.partial(advantages.turn_advantages, "turn_grpo", gamma=0.0))(
        expected[None], outcome["taken"][None], outcome["anchor"][None])[0]
    critic = expected[:, 1]
    np.testing.assert_allclose(per_turn[:, 1], (critic - critic.mean()) / (critic.std() + 1e-6), rtol=1e-5)


def test_a_critic_that_calls_the_calculator_reads_the_answer_s_value_and_writes_its_verdict():
    """countdown_refine with critique_by="calculator" (CRITIC's tool-interactive critiquing): after the first answer
    the environment writes "?" and the calculator's value of it (nothing after a malformed answer, and after no
    other turn); the critic's turn is its verdict alone, rewarded as before; the demonstrator's critique is the
    verdict."""
    task = text.make_task("countdown_refine", num_numbers=2, critique_by="calculator")
    vocab = text.Vocab.from_alphabet(task.alphabet)
    problem = task.sample(jax.random.key(0), 1, "train")
    a, b = (int(x) for x in np.asarray(problem.numbers[0]))
    target = int(problem.target[0])
    expressions = (f"{a}+{b}", f"{a}-{b}", f"{b}-{a}", f"{a}*{b}")
    right = next(e for e in expressions if eval(e) == target)
    wrong = next(e for e in expressions if eval(e) != target)
    one = jax.tree.map(lambda x: x[0], problem)
    state, _ = task.start(one)
    respond = jax.jit(lambda turn, index: task.respond(one, state, turn, index, vocab))
    assert _observation(respond(_turn(task, vocab, wrong), 0), vocab) == f"?={eval(wrong)}"
    assert _observation(respond(_turn(task, vocab, "+*"), 0), vocab) == "?"  # no expression: no value
    assert _observation(respond(_turn(task, vocab, "N"), 1), vocab) == "!"
    cases = {  # (answer, verdict, revision) -> rewards by turn (CTRL's critic reward: the revision's success)
        "wrong, judged wrong, revised right": ((wrong, "N", right), (0, 1, 1)),
        "right, judged wrong, revised wrong": ((right, "N", wrong), (1, 0, 0)),
        "right, judged right, kept": ((right, "Y", right), (1, 1, 1)),
    }
    episodes = np.stack([_refinement(task, vocab, turns) for turns, _ in cases.values()])
    outcome = task.replay(jax.tree.map(lambda x: np.repeat(x, len(cases), axis=0), problem), episodes, vocab)
    np.testing.assert_array_equal(outcome["reward"], np.array([case[1] for case in cases.values()], np.float32))
    demonstration = np.asarray(task.reference_answers(problem, vocab))[0]
    critique = demonstration[task.turn_span:task.turn_span + task.turn_length]
    assert vocab.tokens[int(critique[0])] in "YN" and int(critique[1]) == vocab.eos_id, critique
    with pytest.raises(ValueError, match="critique_by must be one of model, calculator, got 'oracle'"):
        text.make_task("countdown_refine", critique_by="oracle")
    with pytest.raises(ValueError, match="no critic's turn with critic=False"):
        text.make_task("countdown_refine", critique_by="calculator", critic=False)


def test_gigpo_on_a_hand_worked_group():
    # One group of two episodes of up to 3 turns; anchors: both start in state 0, both reach state 5 (episode 0 at
    # turn 1, episode 1 at turn 2), episode 1 passes state 7 at turn 1.
    rewards = jnp.array([[[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]]])
    taken = jnp.array([[[True, True, False], [True, True, True]]])
    anchors = jnp.array([[[0, 5, 0], [0, 7, 5]]])
    # returns-to-go: episode 0 (1, 1, 0), episode 1 (0.5, 0.5, 0.5)
    out = advantages.turn_advantages("gigpo", rewards, taken, anchors, scale=False, step_weight=0.5)
    # episode-level: 1 - 0.75 = 0.25 and -0.25; step groups: state 0 {1, 0.5} -> +-0.25; state 5 {1 (ep 0, turn 1),
    # 0.5 (ep 1, turn 2)} -> +-0.25; state 7 alone -> 0
    expected = [[[0.25 + 0.5 * 0.25, 0.25 + 0.5 * 0.25, 0.0], [-0.25 - 0.5 * 0.25, -0.25, -0.25 - 0.5 * 0.25]]]
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_turn_grpo_and_mapo_normalise_returns_to_go():
    rng = np.random.default_rng(0)
    rewards = jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32)
    taken = jnp.ones((3, 4, 5), bool)
    anchors = jnp.zeros((3, 4, 5), jnp.int32)
    gamma = 0.9
    to_go = np.zeros((3, 4, 5))
    for k in reversed(range(5)):
        to_go[..., k] = np.asarray(rewards[..., k]) + (gamma * to_go[..., k + 1] if k < 4 else 0)
    np.testing.assert_allclose(advantages.turn_returns(rewards, taken, gamma), to_go, rtol=1e-5)
    turn = (to_go - to_go.mean(1, keepdims=True)) / (to_go.std(1, keepdims=True) + 1e-6)
    batch = (to_go - to_go.mean()) / (to_go.std() + 1e-6)
    np.testing.assert_allclose(advantages.turn_advantages("turn_grpo", rewards, taken, anchors, gamma=gamma), turn,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(advantages.turn_advantages("mapo", rewards, taken, anchors, gamma=gamma, turn_mix=0.3),
                               0.3 * turn + 0.7 * batch, rtol=1e-4, atol=1e-5)


def test_stratified_advantages_group_episodes_by_their_tool_calls():
    """advantage.estimator=stratified on a tool task: the strata are the episodes' tool calls, so an episode is
    compared with those of its group that called as many tools (here two strata of two)."""
    from jaxrl import algos, mesh as mesh_lib, rollout
    from helpers import load_experiment

    config = load_experiment("text_grpo", "lookup")
    config.group.size, config.advantage.estimator, config.advantage.stratum_weight = 4, "stratified", 1.0
    config.reward_weights = (1.0, 0.0)
    algos.validate(config)
    algo = algos.build(config, mesh_lib.make_mesh(1))[0].parts
    K = algo.task.max_turns
    calls = jnp.zeros((1, 4, K), bool).at[0, :2, 0].set(True)  # members 0, 1 called a tool once; 2, 3 never
    rewards = jnp.asarray([[[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]])
    turns = {"tool_call": calls}
    groups = rollout.Groups(*([None] * 4), tokens=jnp.zeros((1, 4, 6), jnp.int32), log_probs=None, mask=None,
                            lengths=None, values=None, rewards=rewards, weight=None, bonus=jnp.zeros((1, 4)),
                            replayed=None, turns=turns)
    advantages_, _, _ = jax.jit(algo._group_advantages)(groups)  # (one program, not each operation compiled alone)
    np.testing.assert_allclose(advantages_[0, :, 0], [1.0, -1.0, 0.0, 0.0], atol=1e-4)  # only the callers differ


def test_config_errors_name_the_multi_turn_mismatch():
    from jaxrl import algos
    config = algos.default_config("text_grpo")
    config.task.name = "guess"
    config.rollout.generate = "tree"
    with pytest.raises(ValueError, match="guess is played over turns; rollout.generate=tree works on single-answer"):
        algos.validate(config)
    config = algos.default_config("text_grpo")
    config.advantage.estimator = "gigpo"
    with pytest.raises(ValueError, match="'gigpo' scores the turns of multi-turn episodes: it needs a multi-turn"):
        algos.validate(config)
    config.advantage.estimator = "stratified"
    with pytest.raises(ValueError, match="'stratified' compares each episode with those of its group that share"):
        algos.validate(config)
