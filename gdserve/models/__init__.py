from gdserve.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from gdserve.models.llama import LlamaForCausalLM
from gdserve.models.loader import (load_eos_token_ids, load_model, load_tokenizer,
                                   resolve_model, source_gguf)
from gdserve.models.registry import ALIASES, DEFAULT_MODEL

__all__ = ["ALIASES", "DEFAULT_MODEL", "SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "ModelConfig",
           "load_eos_token_ids", "load_model", "load_tokenizer", "resolve_model",
           "source_gguf"]
