"""Generate text with a pretrained model.

    python -m jaxrl.generate --model=smollm2-135m-instruct --prompt="The capital of France is"
    python -m jaxrl.generate --model=path/to/hf_dir --chat --prompt="What is 7 * 8?" --max_new_tokens=64
    python -m jaxrl.generate --model=model.gguf --prompt="Once upon a time" --temperature=0.7 --seed=3

`--model` is an installed model's name, a Hugging Face directory or a .gguf file. Greedy by default; `--chat`
wraps the prompt as a user turn (after `--system` when given) in the model's chat template. Prints the
generated text.
"""

from __future__ import annotations

import sys

from jaxrl import models
from jaxrl.run import cli

cli.input_stage(models.from_pretrained)  # reading the model, its config and tokenizer is input


def main(argv) -> int:
    from absl import flags, logging

    logging.set_verbosity(logging.WARNING)
    FLAGS = flags.FLAGS
    with cli.input_phase():
        if len(argv) > 1:
            raise cli.InputError(f"unexpected arguments {argv[1:]}; the prompt goes in --prompt")
        if not FLAGS.model or FLAGS.prompt is None:
            raise cli.InputError("give --model=<name, Hugging Face directory or .gguf file> and --prompt=<text>")
        if FLAGS.max_new_tokens < 1:
            raise cli.InputError(f"--max_new_tokens must be positive, got {FLAGS.max_new_tokens}")
        if FLAGS.temperature < 0:
            raise cli.InputError(f"--temperature must be >= 0 (0 is greedy), got {FLAGS.temperature}")
    lm = models.from_pretrained(FLAGS.model)
    with cli.input_phase():
        prompt = FLAGS.prompt
        if FLAGS.chat:
            system = [{"role": "system", "content": FLAGS.system}] if FLAGS.system else []
            prompt = lm.render_chat([*system, {"role": "user", "content": FLAGS.prompt}])
        elif FLAGS.system:
            raise cli.InputError("--system needs --chat")
    print(lm.generate(prompt, FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                      seed=FLAGS.seed))
    return 0


def define_flags():
    from absl import flags

    flags.DEFINE_string("model", None, f"an installed model ({', '.join(models.INSTALLED)}), a Hugging Face "
                        "directory or a .gguf file")
    flags.DEFINE_string("prompt", None, "the text to continue (with --chat: the user's message)")
    flags.DEFINE_bool("chat", False, "render the prompt as a user turn with the model's chat template")
    flags.DEFINE_string("system", None, "with --chat: a system message before the user's")
    flags.DEFINE_integer("max_new_tokens", 64, "how many tokens to generate at most")
    flags.DEFINE_float("temperature", 0.0, "sampling temperature; 0 is greedy")
    flags.DEFINE_float("top_p", 1.0, "nucleus sampling: keep the most likely tokens up to this probability")
    flags.DEFINE_integer("seed", 0, "the sampling seed")


if __name__ == "__main__":
    define_flags()
    cli.run_main(lambda argv: sys.exit(main(argv)))
