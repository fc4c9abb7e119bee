from .llama import LLaMA
from .utils import KVCache, LLaMAConfig

__all__ = ["LLaMA", "LLaMAConfig", "KVCache"]
