"""A serving-engine attention backend over msa, in the shape engines give their backends (a
backend class naming the KV-cache shape and layouts, a metadata builder that turns the engine's
per-step inputs into the step's metadata and plan, and an implementation whose ``forward``
writes the attention output), without importing any engine.

One sparse layer per step::

    builder = MsaMetadataBuilder(num_q_heads=16, num_kv_heads=1, topk=16, device="cuda")
    md = builder.build(query_start_loc_cpu, seq_lens_cpu, block_table, slot_mapping, num_decodes)
    impl = MsaAttentionImpl(16, 128, scale, 1, topk_blocks=16)
    impl.insert(k, v, index_k, kv_cache, index_cache, md)      # the layer's new K / V / index keys
    impl.index(index_q, index_cache, topk_buffer, md)           # top-k into the shared buffer
    impl.forward(query, kv_cache, output, topk_buffer, md)      # attention into output

The batch is decode-first (decode requests, 1 + draft tokens each, lead the batch; chunked
prefills follow) and one call covers both parts. On a CUDA device every call runs on the current
torch stream and the run step allocates nothing and never synchronizes: a decode step's
``index`` and ``forward`` can be captured in a ``torch.cuda.CUDAGraph`` and replayed after the
engine updates its persistent buffers (queries, seq_lens, block tables) in place.
"""

from dataclasses import dataclass
from typing import Optional

import torch

from . import _msa
from .cache import KVCache, IndexCache, kv_cache_geometry
from .ops import attend, index, insert_index, insert_kv
from .plan import AttentionShape, Plan, attention_workspace_bytes, index_workspace_bytes, plan_attention
from .step import Step

# An engine's cache dtype strings and the msa dtype of the cache they give.
_KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16",
                    "fp16": "fp16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
                    "nvfp4": "nvfp4"}
_MODEL_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def kv_cache_dtype_name(cache_dtype_str, model_dtype=torch.bfloat16):
    """msa's cache dtype for an engine's cache dtype string ("auto": the model's dtype)."""
    if cache_dtype_str not in _KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype = {cache_dtype_str!r} is not one of {sorted(_KV_CACHE_DTYPES)}")
    return _KV_CACHE_DTYPES[cache_dtype_str] or _MODEL_DTYPES[model_dtype]


class MsaAttentionBackend:
    """What the engine asks a backend before it allocates caches: the dtypes, head sizes and
    block sizes it serves, the KV-cache shape and the physical orders it reads."""

    supported_dtypes = [torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"]

    @staticmethod
    def get_name():
        return "MSA"

    @staticmethod
    def get_impl_cls():
        return MsaAttentionImpl

    @staticmethod
    def get_builder_cls():
        return MsaMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls):
        return [_msa.head_dim]

    @staticmethod
    def get_supported_kernel_block_sizes():
        # Page size == sparse block size: one sparse block per KV page.
        return [_msa.block_size]

    @classmethod
    def is_sparse(cls):
        return True

    @classmethod
    def supported_kv_cache_layouts(cls):
        """Physical orders of the packed cache (split: separate K and V planes)."""
        return ("HND", "NHD", "split")

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto",
                           layout="HND"):
        """Logical shape of one layer's KV cache: (num_blocks, num_kv_heads, block_size, 2 * head_size)
        with K and V packed in the last dimension (HND and NHD differ in stride order only);
        split: (num_blocks, 2, block_size, num_kv_heads, head_size); nvfp4: (num_blocks,
        2 * num_kv_heads, block_size, 72) uint8 head-slot pages."""
        if block_size != _msa.block_size or head_size != _msa.head_dim:
            raise ValueError(f"msa serves block_size {_msa.block_size} and head_size {_msa.head_dim}, "
                             f"not {block_size} and {head_size}")
        dtype = kv_cache_dtype_name(cache_dtype_str)
        layout = "hnd" if dtype == "nvfp4" else layout.lower()
        geometry = kv_cache_geometry(num_blocks, num_kv_heads, dtype, "hnd" if layout == "nhd" else layout)
        return tuple(geometry["shape"])

    @staticmethod
    def get_kv_cache_stride_order(layout="HND"):
        """The permutation from get_kv_cache_shape's logical order to the physical one."""
        if layout == "HND":
            return (0, 1, 2, 3)
        if layout == "NHD":  # (num_blocks, block_size, num_kv_heads, 2 * head_size)
            return (0, 2, 1, 3)
        if layout == "split":
            return (0, 1, 2, 3, 4)
        raise ValueError(f"layout = {layout!r} is not one of {MsaAttentionBackend.supported_kv_cache_layouts()}")

    @staticmethod
    def get_index_cache_shape(num_blocks):
        """One layer's index cache: (num_blocks, 128, 128)."""
        return (num_blocks, _msa.block_size, _msa.head_dim)

    @staticmethod
    def allocate_kv_cache(num_blocks, num_kv_heads, cache_dtype_str="auto", layout="HND", *, device="cuda",
                          model_dtype=torch.bfloat16):
        """A zeroed KV cache tensor of get_kv_cache_shape in `layout` (fp8 as uint8, as engines keep it)."""
        dtype = kv_cache_dtype_name(cache_dtype_str, model_dtype)
        shape = MsaAttentionBackend.get_kv_cache_shape(num_blocks, _msa.block_size, num_kv_heads, _msa.head_dim,
                                                       dtype, layout)
        order = MsaAttentionBackend.get_kv_cache_stride_order(layout if dtype != "nvfp4" else "HND")
        storage = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.uint8)
        physical = torch.zeros([shape[i] for i in order], dtype=storage, device=device)
        inverse = [order.index(i) for i in range(len(order))]
        return physical.permute(*inverse)


