"""msa.engine: the backend adapter's shapes, and one engine step (insert, index, forward) on the
CPU engine against a float64 reference of the caches as they hold the data."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
from msa.engine import MsaAttentionBackend, MsaAttentionImpl, unsupported_reason  # noqa: E402
from scenario import LayerStep  # noqa: E402

# MiniMax-M3 TP4 rank: 16 query heads, 1 KV head. Two decodes with one draft token each, a
# prefill chunk whose cached context ends inside a block, one starting at position 0.
TP4 = [(2, 300), (2, 1000), (70, 190), (40, 0)]


def test_backend_shapes():
    B = MsaAttentionBackend
    assert B.get_supported_head_sizes() == [128] and B.get_supported_kernel_block_sizes() == [128]
    assert B.get_kv_cache_shape(10, 128, 4, 128) == (10, 4, 128, 256)
    assert B.get_kv_cache_shape(10, 128, 4, 128, "fp8", layout="split") == (10, 2, 128, 4, 128)
    assert B.get_kv_cache_shape(10, 128, 4, 128, "nvfp4") == (10, 8, 128, 72)
    assert B.get_kv_cache_stride_order("NHD") == (0, 2, 1, 3)
    nhd = B.allocate_kv_cache(3, 2, "bfloat16", "NHD", device="cpu")
    assert nhd.shape == (3, 2, 128, 256) and nhd.stride() == (2 * 128 * 256, 256, 512, 1)
    assert msa.KVCache(nhd).describe()["layout"] == "nhd"
    with pytest.raises(ValueError, match="head_size"):
        B.get_kv_cache_shape(10, 128, 4, 64)
    assert unsupported_reason(16, 1, 128, 16, 128) is None
    assert "group" in unsupported_reason(48, 2, 128, 16, 128)
    with pytest.raises(ValueError, match="topk_blocks"):
        MsaAttentionImpl(16, 128, 0.1, 1, topk_blocks=65)


@pytest.mark.parametrize("kv_dtype,layout,query_fp8", [
    ("bf16", "HND", False),
    ("bf16", "NHD", False),
    ("fp8_e4m3", "HND", True),
    ("fp8_e5m2", "split", False),
    ("nvfp4", "HND", False),
])
def test_forward_against_float64(kv_dtype, layout, query_fp8):
    s = LayerStep("cpu", requests=TP4, kv_dtype=kv_dtype, layout=layout, query_fp8=query_fp8, seed=3)
    out_ptr = s.output.data_ptr()
    md = s.run()
    assert md.num_decodes == 2 and md.num_decode_tokens == 4 and md.num_prefills == 2 and md.plan is None
    # Written in place, rows past the step untouched.
    assert s.output.data_ptr() == out_ptr
    assert torch.isnan(s.output[s.T:].float()).all() and not torch.isnan(s.output[: s.T].float()).any()
    assert (s.topk_buffer[s.T:] == -7).all()
    err_out, err_lse = s.check()
    assert err_out < 1e-2 and err_lse < 1e-3, (err_out, err_lse)


def test_forward_gqa_groups_and_forced_blocks():
    """TP1 shapes (64 query heads over 4 KV heads), init and local forced blocks, small top-k."""
    s = LayerStep("cpu", requests=[(1, 900), (1, 40), (130, 260)], num_q_heads=64, num_kv_heads=4, topk=4,
                  init_blocks=1, local_blocks=2, seed=9)
    s.run()
    err_out, err_lse = s.check()
    assert err_out < 1e-2 and err_lse < 1e-3, (err_out, err_lse)


def test_consecutive_decode_steps_in_the_same_buffers():
    """What a replayed CUDA graph sees, on the CPU engine: the same metadata object and buffers,
    updated in place step after step (new pages as requests enter new blocks)."""
    s = LayerStep("cpu", requests=[(2, 126), (2, 500), (2, 255)], seed=12, spare_pages=8)
    md = s.build()
    s.run(md)
    table = s.block_table.clone()
    for i in range(3):
        s.advance(md, np.random.default_rng(i))
        s.run(md)
        err_out, err_lse = s.check()
        assert err_out < 1e-2 and err_lse < 1e-3, (i, err_out, err_lse)
    assert s.seq_lens == [134, 508, 263] and list(md.step.seq_lens) == [134, 508, 263]
    assert not torch.equal(table, s.block_table)  # requests 0 and 2 entered new blocks


def test_profiling_run_without_metadata():
    s = LayerStep("cpu", requests=[(1, 10)], seed=1)
    out = s.impl.forward(s.query, s.kv_cache, s.output, s.topk_buffer, None)
    assert out is s.output and torch.isnan(out.float()).all()


def test_builder_rejects_a_decode_after_a_prefill():
    s = LayerStep("cpu", requests=[(1, 10), (5, 10)], seed=1)
    with pytest.raises(msa.Error, match="num_decodes = 2"):
        s.builder.build(s.query_start_loc_cpu, s.seq_lens_cpu, s.block_table, s.slot_mapping, 2)


def test_metadata_counts():
    s = LayerStep("cpu", requests=TP4, seed=2)
    md = s.build()
    assert (md.num_actual_tokens, md.num_decodes, md.decode_query_len, md.num_prefill_tokens) == (114, 2, 2, 110)
    assert np.array_equal(md.step.token_request.numpy()[:6], [0, 0, 1, 1, 2, 2])
