"""The Python bindings give the C++ engine's results, byte for byte.

msa._msa.testing.reference_step synthesizes a step in C++ (tests/support/workload: shuffled
physical pages, cached context already inserted, clustered index keys, poisoned outputs) and runs
insert, index and attend through the C++ CPU engine directly. The same step then runs through
the Python API on copies of its inputs, as numpy arrays and as torch tensors sharing the same
memory; caches, top-k, output and lse must be identical bytes. The writes land in the caller's
buffers (nothing is copied on the way)."""

import numpy as np
import pytest

import msa
from arrays import poisoned, sync_back, view

# (query_len, context_len): two decodes with a draft token, a short and a 129-token prefill chunk.
MIXED = [(2, 700), (2, 130), (37, 300), (129, 1000)]


def run_python_step(ref, spec, framework, topk_override=None):
    """The reference step through msa's Python API; returns the buffers it wrote (numpy).
    framework "cuda": torch tensors on the GPU (copies of the buffers, copied back at the end).
    topk_override: top-k lists attend reads instead of the ones index wrote."""
    kv_dtype = spec.get("kv_dtype", "bf16")
    H, QH, K = ref["num_kv_heads"], ref["num_q_heads"], ref["topk"]
    T, R = ref["num_tokens"], len(ref["seq_lens"])
    named = framework == "numpy"  # torch tensors carry bf16 / fp16 / float8 themselves
    g = msa.kv_cache_geometry(ref["num_pages"], H, kv_dtype, spec.get("layout", "hnd"), spec.get("page_stride", 0))
    kv_buf = ref["kv_before"].copy()
    cache = msa.KVCache(view(kv_buf, kv_dtype, g["shape"], framework, g["strides"]),
                        kv_dtype if named or kv_dtype == "nvfp4" else None, ref["k_scale"], ref["v_scale"])
    k_scales_buf = ref["k_scales_before"].copy()
    v_scales_buf = ref["v_scales_before"].copy()
    if spec.get("kv_scales") == "token":
        cache.k_scales = view(k_scales_buf, "f32", (ref["num_pages"] * 128, H), framework)
        cache.v_scales = view(v_scales_buf, "f32", (ref["num_pages"] * 128, H), framework)
    index_dtype = spec.get("index_dtype", "bf16")
    index_buf = ref["index_before"].copy()
    index_cache = msa.IndexCache(view(index_buf, index_dtype, (ref["index_num_pages"], 128, 128), framework),
                                 index_dtype if named else None)

    stride = ref["table_stride"]
    blocks = max(1, -(-int(ref["seq_lens"].max()) // 128))
    # Column slices of the [R, table_stride] tables: rows at a stride larger than their width.
    table = view(ref["block_table"], "i32", (R, stride), framework)[:, :blocks]
    index_table = view(ref["index_block_table"], "i32", (R, stride), framework)[:, :blocks]
    on_gpu = framework == "cuda"
    step = msa.Step.build(ref["query_start"], ref["seq_lens"], num_decodes=ref["num_decodes"],
                          decode_query_len=ref["decode_query_len"], device="cuda" if on_gpu else None)
    if not on_gpu:  # the step's arrays as the framework's
        step = msa.Step.build(view(ref["query_start"], "i32", (R + 1,), framework),
                              view(ref["seq_lens"], "i32", (R,), framework),
                              num_decodes=ref["num_decodes"], decode_query_len=ref["decode_query_len"])
    src = ref["src_dtype"]
    q_dtype = spec.get("q_dtype", "bf16")
    k = view(ref["new_k"], src, (T, H, 128), framework)
    v = view(ref["new_v"], src, (T, H, 128), framework)
    slots = view(ref["slots"], "i64", (T,), framework)
    msa.insert_kv(cache, k, v, slots, src_dtype=src if named else None)
    msa.insert_index(index_cache, view(ref["new_index_k"], src, (T, 128), framework),
                     view(ref["index_slots"], "i64", (T,), framework), src_dtype=src if named else None)

    topk_buf = poisoned(T * H * K * 4)
    topk = view(topk_buf, "i32", (T, H, K), framework)
    msa.index(step, view(ref["index_q"], src, (T, H, 128), framework), index_cache, index_table, topk,
              init_blocks=spec.get("init_blocks", 0), local_blocks=spec.get("local_blocks", 1),
              iq_dtype=src if named else None)

    out_dtype = ref["out_dtype"]
    out_buf = poisoned(T * QH * 128 * 2)
    lse_buf = poisoned(T * QH * 4)
    out = view(out_buf, out_dtype, (T, QH, 128), framework)
    lse = view(lse_buf, "f32", (T, QH), framework)
    q = view(ref["q"], q_dtype, (T, QH, 128), framework)
    plan = None
    if on_gpu:
        plan = msa.plan_attention(step, msa.AttentionShape(QH, H, K, q_dtype, kv_dtype, out_dtype,
                                                           kv_token_scales=spec.get("kv_scales") == "token"))
    if topk_override is not None:
        topk = view(topk_override.copy(), "i32", (T, H, K), framework)
    msa.attend(step, q, cache, table, topk, out, lse=lse, plan=plan, q_scale=ref["q_scale"],
               softmax_scale=ref["softmax_scale"], q_dtype=q_dtype if named else None,
               out_dtype=out_dtype if named else None)
    if on_gpu:
        sync_back()
    return dict(kv=kv_buf, k_scales=k_scales_buf, v_scales=v_scales_buf, index=index_buf, topk=topk_buf,
                out=out_buf, lse=lse_buf)


CASES = {
    "bf16-hnd": dict(),
    "bf16-nhd-tp1": dict(tp=1, layout="nhd"),
    "fp16-split": dict(kv_dtype="fp16", q_dtype="fp16", layout="split"),
    "e4m3-tensor-nhd": dict(kv_dtype="fp8_e4m3", layout="nhd"),
    "e4m3-token-split": dict(kv_dtype="fp8_e4m3", kv_scales="token", layout="split"),
    "e5m2-token-hnd": dict(kv_dtype="fp8_e5m2", kv_scales="token"),
    "nvfp4": dict(kv_dtype="nvfp4"),
    "nvfp4-tp2-page-stride": dict(kv_dtype="nvfp4", tp=2, page_stride=3 * 2 * 9216 + 512),
    "fp8-query": dict(q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3"),
    "fp8-index-cache": dict(index_dtype="fp8_e4m3", layout="nhd", init_blocks=1, local_blocks=2, topk=5),
    "page-stride-hnd": dict(page_stride=128 * 256 * 3 + 64, tp=8),
    "topk-64": dict(topk=64, tp=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_equals_cpp_engine(case, framework):
    spec = dict(requests=MIXED, decode_threshold=2, seed=11 + len(case), num_threads=2, **CASES[case])
    ref = msa._msa.testing.reference_step(spec)
    got = run_python_step(ref, spec, framework)
    assert np.array_equal(got["kv"], ref["kv_after"]), "KV cache differs after insert_kv"
    for name in ("k_scales", "v_scales"):  # bit patterns: unused slots hold NaN
        assert np.array_equal(got[name].view(np.uint32), ref[name + "_after"].view(np.uint32)), name
    assert np.array_equal(got["index"], ref["index_after"]), "index cache differs after insert_index"
    assert np.array_equal(got["topk"].view(np.int32), ref["topk_out"]), "top-k differs"
    assert np.array_equal(got["out"], ref["out"]), "attention output differs"
    assert np.array_equal(got["lse"].view(np.uint32), ref["lse"].view(np.uint32)), "lse differs"
    assert not np.isnan(ref["lse"]).any()


def test_padding_and_decode_only_steps(framework):
    """A decode-only step with a padding request (seq_len 0) at the end of the batch."""
    spec = dict(requests=[(1, 900), (1, 127), (0, 0)], decode_threshold=1, seed=5, num_threads=1)
    ref = msa._msa.testing.reference_step(spec)
    got = run_python_step(ref, spec, framework)
    assert np.array_equal(got["topk"].view(np.int32), ref["topk_out"])
    assert np.array_equal(got["out"], ref["out"])
    assert np.array_equal(got["lse"].view(np.uint32), ref["lse"].view(np.uint32))
