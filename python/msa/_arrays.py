"""Arrays as the extension takes them: torch tensors (CPU or CUDA) and numpy
arrays, passed through DLPack without a copy. Only names and views happen here:
float8 tensors travel as their uint8 view with the dtype named, and CUDA work
goes on the caller's current torch stream unless a stream is given."""

import sys

# torch dtypes whose DLPack export msa reads by name (float8 travels as uint8).
_TORCH_FLOAT8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x):
    return is_torch(x) and x.is_cuda


def dtype_name(x):
    """msa's name of what `x` holds when its own dtype says it (else None)."""
    if is_torch(x):
        name = str(x.dtype).replace("torch.", "")
        return {"bfloat16": "bf16", "float16": "fp16", **_TORCH_FLOAT8}.get(name)
    dt = getattr(x, "dtype", None)
    return "fp16" if dt is not None and str(dt) == "float16" else None


def raw(x):
    """The array the extension receives: float8 tensors as their uint8 view,
    tensors that require grad detached (DLPack refuses them). Never a copy."""
    if x is None or not is_torch(x):
        return x
    if str(x.dtype).replace("torch.", "") in _TORCH_FLOAT8:
        x = x.view(_torch().uint8)
    return x.detach() if x.requires_grad else x


def _is_array(x):
    """Whether the extension can take x without a copy: DLPack, the array interface or a buffer."""
    if hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__"):
        return True
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


def arg(x, name, written=False):
    """x as the extension receives it (raw), after the checks whose failure the extension could
    only report as a bare TypeError: something that is not an array, a non-native byte order
    (DLPack has none), and a read-only array where msa writes. Each raises msa.Error naming the
    argument; None (an absent optional array) passes."""
    from ._msa import Error

    if x is None:
        return None
    if not _is_array(x):
        raise Error(f"{name}: type {type(x).__name__} is not an array (a numpy array, a torch tensor or "
                    f"anything with __dlpack__)")
    dt = getattr(x, "dtype", None)
    order = getattr(dt, "byteorder", "=")
    if order in "<>" and order != ("<" if sys.byteorder == "little" else ">"):
        raise Error(f"{name}: dtype {dt} is not in the machine's byte order (byteswap it first)")
    flags = getattr(x, "flags", None)
    if written and flags is not None and not getattr(flags, "writeable", True):
        raise Error(f"{name}: a read-only array, but msa writes into it")
    return raw(x)


def resolve_dtype(x, given):
    """The dtype name to pass: the one given, else the one a float8 tensor implies."""
    if given is not None:
        return given
    if is_torch(x):
        return _TORCH_FLOAT8.get(str(x.dtype).replace("torch.", ""))
    return None


def stream_of(x, stream=None):
    """The cudaStream_t (as an int) for work on x's device: `stream` (a
    torch.cuda.Stream or an int) if given, else torch's current stream there."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    if is_cuda(x):
        return _torch().cuda.current_stream(x.device).cuda_stream
    return 0


def int32_host(values, like=None, name="values"):
    """A host int32 array of `values` (list, numpy array or tensor on any device),
    torch when `values` or `like` is a tensor, else numpy. Values that are not integers, or
    that int32 cannot hold, raise msa.Error naming them (`name`) instead of being cast."""
    from ._msa import Error
    import numpy as np

    torch = _torch()
    if is_torch(values) and (values.is_floating_point() or values.is_complex()):
        raise Error(f"{name}: dtype {values.dtype} but must hold integers")
    host = values.detach().cpu().numpy() if is_torch(values) else np.asarray(values)
    if host.size and host.dtype.kind not in "iu":
        raise Error(f"{name}: dtype {host.dtype} but must hold integers")
    if host.size and (host.min() < -2**31 or host.max() > 2**31 - 1):
        raise Error(f"{name}: values in [{host.min()}, {host.max()}] do not fit int32")
    host = np.array(host, dtype=np.int32, order="C")  # a copy: the caller's array stays theirs
    if is_torch(values) or (torch is not None and is_torch(like)):
        return torch.from_numpy(host)
    return host


def empty_int32(n, like):
    """A host int32 array of n entries of like's framework."""
    if is_torch(like):
        return _torch().empty(n, dtype=_torch().int32)
    import numpy as np

    return np.empty(n, dtype=np.int32)


def to_device(host, device):
    """host (torch or numpy) on `device`: the array itself for the host, else a torch copy."""
    if device is None or str(device) == "cpu":
        return host
    torch = _torch()
    if not is_torch(host):
        host = torch.from_numpy(host)
    return host.to(device)
