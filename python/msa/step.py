"""The batch metadata of one engine step, built once per step and shared by every layer."""

from . import _msa
from ._arrays import arg, empty_int32, int32_host, is_torch, to_device


class Step:
    """One engine step: the host metadata (``meta``, a ``_msa.BatchMetadata``) and the three
    int32 arrays the kernels read on the step's device: ``query_start`` [num_requests + 1],
    ``seq_lens`` [num_requests] and ``token_request`` [num_tokens] (the request of each token).

    Build it with :meth:`build` from the usual engine inputs. Decodes (0 < query_len <=
    decode_query_len) lead the batch; padding requests have seq_len 0."""

    def __init__(self, meta, query_start, seq_lens, token_request, device):
        self.meta = meta
        self.query_start = query_start
        self.seq_lens = seq_lens
        self.token_request = token_request
        self.device = device if device is not None else "cpu"

    @classmethod
    def build(cls, query_start_loc, seq_lens, *, num_decodes=None, decode_query_len=None, device=None,
              query_start_device=None, seq_lens_device=None):
        """query_start_loc [num_requests + 1] and seq_lens [num_requests]: host copies (lists, numpy
        arrays or tensors). num_decodes: the engine's decode count (None: as many requests as lead
        with query_len <= decode_query_len, 1 by default). device: where the kernels run (None or
        "cpu": the CPU engine, numpy arrays unless the inputs are tensors; a CUDA device: torch).
        query_start_device / seq_lens_device: the engine's own device copies to read instead of
        new ones (an engine's persistent buffers, so that a captured graph sees their updates)."""
        like = query_start_loc if is_torch(query_start_loc) else seq_lens
        if device is not None and str(device) != "cpu":
            import torch

            like = torch.empty(0)
        qsl = int32_host(query_start_loc, like, "query_start_loc")
        sl = int32_host(seq_lens, like, "seq_lens")
        meta = _msa.build_metadata(qsl, sl, num_decodes=-1 if num_decodes is None else num_decodes,
                                   decode_query_len=-1 if decode_query_len is None else decode_query_len)
        arrays = {}
        for name in ("query_start", "seq_lens", "token_request"):
            host = empty_int32(meta.length(name), like)
            meta.copy_to(name, host)
            arrays[name] = to_device(host, device)
        if query_start_device is not None:
            arrays["query_start"] = arg(query_start_device, "query_start_device")
        if seq_lens_device is not None:
            arrays["seq_lens"] = arg(seq_lens_device, "seq_lens_device")
        return cls(meta, arrays["query_start"], arrays["seq_lens"], arrays["token_request"], device)

    def update_seq_lens(self, seq_lens):
        """New sequence lengths for the same requests and query lengths (a decode step replayed
        from a CUDA graph): rewrites the device seq_lens in place and the host metadata."""
        qsl = empty_int32(self.meta.length("query_start"), self.seq_lens)
        self.meta.copy_to("query_start", qsl)
        sl = int32_host(seq_lens, qsl, "seq_lens")
        meta = _msa.build_metadata(qsl, sl, num_decodes=self.num_decodes,
                                   decode_query_len=self.meta.decode_query_len if self.num_decodes else -1)
        if is_torch(self.seq_lens):
            self.seq_lens.copy_(sl)
        else:
            self.seq_lens[...] = sl
        self.meta = meta

    # The step's counts.
    @property
    def num_requests(self):
        return self.meta.num_requests

    @property
    def num_tokens(self):
        return self.meta.num_tokens

    @property
    def num_decodes(self):
        return self.meta.num_decodes

    @property
    def num_decode_tokens(self):
        return self.meta.num_decode_tokens

    @property
    def decode_query_len(self):
        return self.meta.decode_query_len

    @property
    def num_prefills(self):
        return self.meta.num_prefills

    @property
    def is_cuda(self):
        return is_torch(self.token_request) and self.token_request.is_cuda

    def args(self):
        """The step's positional arguments of the extension's index and attend."""
        return (self.query_start, self.seq_lens, self.token_request, self.meta.num_decodes,
                self.meta.decode_query_len)

    def __repr__(self):
        return f"Step({self.meta!r}, device={self.device})"


def build_step(query_start_loc, seq_lens, **kw):
    """Step.build: the step's metadata from the engine's inputs."""
    return Step.build(query_start_loc, seq_lens, **kw)
