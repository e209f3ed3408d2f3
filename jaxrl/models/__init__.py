"""Decoder-only language models: Llama (3, 3.1/3.2; SmolLM2), Qwen2/2.5, Qwen3 and Gemma 2 as one `Decoder` whose
family differences are `ModelConfig` fields; pretrained ones read from Hugging Face directories or GGUF files.

    from jaxrl import models
    lm = models.from_pretrained("smollm2-135m-instruct")   # or a Hugging Face directory, or a .gguf file
    lm.generate("The capital of France is", max_new_tokens=32)
    models.save_pretrained(lm, "out/")                     # transformers / vLLM load it
"""

from jaxrl.models.config import FAMILIES, ModelConfig, from_hf_config, to_hf_config
from jaxrl.models.decoder import Decoder
from jaxrl.models.installed import INSTALLED
from jaxrl.models.lm import LanguageModel, from_pretrained, is_pretrained, read_params, read_spec, save_pretrained

__all__ = ["FAMILIES", "INSTALLED", "Decoder", "LanguageModel", "ModelConfig", "from_hf_config", "from_pretrained",
           "is_pretrained", "read_params", "read_spec", "save_pretrained", "to_hf_config"]
