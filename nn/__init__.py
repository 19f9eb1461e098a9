"""Neural-network modules: Module, the layers of GPT-2, and GPT2 itself."""

from .config import PRESETS, GPT2Config, LlamaConfig, from_preset
from .gpt2 import GPT2, MLP, Block, CausalSelfAttention, KVCache
from .layers import Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleList, Parameter
from .options import ExecutionOptions

__all__ = [
    "GPT2",
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
    "Dropout",
    "Module",
    "ModuleList",
    "Parameter",
]