@dataclass
class MsaMetadata:
    """One step's metadata, shared by every sparse layer."""

    step: Step                      # batch metadata: host meta + device query_start / seq_lens / token_request
    num_actual_tokens: int          # query tokens of the step (decode-first)
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    decode_query_len: int           # 1, or 1 + draft tokens (0 without decodes)
    block_table: torch.Tensor       # [num_requests, max_blocks] int32, the KV cache's
    slot_mapping: torch.Tensor      # [num_tokens] int64, KV slot of each new token (negative: skip)
    index_block_table: torch.Tensor  # [num_requests, max_blocks] int32, the index cache's
    index_slot_mapping: torch.Tensor  # [num_tokens] int64
    plan: Optional[Plan]            # CUDA attention plan (None on the CPU engine)
    index_workspace: Optional[torch.Tensor]  # CUDA: the indexer's block scores


class MsaMetadataBuilder:
    """Builds each step's MsaMetadata from the engine's per-step inputs and holds the plan.

    The device workspaces (the attention plan's and the indexer's) are kept and grown, never
    shrunk; a grown one replaces the old one for later steps, and the old one stays allocated,
    since a graph captured earlier still points into it."""

    def __init__(self, num_q_heads, num_kv_heads, *, topk=16, kv_cache_dtype="auto", model_dtype=torch.bfloat16,
                 query_fp8=False, kv_token_scales=False, device="cuda", prefill_order="query_major",
                 index_dtype=None):
        self.device = torch.device(device)
        self.index_dtype = index_dtype  # the index cache's ("nvfp4": workspace to widen prefill keys once)
        self.kv_dtype = kv_cache_dtype_name(kv_cache_dtype, model_dtype)
        out_dtype = _MODEL_DTYPES[model_dtype]
        self.shape = AttentionShape(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, topk=topk,
                                    q_dtype="fp8_e4m3" if query_fp8 else out_dtype, kv_dtype=self.kv_dtype,
                                    out_dtype=out_dtype, prefill_order=prefill_order,
                                    kv_token_scales=kv_token_scales)
        self._attn_workspace = None
        self._index_workspace = None
        self._retired = []  # outgrown workspaces that captured graphs may still use

    def _workspace(self, current, need):
        if current is not None and current.numel() >= need:
            return current
        if current is not None:
            self._retired.append(current)
        return torch.empty(max(need, 256, 0 if current is None else 2 * current.numel()), dtype=torch.uint8,
                           device=self.device)

    def build(self, query_start_loc_cpu, seq_lens_cpu, block_table, slot_mapping, num_decodes, *,
              decode_query_len=None, query_start_loc=None, seq_lens=None, index_block_table=None,
              index_slot_mapping=None):
        """query_start_loc_cpu [num_requests + 1], seq_lens_cpu [num_requests]: host copies;
        block_table [num_requests, max_blocks] int32 and slot_mapping [num_tokens] int64 on the
        device (the index cache shares them unless index_block_table / index_slot_mapping are
        given); num_decodes leading decode requests of decode_query_len tokens each (None: the
        first request's query length). query_start_loc / seq_lens: the engine's device copies
        (persistent buffers a captured graph reads), else copied here."""
        R = len(seq_lens_cpu)
        on_device = self.device.type == "cuda"
        step = Step.build(query_start_loc_cpu, seq_lens_cpu, num_decodes=num_decodes,
                          decode_query_len=decode_query_len, device=self.device if on_device else None,
                          query_start_device=None if query_start_loc is None else query_start_loc[:R + 1],
                          seq_lens_device=None if seq_lens is None else seq_lens[:R])
        T = step.num_tokens
        plan = index_ws = None
        if on_device:
            need = attention_workspace_bytes(step, self.shape)
            self._attn_workspace = self._workspace(self._attn_workspace, need)
            plan = plan_attention(step, self.shape, workspace=self._attn_workspace)
            table = block_table if index_block_table is None else index_block_table
            need = index_workspace_bytes(T, self.shape.num_kv_heads, table.shape[1], index_dtype=self.index_dtype,
                                         num_prefill_requests=step.num_prefills)
            self._index_workspace = index_ws = self._workspace(self._index_workspace, need)
        return MsaMetadata(step=step, num_actual_tokens=T, num_decodes=step.num_decodes,
                           num_decode_tokens=step.num_decode_tokens, num_prefills=step.num_prefills,
                           num_prefill_tokens=T - step.num_decode_tokens, decode_query_len=step.decode_query_len,
                           block_table=block_table, slot_mapping=slot_mapping[:T],
                           index_block_table=block_table if index_block_table is None else index_block_table,
                           index_slot_mapping=(slot_mapping if index_slot_mapping is None
                                               else index_slot_mapping)[:T],
                           plan=plan, index_workspace=index_ws)


