"""The operations of one sparse layer on arrays: insert, index, attend.

Every array is used in place (DLPack, no copy): outputs are written into the caller's buffers.
Arrays on a CUDA device run on the CUDA backend, on the caller's current torch stream (or
``stream=``); host arrays run on the CPU engine (``num_threads`` 0: every hardware thread).
Bad input raises :class:`msa.Error` with the library's message (argument, index, value).
On CUDA, ``check`` (a [8] int64 device buffer) records the first out-of-range index the kernels
skipped (see ``msa::cuda::DeviceCheck``).
"""

import math

from . import _msa
from ._arrays import arg, resolve_dtype, stream_of
from .cache import as_index_cache, as_kv_cache

DEFAULT_SOFTMAX_SCALE = 1.0 / math.sqrt(_msa.head_dim)


def insert_kv(kv_cache, k, v, slots, *, src_dtype=None, stream=None, num_threads=0, check=None):
    """Writes K and V ([num_tokens, num_kv_heads, 128] bf16 / fp16) of each token with
    slots[i] >= 0 (int64, page * 128 + offset) into the cache (a KVCache or an array),
    quantizing as its dtype asks (fp8 per-token scales are computed and written here).
    src_dtype names k and v's dtype where theirs cannot (numpy uint16 holding bf16)."""
    c = as_kv_cache(kv_cache)
    _msa.insert_kv(arg(c.data, "kv_cache", True), arg(k, "k"), arg(v, "v"), arg(slots, "slots"),
                   **c.kwargs(written=True), src_dtype=src_dtype, stream=stream_of(c.data, stream),
                   num_threads=num_threads, check=arg(check, "check", True))


def insert_index(index_cache, index_k, slots, *, src_dtype=None, stream=None, num_threads=0, check=None):
    """Writes each token's index key ([num_tokens, 128] bf16 / fp16) with slots[i] >= 0 into the
    index cache (an IndexCache or an array [num_pages, 128, 128])."""
    c = as_index_cache(index_cache)
    _msa.insert_index(arg(c.data, "index_cache", True), arg(index_k, "index_k"), arg(slots, "slots"),
                      index_dtype=c.name(), src_dtype=src_dtype, stream=stream_of(c.data, stream),
                      num_threads=num_threads, check=arg(check, "check", True))


def index(step, index_q, index_cache, block_table, topk, *, init_blocks=0, local_blocks=1, max_blocks=None,
          workspace=None, iq_dtype=None, stream=None, num_threads=0, check=None):
    """Block scores of every (token, KV head) over its request's blocks of index keys, then the
    top-k into `topk` ([num_tokens, num_kv_heads, topk] int32, token-major or any strides;
    ascending ids, -1 past a row's valid entries).

    index_q: [num_tokens, num_kv_heads, 128]; block_table: the index cache's [num_requests,
    max_blocks] int32. CUDA: `workspace` (uint8, index_workspace_bytes) holds the block scores
    (None: allocated here, which a CUDA graph capture should avoid); `max_blocks` bounds
    ceil(seq_len / 128) (None: the block table's columns)."""
    c = as_index_cache(index_cache)
    if step.is_cuda and workspace is None:
        import torch

        mb = block_table.shape[1] if max_blocks is None else max_blocks
        need = (_msa.index_workspace_bytes(step.num_tokens, index_q.shape[1], mb, index_dtype=c.name(),
                                           num_prefill_requests=step.num_prefills) if _msa.has_cuda else 0)
        workspace = torch.empty(max(need, 256), dtype=torch.uint8, device=index_q.device)
    _msa.index(*step.args(), arg(index_q, "index_q"), arg(c.data, "index_cache"), arg(block_table, "block_table"),
               arg(topk, "topk", True), index_dtype=c.name(), iq_dtype=iq_dtype, init_blocks=init_blocks,
               local_blocks=local_blocks, max_blocks=-1 if max_blocks is None else max_blocks,
               workspace=arg(workspace, "workspace", True), stream=stream_of(index_q, stream),
               num_threads=num_threads, check=arg(check, "check", True))


def attend(step, q, kv_cache, block_table, topk, out, *, lse=None, plan=None, q_scale=1.0, softmax_scale=None,
           q_dtype=None, out_dtype=None, stream=None, num_threads=0, check=None):
    """Sparse attention of every token of the step over the blocks its KV head selected, into
    `out` ([num_tokens, num_q_heads, 128] bf16 / fp16) and, if given, `lse` ([num_tokens,
    num_q_heads] float32, natural log).

    q: [num_tokens, num_q_heads, 128] bf16 / fp16, or fp8 e4m3 with `q_scale`; topk:
    [num_tokens, num_kv_heads, topk] int32; block_table: the KV cache's [num_requests, max_blocks]
    int32. CUDA needs the step's `plan` (plan_attention). q_dtype / out_dtype name q's and out's
    dtypes where their own cannot (numpy uint16 bf16, uint8 fp8 codes; out: the half query's)."""
    c = as_kv_cache(kv_cache)
    _msa.attend(*step.args(), arg(q, "q"), arg(out, "out", True), arg(c.data, "kv_cache"),
                arg(block_table, "block_table"), arg(topk, "topk"), lse=arg(lse, "lse", True),
                plan=None if plan is None else plan.blob, q_dtype=resolve_dtype(q, q_dtype), out_dtype=out_dtype,
                q_scale=float(q_scale),
                softmax_scale=DEFAULT_SOFTMAX_SCALE if softmax_scale is None else float(softmax_scale),
                **c.kwargs(), stream=stream_of(q, stream), num_threads=num_threads, check=arg(check, "check", True))
