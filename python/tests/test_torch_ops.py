"""torch.ops.msa.*: the custom ops give the same bytes as msa's functions, have fake
implementations, and torch.compile traces (fullgraph) a model that calls them."""

import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
from scenario import LayerStep  # noqa: E402

REQUESTS = [(2, 300), (2, 140), (30, 100)]


class SparseLayer(torch.nn.Module):
    """The three operations of one sparse layer through torch.ops.msa, as a model would call them."""

    def forward(self, k, v, slots, index_k, index_q, q, kv_cache, index_cache, table, topk, out, lse,
                query_start, seq_lens, token_request, num_decodes: int, decode_query_len: int):
        torch.ops.msa.insert_kv(kv_cache, k, v, slots, None, None)
        torch.ops.msa.insert_index(index_cache, index_k, slots)
        torch.ops.msa.index(query_start, seq_lens, token_request, num_decodes, decode_query_len, index_q,
                            index_cache, table, topk, None)
        torch.ops.msa.attend(query_start, seq_lens, token_request, num_decodes, decode_query_len, q, out,
                             kv_cache, table, topk, lse)
        return out * 2


def layer_args(s):
    md = s.build()
    T, H = s.T, s.H
    st = md.step
    return (s.k[:T].view(T, H, 128), s.v[:T].view(T, H, 128), md.slot_mapping, s.index_k[:T],
            s.index_q[:T], s.query[:T].view(T, s.QH, 128), s.kv_cache, s.index_cache, s.block_table,
            s.topk_buffer[:T], s.output[:T].view(T, s.QH, 128), s.lse, st.query_start, st.seq_lens,
            st.token_request, st.num_decodes, st.decode_query_len)


def test_ops_equal_the_api():
    a, b = LayerStep("cpu", requests=REQUESTS, seed=4), LayerStep("cpu", requests=REQUESTS, seed=4)
    a.run()
    SparseLayer()(*layer_args(b))
    assert torch.equal(a.kv_cache.view(torch.int16), b.kv_cache.view(torch.int16))
    assert torch.equal(a.topk_buffer, b.topk_buffer)
    assert torch.equal(a.output.view(torch.int16), b.output.view(torch.int16))
    assert torch.equal(a.lse, b.lse)


def test_fake_implementations():
    s = LayerStep("cpu", requests=REQUESTS, seed=5)
    args = layer_args(s)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args]
        out = SparseLayer()(*fake)
    assert out.shape == (s.T, s.QH, 128) and out.dtype == torch.bfloat16


def test_compile_traces_the_layer():
    eager, compiled = LayerStep("cpu", requests=REQUESTS, seed=6), LayerStep("cpu", requests=REQUESTS, seed=6)
    want = SparseLayer()(*layer_args(eager))
    torch._dynamo.reset()
    model = torch.compile(SparseLayer(), backend="aot_eager", fullgraph=True)
    got = model(*layer_args(compiled))
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))
    # The mutated arguments hold the results too.
    assert torch.equal(eager.topk_buffer, compiled.topk_buffer)
    assert torch.equal(eager.kv_cache.view(torch.int16), compiled.kv_cache.view(torch.int16))
    assert torch.equal(eager.lse, compiled.lse)


def test_opcheck_attend():
    s = LayerStep("cpu", requests=REQUESTS, seed=7)
    s.run()
    md = s.build()
    st, T = md.step, s.T
    args = (st.query_start, st.seq_lens, st.token_request, st.num_decodes, st.decode_query_len,
            s.query[:T].view(T, s.QH, 128), torch.empty(T, s.QH, 128, dtype=torch.bfloat16), s.kv_cache,
            s.block_table, s.topk_buffer[:T], torch.empty(T, s.QH))
    torch.library.opcheck(torch.ops.msa.attend.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_errors_pass_through_the_ops():
    s = LayerStep("cpu", requests=REQUESTS, seed=8)
    md = s.build()
    st, T = md.step, s.T
    with pytest.raises(msa.Error, match="topk: shape"):
        torch.ops.msa.attend(st.query_start, st.seq_lens, st.token_request, st.num_decodes, st.decode_query_len,
                             s.query[:T].view(T, s.QH, 128), s.output[:T].view(T, s.QH, 128), s.kv_cache,
                             s.block_table, s.topk_buffer[: T - 1], None)
