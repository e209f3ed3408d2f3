"""Verifiable text tasks as token arrays: arithmetic and Countdown, a character-level tokenizer.

    from envs import text
    task = text.make_task("countdown", num_numbers=4)
    tok = text.train_tokenizer(text.corpus([task], 2000)); vocab = text.Vocab.from_tokenizer(tok)
    problems = task.sample(key, 64, "train")
    prompts = task.prompts(problems, vocab)                    # int32 [64, task.prompt_length]

See `envs.text.tasks` for the prompt formats, the held-out split and the verifiers.
"""

from envs.text.chat import ChatTask, ChatTurns, DatasetTask, ModelVocab
from envs.text.judge import CountdownJudge
from envs.text.refine import CountdownRefine
from envs.text.tasks import (SPLITS, TASKS, Arithmetic, Countdown, Problems, Task, addition, corpus,
                             make_task, multiplication, split_hash, task_options)
from envs.text.turns import MULTI_TURN_TASKS, MultiTurnTask, Reply, episode_rewards
from envs.text.tokenizer import (ALPHABET, SPECIALS, Vocab, decode, encode, load_tokenizer, save_tokenizer,
                                 train_tokenizer)
from envs.text.verify import ExpressionError, check_countdown, parse_expression

__all__ = [
    "ALPHABET", "MULTI_TURN_TASKS", "SPECIALS", "SPLITS", "TASKS", "Arithmetic", "ChatTask", "ChatTurns", "Countdown",
    "CountdownJudge", "CountdownRefine", "DatasetTask",
    "ExpressionError", "ModelVocab", "MultiTurnTask", "Problems", "Reply", "Task", "Vocab", "addition",
    "check_countdown", "corpus", "decode", "encode", "episode_rewards", "load_tokenizer", "make_task", "multiplication",
    "parse_expression", "save_tokenizer", "split_hash", "task_options", "train_tokenizer",
]
