"""Cache descriptions and allocation helpers.

A KV cache array has one of these logical shapes (strides in elements; bytes for nvfp4):

* bf16 / fp16 / fp8: ``[num_pages, num_kv_heads, 128, 256]``, K in ``[..., :128]`` and V in
  ``[..., 128:]``; the strides say the physical order: HND ``[page][head][token][256]``, NHD
  ``[page][token][head][256]`` (an engine's ``(B, H, N, 2 * hs)`` shape with its stride order), or
  any page stride for layer- or block-outer packing;
* split K/V planes: ``[num_pages, 2, 128, num_kv_heads, 128]`` (plane 0 K, plane 1 V);
* nvfp4: ``[num_pages, 2 * num_kv_heads, 128, 72]`` uint8 head-slot pages (slot 2h head h's K,
  2h + 1 its V; per slot 128 x 64 code bytes, then 128 x 8 group-scale bytes).

The index cache is ``[num_pages, 128, 128]`` bf16 or fp8 e4m3. Shapes and strides come from the
library's own view builders (``_msa.kv_cache_geometry``).
"""

from dataclasses import dataclass
from typing import Any, Optional

from . import _msa
from ._arrays import arg, dtype_name, raw

BLOCK_SIZE = _msa.block_size
HEAD_DIM = _msa.head_dim


@dataclass
class KVCache:
    """A KV cache array and how its values read: ``dtype`` names the elements when the array's
    own dtype cannot (uint8 fp8 / nvfp4 codes, numpy uint16 bf16); fp8 caches have one scale per
    tensor (``k_scale``, ``v_scale``) or, with ``k_scales`` / ``v_scales`` ([num_pages * 128,
    num_kv_heads] float32), one per (token slot, head); nvfp4's global scales are ``k_scale`` /
    ``v_scale``."""

    data: Any
    dtype: Optional[str] = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    k_scales: Any = None
    v_scales: Any = None

    def kwargs(self, written=False):
        """The keyword arguments of the extension's cache parameters (written: the call writes
        the per-token scales, as insert_kv does)."""
        return dict(kv_dtype=self.dtype or dtype_name(self.data), k_scale=float(self.k_scale),
                    v_scale=float(self.v_scale), k_scales=arg(self.k_scales, "k_scales", written),
                    v_scales=arg(self.v_scales, "v_scales", written))

    def describe(self):
        """The view msa reads: dtype, layout, strides, scale mode."""
        return _msa.describe_kv_cache(raw(self.data), **self.kwargs())


@dataclass
class IndexCache:
    """An index cache array [num_pages, 128, 128] (bf16, or fp8 e4m3 codes named by ``dtype``)."""

    data: Any
    dtype: Optional[str] = None

    def name(self):
        return self.dtype or dtype_name(self.data)


def as_kv_cache(cache, **kw):
    """A KVCache from a KVCache or an array (plus KVCache's fields as keywords)."""
    return cache if isinstance(cache, KVCache) else KVCache(cache, **kw)


def as_index_cache(cache, dtype=None):
    return cache if isinstance(cache, IndexCache) else IndexCache(cache, dtype)


def kv_cache_geometry(num_pages, num_kv_heads, kv_dtype="bf16", layout="hnd", page_stride=0):
    """dict(shape, strides, extent, layout, storage) of a KV cache array; page_stride 0: compact."""
    return _msa.kv_cache_geometry(num_pages, num_kv_heads, kv_dtype, layout, page_stride)


def kv_cache_shape(num_pages, num_kv_heads, kv_dtype="bf16", layout="hnd"):
    return tuple(kv_cache_geometry(num_pages, num_kv_heads, kv_dtype, layout)["shape"])


def kv_cache_strides(num_pages, num_kv_heads, kv_dtype="bf16", layout="hnd", page_stride=0):
    return tuple(kv_cache_geometry(num_pages, num_kv_heads, kv_dtype, layout, page_stride)["strides"])


def kv_scales_shape(num_pages, num_kv_heads):
    """Shape of one per-(token slot, head) fp8 scale array."""
    if num_pages < 0 or num_kv_heads < 1:
        raise _msa.Error(f"kv_scales_shape: num_pages = {num_pages} must be >= 0 and num_kv_heads = "
                         f"{num_kv_heads} >= 1")
    return (num_pages * BLOCK_SIZE, num_kv_heads)


def index_cache_geometry(num_pages, page_stride=0):
    return _msa.index_cache_geometry(num_pages, page_stride)


def index_cache_shape(num_pages):
    return tuple(index_cache_geometry(num_pages)["shape"])


def _storage_dtype(name, torch_like):
    """The framework dtype an allocation of msa dtype `name` uses."""
    canonical = _msa.dtype_name(name)
    if torch_like:
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": torch.float32,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(canonical, torch.uint8)
    import numpy as np

    return {"bf16": np.uint16, "fp16": np.float16, "f32": np.float32}.get(canonical, np.uint8)


def _use_torch(device, framework):
    """torch when asked for or when a device is named, else numpy."""
    if framework is not None:
        return framework == "torch"
    return device is not None


def empty_strided(shape, strides, dtype_name_, *, device=None, framework=None):
    """An uninitialised array of msa dtype `dtype_name_` with these strides (elements)."""
    if _use_torch(device, framework):
        import torch

        return torch.empty_strided(tuple(shape), tuple(strides), dtype=_storage_dtype(dtype_name_, True),
                                   device=device or "cpu")
    import numpy as np

    dt = np.dtype(_storage_dtype(dtype_name_, False))
    extent = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    flat = np.empty(extent, dtype=dt)
    return np.lib.stride_tricks.as_strided(flat, tuple(shape), tuple(s * dt.itemsize for s in strides))


def allocate_kv_cache(num_pages, num_kv_heads, kv_dtype="bf16", layout="hnd", *, page_stride=0,
                      kv_scales="tensor", k_scale=1.0, v_scale=1.0, device=None, framework=None):
    """An uninitialised KV cache in `layout` (hnd, nhd, split; nvfp4 has its own pages) as a
    KVCache: a torch tensor on `device` (fp8 as torch float8), or a numpy array when no device
    is named (bf16 as uint16, fp8 / nvfp4 as uint8). kv_scales="token"
    also allocates fp8 per-(token slot, head) scales."""
    g = kv_cache_geometry(num_pages, num_kv_heads, kv_dtype, layout, page_stride)
    canonical = _msa.dtype_name(kv_dtype)
    data = empty_strided(g["shape"], g["strides"], canonical, device=device, framework=framework)
    cache = KVCache(data, canonical, k_scale, v_scale)
    if kv_scales == "token":
        if not canonical.startswith("fp8"):
            raise ValueError(f"kv_scales='token' is for fp8 caches, not {canonical}")
        shape = kv_scales_shape(num_pages, num_kv_heads)
        cache.k_scales = empty_strided(shape, (num_kv_heads, 1), "f32", device=device, framework=framework)
        cache.v_scales = empty_strided(shape, (num_kv_heads, 1), "f32", device=device, framework=framework)
    elif kv_scales != "tensor":
        raise ValueError(f"kv_scales = {kv_scales!r}: 'tensor' or 'token'")
    return cache


def allocate_index_cache(num_pages, index_dtype="bf16", *, page_stride=0, device=None, framework=None):
    """An uninitialised index cache [num_pages, 128, 128] as an IndexCache."""
    g = index_cache_geometry(num_pages, page_stride)
    canonical = _msa.dtype_name(index_dtype)
    return IndexCache(empty_strided(g["shape"], g["strides"], canonical, device=device, framework=framework),
                      canonical)