class MsaAttentionImpl:
    """One sparse layer: inserts the step's K / V / index keys, runs the indexer into the shared
    top-k buffer, and attends (``forward``)."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, kv_cache_dtype="auto", *, topk_blocks,
                 sparse_block_size=128, init_blocks=0, local_blocks=1, model_dtype=torch.bfloat16):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.kv_dtype = kv_cache_dtype_name(kv_cache_dtype, model_dtype)
        self.topk_blocks = topk_blocks
        self.init_blocks = init_blocks
        self.local_blocks = local_blocks
        reason = unsupported_reason(num_heads, self.num_kv_heads, head_size, topk_blocks, sparse_block_size)
        if reason is not None:
            raise ValueError(f"msa cannot serve this layer: {reason}")

    def kv_cache(self, kv_cache, k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None):
        return KVCache(kv_cache, self.kv_dtype, k_scale, v_scale, k_scales, v_scales)

    def insert(self, k, v, index_k, kv_cache, index_cache, metadata, *, k_scale=1.0, v_scale=1.0, k_scales=None,
               v_scales=None, index_dtype=None):
        """Writes the step's new K, V ([num_tokens, num_kv_heads, 128]) and index keys
        ([num_tokens, 128]) at the metadata's slot mappings."""
        if metadata is None:
            return
        T = metadata.num_actual_tokens
        cache = self.kv_cache(kv_cache, k_scale, v_scale, k_scales, v_scales)
        insert_kv(cache, k[:T].view(T, self.num_kv_heads, self.head_size),
                  v[:T].view(T, self.num_kv_heads, self.head_size), metadata.slot_mapping)
        if index_k is not None:
            insert_index(IndexCache(index_cache, index_dtype), index_k[:T], metadata.index_slot_mapping)

    def index(self, index_q, index_cache, topk_buffer, metadata, *, index_dtype=None):
        """Block scores and top-k of every token into topk_buffer[:num_tokens] (token-major
        [max_tokens, num_kv_heads, topk] int32, shared by the layer's attention)."""
        if metadata is None:
            return topk_buffer
        T = metadata.num_actual_tokens
        iq = index_q[:T].view(T, self.num_kv_heads, self.head_size)
        index(metadata.step, iq, IndexCache(index_cache, index_dtype), metadata.index_block_table, topk_buffer[:T],
              init_blocks=self.init_blocks, local_blocks=self.local_blocks, workspace=metadata.index_workspace)
        return topk_buffer

    def forward(self, query, kv_cache, output, topk_buffer, metadata, query_fp8=None, *, q_scale=1.0, k_scale=1.0,
                v_scale=1.0, k_scales=None, v_scales=None, lse=None):
        """Attention of the step's tokens over the blocks in topk_buffer[:num_tokens] into
        output[:num_tokens]. query / output: [max_tokens, num_heads * 128] or [max_tokens,
        num_heads, 128]; query_fp8 (e4m3, with q_scale): when given, the query msa reads.
        kv_cache: the layer's cache tensor (fp8 / nvfp4 as uint8 or float8); k_scale / v_scale:
        fp8 per-tensor or nvfp4 global scales; k_scales / v_scales: fp8 per-(token, head) scales.
        lse: [num_tokens, num_heads] float32, optional. Returns output."""
        if metadata is None:
            return output  # profiling run: caches not bound yet
        T = metadata.num_actual_tokens
        hd = self.head_size
        q = (query if query_fp8 is None else query_fp8)[:T].view(T, self.num_heads, hd)
        out = output[:T].view(T, self.num_heads, hd)
        attend(metadata.step, q, self.kv_cache(kv_cache, k_scale, v_scale, k_scales, v_scales),
               metadata.block_table, topk_buffer[:T], out, lse=lse, plan=metadata.plan,
               q_scale=q_scale if query_fp8 is not None else 1.0, softmax_scale=self.scale)
        return output


def unsupported_reason(num_heads, num_kv_heads, head_size, topk_blocks, block_size):
    """Why msa cannot serve this layer, None when it can."""
    if head_size != _msa.head_dim:
        return f"head_size = {head_size} but msa serves {_msa.head_dim}"
    if block_size != _msa.block_size:
        return f"sparse_block_size = {block_size} but msa serves {_msa.block_size}"
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0 or num_heads // num_kv_heads > 16:
        return f"num_heads = {num_heads}, num_kv_heads = {num_kv_heads}: the group must be 1..16 query heads"
    if not 1 <= topk_blocks <= _msa.max_topk:
        return f"topk_blocks = {topk_blocks} is not in [1, {_msa.max_topk}]"
    return None
