"""Test helpers: numpy buffers seen as numpy arrays or torch tensors without a copy, so that a
test can compare the bytes an operation wrote through either framework."""

import numpy as np

# Element type of each msa dtype in numpy (fp8 as uint8 codes, named by the caller as an engine
# holding uint8 caches does) and in torch (fp8 as torch's float8 types, whose dtype msa reads).
NUMPY = {"bf16": np.uint16, "fp16": np.float16, "fp8_e4m3": np.uint8, "fp8_e5m2": np.uint8, "nvfp4": np.uint8,
         "f32": np.float32, "i32": np.int32, "i64": np.int64, "u8": np.uint8}


def torch_dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": torch.float32, "i32": torch.int32,
            "i64": torch.int64, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(name, torch.uint8)


# (numpy buffer, device tensor) pairs of the "cuda" framework, for sync_back().
DEVICE_COPIES = []


def view(buf, dtype, shape, framework, strides=None):
    """buf (a flat numpy array, any dtype) as an array of `dtype` with `shape` and element
    `strides` (None: row-major), in `framework`, sharing buf's memory; "cuda": a torch tensor on
    the GPU holding a copy of buf, which sync_back() copies back."""
    flat = buf.view(NUMPY[dtype])
    if strides is None:
        arr = flat[: int(np.prod(shape))].reshape(shape)
        strides = [s // flat.itemsize for s in arr.strides]
    if framework == "numpy":
        return np.lib.stride_tricks.as_strided(flat, tuple(shape), tuple(s * flat.itemsize for s in strides))
    import torch

    t = torch.from_numpy(buf.view(np.uint8))
    if framework == "cuda":
        t = t.to("cuda")
        DEVICE_COPIES.append((buf, t))
    return t.view(torch_dtype(dtype)).as_strided(tuple(shape), tuple(strides))


def sync_back():
    """Copies every "cuda" view's device memory back into its numpy buffer."""
    for buf, t in DEVICE_COPIES:
        buf.view(np.uint8)[...] = t.cpu().numpy()
    DEVICE_COPIES.clear()


def poisoned(nbytes, byte=0xFF):
    """A flat uint8 buffer of nbytes filled with `byte` (0xFF: NaN in every float format, -1 ints)."""
    return np.full(nbytes, byte, dtype=np.uint8)


def address(a):
    """The data address of a numpy array or torch tensor."""
    return a.data_ptr() if hasattr(a, "data_ptr") else a.__array_interface__["data"][0]
