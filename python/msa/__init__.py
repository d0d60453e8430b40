"""msa: MiniMax-M3 block-sparse attention from Python.

The operations of one sparse layer (insert, index, attend) over torch tensors (CPU or CUDA) and
numpy arrays (CPU engine), without copies; the batch metadata of a step (:class:`Step`); the
CUDA plan / workspace API; cache allocation helpers; ``torch.ops.msa.*`` custom ops when torch
is installed; and a serving-engine backend adapter in :mod:`msa.engine`.
"""

from . import _msa
from ._msa import Error, build_metadata, has_cuda
from .cache import (BLOCK_SIZE, HEAD_DIM, IndexCache, KVCache, allocate_index_cache, allocate_kv_cache,
                    index_cache_geometry, index_cache_shape, kv_cache_geometry, kv_cache_shape, kv_cache_strides,
                    kv_scales_shape)
from .ops import DEFAULT_SOFTMAX_SCALE, attend, index, insert_index, insert_kv
from .plan import AttentionShape, Plan, attention_workspace_bytes, index_workspace_bytes, plan_attention
from .step import Step, build_step

__version__ = "0.1.0"


def minimax_m3(tp=1):
    """Per-rank numbers of a MiniMax-M3 sparse layer (num_q_heads, num_kv_heads, topk, ...)."""
    return _msa.minimax_m3(tp)


def cuda_device_count():
    """CUDA devices this build can use (0 without the CUDA backend, a driver or a device)."""
    return _msa.cuda_device_count()


# torch.ops.msa.* for torch.compile, registered when torch is importable (2.4 or later).
try:
    import torch as _torch
except ImportError:
    _torch = None
if _torch is not None and hasattr(_torch.library, "custom_op"):
    from . import torch_ops  # noqa: F401

__all__ = [
    "Error", "has_cuda", "cuda_device_count", "minimax_m3", "BLOCK_SIZE", "HEAD_DIM",
    "KVCache", "IndexCache", "allocate_kv_cache", "allocate_index_cache", "kv_cache_geometry", "kv_cache_shape",
    "kv_cache_strides", "kv_scales_shape", "index_cache_geometry", "index_cache_shape",
    "Step", "build_step", "build_metadata",
    "insert_kv", "insert_index", "index", "attend", "DEFAULT_SOFTMAX_SCALE",
    "AttentionShape", "Plan", "plan_attention", "attention_workspace_bytes", "index_workspace_bytes",
]
