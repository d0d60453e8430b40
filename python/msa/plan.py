"""The plan / workspace API of the CUDA backend.

A step's attention is planned once (host work from the host metadata, plus the initialisation of
a caller-owned device workspace) and then run by :func:`msa.attend` for every layer; the run
allocates nothing and never synchronizes, so a decode step can be captured in a CUDA graph. The
CPU engine needs no plan (``plan_attention`` returns None for a host step).
"""

from dataclasses import asdict, dataclass

from . import _msa
from ._arrays import stream_of


@dataclass
class AttentionShape:
    """What a plan depends on (the problem and msa::cuda::AttentionTuning); a captured decode graph stays valid
    while these and the step's token count stay the same."""

    num_q_heads: int
    num_kv_heads: int
    topk: int = 16
    q_dtype: str = "bf16"           # bf16, fp16, fp8_e4m3
    kv_dtype: str = "bf16"          # bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4
    out_dtype: str = "bf16"         # bf16, fp16 (the query's, either for fp8)
    prefill_order: str = "query_major"  # query_major, key_major, auto
    decode_splits: int = 0          # 0: the plan's choice
    tile_splits: int = 0            # 0: the plan's choice
    kv_token_scales: bool = False   # fp8 scales per (token, head)
    widen_bytes: int = -1           # -1: the default budget, 0: never widen ahead

    def fields(self):
        return asdict(self)


@dataclass
class Plan:
    """A step's attention plan: ``blob`` holds the plan (host uint8, ``attention_plan_bytes``),
    ``workspace`` the device memory it points into; keep both while the plan is used."""

    shape: AttentionShape
    blob: object
    workspace: object

    def info(self):
        """Split counts and sizes the plan chose."""
        return _msa.plan_info(self.blob)


def _require_cuda(what):
    if not _msa.has_cuda:
        raise _msa.Error(f"{what}: this msa was built without the CUDA backend "
                         "(rebuild with -DMSA_CUDA=ON, e.g. pip install . -Ccmake.define.MSA_CUDA=ON)")


def attention_workspace_bytes(step, shape):
    """Device bytes the plan of `step` needs."""
    _require_cuda("attention_workspace_bytes")
    return _msa.attention_workspace_bytes(step.meta, shape.fields())


def plan_attention(step, shape, *, workspace=None, stream=None):
    """The attention plan of `step` (a Step on a CUDA device), in `workspace` (a uint8 CUDA tensor
    of at least attention_workspace_bytes; None: a new one). Its workspace initialisation goes on
    `stream` (default: the current torch stream), where attend must run too. None for a host step."""
    if not step.is_cuda:
        return None
    _require_cuda("plan_attention")
    import torch

    need = _msa.attention_workspace_bytes(step.meta, shape.fields())
    device = step.token_request.device
    if workspace is None:
        workspace = torch.empty(max(need, 256), dtype=torch.uint8, device=device)
    elif workspace.numel() < need:
        raise _msa.Error(f"workspace: {workspace.numel()} bytes but the plan needs {need}")
    blob = torch.empty(_msa.attention_plan_bytes, dtype=torch.uint8)
    _msa.plan_attention(step.meta, shape.fields(), workspace, blob, stream=stream_of(step.token_request, stream))
    return Plan(shape, blob, workspace)


def index_workspace_bytes(num_tokens, num_kv_heads, max_blocks, *, index_dtype=None, num_prefill_requests=0):
    """Device bytes index() needs: the block scores [num_tokens, num_kv_heads, max_blocks] fp32;
    with index_dtype "nvfp4", also the room to widen the keys of up to num_prefill_requests
    prefill requests once a step (faster on long prefill chunks)."""
    _require_cuda("index_workspace_bytes")
    return _msa.index_workspace_bytes(num_tokens, num_kv_heads, max_blocks, index_dtype=index_dtype,
                                      num_prefill_requests=num_prefill_requests)
