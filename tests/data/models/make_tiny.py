"""Writes the tiny random checkpoints of each family (tests/data/models/<family>/) and the reference outputs that
transformers computes for them (reference.npz), which tests/test_models.py compares jaxrl.models against
without torch. Run where torch and transformers are installed:

    python tests/data/models/make_tiny.py

The checkpoints are fresh random weights (seeded); their config exercises every family difference: grouped-query
attention, tied and untied embeddings, q/k/v biases (Qwen2), q/k norms (Qwen3), llama3 rope scaling, Gemma 2's
sandwich norms, soft-capping and sliding windows shorter than the sequences.
"""

import os
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CONFIGS = {
    "llama": transformers.LlamaConfig(**COMMON, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=500000.0,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2": transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": transformers.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True),
    "gemma2": transformers.Gemma2Config(**COMMON, head_dim=8, query_pre_attn_scalar=16, sliding_window=4,
                                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                        hidden_activation="gelu_pytorch_tanh"),
}
MODELS = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
          "qwen3": transformers.Qwen3ForCausalLM, "gemma2": transformers.Gemma2ForCausalLM}
PROMPTS = [[5, 17, 33, 8, 61, 22, 9, 40, 12], [0, 0, 0, 0, 7, 77, 3, 15, 90]]  # the second left-padded (pad 0)
NEW_TOKENS = 32


def reference(model) -> dict[str, np.ndarray]:
    ids = torch.tensor(PROMPTS)
    mask = (torch.cumsum(ids != 0, dim=1) > 0).long()
    positions = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float().numpy()
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    return {"prompts": np.asarray(PROMPTS, np.int32), "logits": logits,
            "greedy": greedy[:, ids.shape[1]:].numpy().astype(np.int32)}


def write(family: str, out: str) -> None:
    """The family's tiny random checkpoint and transformers' reference outputs into `out`."""
    torch.manual_seed(0)
    config = CONFIGS[family]
    model = MODELS[family](config).eval()
    with torch.no_grad():  # norms away from their initial value, so a wrong norm convention shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    np.savez(os.path.join(out, "reference.npz"), **reference(model))


def main(families):
    for family in families:
        write(family, os.path.join(HERE, family))
        print(family, "->", os.path.join(HERE, family))


if __name__ == "__main__":
    main(sys.argv[1:] or list(CONFIGS))
