"""torch.library custom ops ``torch.ops.msa.*`` over the same bindings as msa's functions, with
fake (meta) implementations, so that torch.compile traces a model that calls them.

Arguments are tensors and scalars only: a cache's dtype name ("" when its tensor dtype says it),
the step as its three device arrays and decode split, and the CUDA plan as its blob (a host uint8
tensor from :func:`msa.plan_attention`). Each op writes its outputs in place and returns nothing;
optional outputs (fp8 per-token scales, the indexer's workspace, lse) are positional, None when
absent.
"""

from typing import Optional

import torch

from . import _msa
from ._arrays import raw, resolve_dtype, stream_of
from .ops import DEFAULT_SOFTMAX_SCALE

Tensor = torch.Tensor


def _name(t, given):
    return given or resolve_dtype(t, None)


@torch.library.custom_op("msa::insert_kv", mutates_args=("kv_cache", "k_scales", "v_scales"))
def insert_kv(kv_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor, k_scales: Optional[Tensor],
              v_scales: Optional[Tensor], kv_dtype: str = "", k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    _msa.insert_kv(raw(kv_cache), raw(k), raw(v), slots, kv_dtype=_name(kv_cache, kv_dtype), k_scale=k_scale,
                   v_scale=v_scale, k_scales=k_scales, v_scales=v_scales, stream=stream_of(kv_cache))


@insert_kv.register_fake
def _(kv_cache, k, v, slots, k_scales, v_scales, kv_dtype="", k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("msa::insert_index", mutates_args=("index_cache",))
def insert_index(index_cache: Tensor, index_k: Tensor, slots: Tensor, index_dtype: str = "") -> None:
    _msa.insert_index(raw(index_cache), raw(index_k), slots, index_dtype=_name(index_cache, index_dtype),
                      stream=stream_of(index_cache))


@insert_index.register_fake
def _(index_cache, index_k, slots, index_dtype=""):
    return None


@torch.library.custom_op("msa::index", mutates_args=("topk", "workspace"))
def index(query_start: Tensor, seq_lens: Tensor, token_request: Tensor, num_decodes: int, decode_query_len: int,
          index_q: Tensor, index_cache: Tensor, block_table: Tensor, topk: Tensor, workspace: Optional[Tensor],
          index_dtype: str = "", init_blocks: int = 0, local_blocks: int = 1, max_blocks: int = -1) -> None:
    _msa.index(query_start, seq_lens, token_request, num_decodes, decode_query_len, raw(index_q), raw(index_cache),
               block_table, topk, index_dtype=_name(index_cache, index_dtype), init_blocks=init_blocks,
               local_blocks=local_blocks, max_blocks=max_blocks, workspace=workspace, stream=stream_of(index_q))


@index.register_fake
def _(query_start, seq_lens, token_request, num_decodes, decode_query_len, index_q, index_cache, block_table, topk,
      workspace, index_dtype="", init_blocks=0, local_blocks=1, max_blocks=-1):
    return None


@torch.library.custom_op("msa::attend", mutates_args=("out", "lse"))
def attend(query_start: Tensor, seq_lens: Tensor, token_request: Tensor, num_decodes: int, decode_query_len: int,
           q: Tensor, out: Tensor, kv_cache: Tensor, block_table: Tensor, topk: Tensor, lse: Optional[Tensor],
           plan: Optional[Tensor] = None, kv_dtype: str = "", k_scale: float = 1.0,
           v_scale: float = 1.0, k_scales: Optional[Tensor] = None, v_scales: Optional[Tensor] = None,
           q_scale: float = 1.0, softmax_scale: float = DEFAULT_SOFTMAX_SCALE) -> None:
    _msa.attend(query_start, seq_lens, token_request, num_decodes, decode_query_len, raw(q), raw(out),
                raw(kv_cache), block_table, topk, lse=lse, plan=plan, q_dtype=resolve_dtype(q, None), q_scale=q_scale,
                softmax_scale=softmax_scale, kv_dtype=_name(kv_cache, kv_dtype), k_scale=k_scale, v_scale=v_scale,
                k_scales=k_scales, v_scales=v_scales, stream=stream_of(q))


@attend.register_fake
def _(query_start, seq_lens, token_request, num_decodes, decode_query_len, q, out, kv_cache, block_table, topk,
      lse, plan=None, kv_dtype="", k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None, q_scale=1.0,
      softmax_scale=DEFAULT_SOFTMAX_SCALE):
    return None
