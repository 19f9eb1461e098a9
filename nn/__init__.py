"""Neural-network modules: Module, the layers of GPT-2 and Llama, the two models, and build /
from_pretrained, which pick the family by the config."""

from .config import PRESETS, GPT2Config, LlamaConfig, from_preset
from .gpt2 import GPT2, MLP, Block, CausalSelfAttention, KVCache
from .layers import Dropout, Embedding, LayerNorm, Linear, RMSNorm, TransposedLinear
from .llama import Llama
from .lm import CausalLM
from .models import build, from_pretrained
from .module import Module, ModuleList, Parameter
from .options import ExecutionOptions

__all__ = [
    "GPT2",
    "Llama",
    "CausalLM",
    "build",
    "from_pretrained",
    "GPT2Config",
    "LlamaConfig",
    "from_preset",
    "ExecutionOptions",
    "PRESETS",
    "Block",
    "CausalSelfAttention",
    "MLP",
    "KVCache",
    "Linear",
    "Embedding",
    "LayerNorm",
    "RMSNorm",
    "TransposedLinear",
    "Dropout",
    "Module",
    "ModuleList",
    "Parameter",
]
