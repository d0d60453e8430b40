"""The Python API on the CPU engine: zero-copy outputs, errors with the library's message,
batch metadata from engine inputs, cache geometry, and what a build without CUDA says."""

import numpy as np
import pytest

import msa
from arrays import address, view

H, QH, K = 1, 16, 4


def small_step(framework, rng, *, seq_lens=(300, 5), query_lens=(1, 3)):
    """A tiny step on a compact bf16 HND cache: everything an attend call needs, in `framework`."""
    R = len(seq_lens)
    blocks = [-(-s // 128) for s in seq_lens]
    num_pages = sum(blocks) + 2
    perm = rng.permutation(num_pages)
    table = np.zeros((R, max(blocks)), dtype=np.int32)
    at = 0
    for r, b in enumerate(blocks):
        table[r, :b] = perm[at:at + b]
        at += b
    g = msa.kv_cache_geometry(num_pages, H, "bf16", "hnd")
    kv = (rng.standard_normal(g["extent"]).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    T = sum(query_lens)
    q = (rng.standard_normal(T * QH * 128).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    topk = np.full((T, H, K), -1, dtype=np.int32)
    t = 0
    for r, (s, ql) in enumerate(zip(seq_lens, query_lens)):
        for i in range(ql):
            last = (s - ql + i) // 128
            ids = sorted(set([last] + list(rng.choice(last + 1, size=min(K, last + 1) - 1, replace=False))))
            while len(ids) < min(K, last + 1):
                ids = sorted(set(ids) | {int(rng.integers(0, last + 1))})
            topk[t, 0, : len(ids)] = ids
            t += 1
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    arrays = dict(kv=view(kv, "bf16", g["shape"], framework, g["strides"]), q=view(q, "bf16", (T, QH, 128), framework),
                  topk=view(topk.reshape(-1), "i32", (T, H, K), framework),
                  table=view(table.reshape(-1), "i32", table.shape, framework))
    step = msa.Step.build(view(qsl, "i32", (R + 1,), framework),
                          view(np.array(seq_lens, dtype=np.int32), "i32", (R,), framework), num_decodes=1)
    return step, arrays, T


def test_outputs_are_written_in_place(framework, rng):
    step, a, T = small_step(framework, rng)
    out_buf = np.full(T * QH * 128, 0xFFFF, dtype=np.uint16)  # NaN
    lse_buf = np.full(T * QH, np.nan, dtype=np.float32)
    out = view(out_buf, "bf16", (T, QH, 128), framework)
    lse = view(lse_buf, "f32", (T, QH), framework)
    before = address(out)
    msa.attend(step, a["q"], msa.KVCache(a["kv"], "bf16"), a["table"], a["topk"], out, lse=lse, q_dtype="bf16",
               num_threads=1)
    assert address(out) == before == out_buf.__array_interface__["data"][0]
    assert not np.isnan(lse_buf).any() and (out_buf != 0xFFFF).all()  # the caller's memory holds the result


def test_no_silent_copy_of_a_strided_output(framework, rng):
    step, a, T = small_step(framework, rng)
    big = view(np.zeros(T * QH * 256, dtype=np.uint16), "bf16", (T, QH, 256), framework)
    with pytest.raises(msa.Error, match="out: must be contiguous"):
        msa.attend(step, a["q"], msa.KVCache(a["kv"], "bf16"), a["table"], a["topk"], big[:, :, :128], q_dtype="bf16")


def test_bad_input_raises_the_library_message(framework, rng):
    step, a, T = small_step(framework, rng)
    out = view(np.zeros(T * QH * 128, dtype=np.uint16), "bf16", (T, QH, 128), framework)
    cache = msa.KVCache(a["kv"], "bf16")
    a["topk"][1, 0, 0] = 7  # token 1 (request 0, position 299) sees blocks 0..2 only
    with pytest.raises(msa.Error, match=r"topk\[t=1, h=0, k=0\] = 7"):
        msa.attend(step, a["q"], cache, a["table"], a["topk"], out, q_dtype="bf16")
    assert issubclass(msa.Error, RuntimeError)


def test_bad_slot_names_index_and_value(framework, rng):
    cache = msa.allocate_kv_cache(2, 1, "bf16", "hnd", framework=framework)
    k = view(np.zeros(3 * 128, dtype=np.uint16), "bf16", (3, 1, 128), framework)
    slots = view(np.array([0, 999, 5], dtype=np.int64), "i64", (3,), framework)
    with pytest.raises(msa.Error, match=r"slots\[1\] = 999"):
        msa.insert_kv(cache, k, k, slots, src_dtype="bf16")


def test_shape_dtype_and_name_errors(framework, rng):
    step, a, T = small_step(framework, rng)
    cache = msa.KVCache(a["kv"], "bf16")
    out = view(np.zeros(T * QH * 128, dtype=np.uint16), "bf16", (T, QH, 128), framework)
    unnamed = np.zeros((1, 1, 128, 256), np.uint16)
    with pytest.raises(msa.Error, match="kv_cache: an array of dtype uint16 needs its element type named"):
        msa.attend(step, a["q"], unnamed, a["table"], a["topk"], out, q_dtype="bf16")
    with pytest.raises(msa.Error, match=r"topk: shape \(3, 1, 4\) but must be \[num_tokens, num_kv_heads, topk\]"):
        msa.attend(step, a["q"], cache, a["table"], a["topk"][: T - 1], out, q_dtype="bf16")
    f32 = view(np.zeros(T * QH * 128, dtype=np.float32), "f32", (T, QH, 128), framework)
    with pytest.raises(msa.Error, match="q_dtype = f32"):
        msa.attend(step, f32, cache, a["table"], a["topk"], out, out_dtype="bf16")
    with pytest.raises(msa.Error, match="request 0 has seq_len 300 and needs 3 blocks but the table has 1"):
        msa.attend(step, a["q"], cache, a["table"][:, :1], a["topk"], out, q_dtype="bf16")


def read_only(x):
    """A read-only numpy view of x's memory."""
    return np.lib.stride_tricks.as_strided(x, x.shape, x.strides, writeable=False)


def test_read_only_inputs_are_read(rng):
    step, a, T = small_step("numpy", rng)
    outs = []
    for wrap in (lambda x: x, read_only):
        out = np.zeros((T, QH, 128), np.uint16)
        msa.attend(step, wrap(a["q"]), msa.KVCache(wrap(a["kv"]), "bf16"), wrap(a["table"]), wrap(a["topk"]), out,
                   q_dtype="bf16", out_dtype="bf16", num_threads=1)
        outs.append(out)
    assert (outs[0] == outs[1]).all() and (outs[0] != 0).any()


def test_read_only_outputs_are_refused_untouched(rng):
    step, a, T = small_step("numpy", rng)
    cache = msa.KVCache(a["kv"], "bf16")
    out = np.full((T, QH, 128), 0x5555, np.uint16)
    with pytest.raises(msa.Error, match="out: a read-only array, but msa writes into it"):
        msa.attend(step, a["q"], cache, a["table"], a["topk"], read_only(out), q_dtype="bf16", out_dtype="bf16")
    lse = np.full((T, QH), 7.0, np.float32)
    with pytest.raises(msa.Error, match="lse: a read-only array"):
        msa.attend(step, a["q"], cache, a["table"], a["topk"], out, lse=read_only(lse), q_dtype="bf16",
                   out_dtype="bf16")
    assert (out == 0x5555).all() and (lse == 7.0).all()
    before = a["kv"].copy()
    k = np.ones((2, H, 128), np.uint16)
    with pytest.raises(msa.Error, match="kv_cache: a read-only array"):
        msa.insert_kv(msa.KVCache(read_only(a["kv"]), "bf16"), k, k, np.array([0, 1], np.int64), src_dtype="bf16")
    assert (a["kv"] == before).all()


def test_arrays_the_extension_cannot_take_are_named(rng):
    step, a, T = small_step("numpy", rng)
    cache = msa.KVCache(a["kv"], "bf16")
    out = np.zeros((T, QH, 128), np.uint16)
    swapped = a["topk"].astype(a["topk"].dtype.newbyteorder())
    with pytest.raises(msa.Error, match="topk: dtype .* is not in the machine's byte order"):
        msa.attend(step, a["q"], cache, a["table"], swapped, out, q_dtype="bf16", out_dtype="bf16")
    with pytest.raises(msa.Error, match="topk: type list is not an array"):
        msa.attend(step, a["q"], cache, a["table"], a["topk"].tolist(), out, q_dtype="bf16", out_dtype="bf16")
    for threads in (-1, 1025):
        with pytest.raises(msa.Error, match=f"options.num_threads = {threads} is not in \\[0, 1024\\]"):
            msa.attend(step, a["q"], cache, a["table"], a["topk"], out, q_dtype="bf16", out_dtype="bf16",
                       num_threads=threads)


def test_an_empty_step_runs():
    step = msa.build_step([0], [])
    assert step.num_tokens == 0 and step.num_requests == 0
    cache = msa.allocate_kv_cache(2, 1, "bf16", "hnd")
    table, topk = np.zeros((0, 4), np.int32), np.zeros((0, 1, 16), np.int32)
    msa.insert_kv(cache, np.zeros((0, 1, 128), np.uint16), np.zeros((0, 1, 128), np.uint16), np.zeros(0, np.int64),
                  src_dtype="bf16")
    msa.index(step, np.zeros((0, 1, 128), np.uint16), msa.allocate_index_cache(2), table, topk, iq_dtype="bf16")
    msa.attend(step, np.zeros((0, QH, 128), np.uint16), cache, table, topk, np.zeros((0, QH, 128), np.uint16),
               q_dtype="bf16", out_dtype="bf16")


def test_step_inputs_must_be_int32_integers():
    with pytest.raises(msa.Error, match="query_start_loc: dtype float64 but must hold integers"):
        msa.build_step([0.5, 1], [10])
    with pytest.raises(msa.Error, match=r"seq_lens: values in \[5, 1099511627776\] do not fit int32"):
        msa.build_step([0, 1, 2], [5, 2**40])
    with pytest.raises(msa.Error, match="num_pages = -3 must be >= 0"):
        msa.index_cache_geometry(-3)
    with pytest.raises(msa.Error, match="num_pages = -1 must be >= 0"):
        msa.kv_scales_shape(-1, 1)


def test_metadata_from_engine_inputs():
    meta = msa.build_metadata(np.array([0, 2, 4, 104, 104], np.int32), np.array([50, 300, 1000, 0], np.int32),
                              num_decodes=2)
    assert (meta.num_requests, meta.num_tokens, meta.num_decodes, meta.decode_query_len) == (4, 104, 2, 2)
    assert (meta.num_prefills, meta.num_prefill_tokens, meta.max_seq_len) == (2, 100, 1000)
    pos = np.empty(meta.length("token_position"), np.int32)
    meta.copy_to("token_position", pos)
    assert list(pos[:4]) == [48, 49, 298, 299] and pos[4] == 900
    with pytest.raises(msa.Error, match=r"query_start_loc\[0\] = 1"):
        msa.build_metadata(np.array([1, 2], np.int32), np.array([5], np.int32))
    with pytest.raises(msa.Error, match="num_decodes = 1 but 2 requests lead"):
        msa.build_metadata(np.array([0, 1, 2, 9], np.int32), np.array([5, 6, 20], np.int32), num_decodes=1,
                           decode_query_len=1)
    with pytest.raises(msa.Error, match="seq_lens"):
        msa.build_metadata(np.array([0, 5], np.int32), np.array([3], np.int32))


def test_step_update_keeps_buffers(framework, rng):
    step, a, T = small_step(framework, rng)
    before = address(step.seq_lens)
    step.update_seq_lens([301, 5])
    assert address(step.seq_lens) == before and list(np.asarray(step.seq_lens)) == [301, 5]
    assert step.meta.max_seq_len == 5 and step.num_tokens == T  # max over prefills


@pytest.mark.parametrize("layout", ["hnd", "nhd", "split"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_cache_geometry_round_trip(layout, dtype, framework):
    kw = dict(device="cpu") if framework == "torch" else {}
    c = msa.allocate_kv_cache(5, 3, dtype, layout, page_stride=0, **kw)
    d = c.describe()
    g = msa.kv_cache_geometry(5, 3, dtype, layout)
    assert (d["layout"], d["num_pages"], d["num_kv_heads"], d["page_stride"]) == (layout, 5, 3, g["strides"][0])
    padded = msa.allocate_kv_cache(5, 3, dtype, layout, page_stride=g["strides"][0] + 1024, **kw)
    assert padded.describe()["page_stride"] == g["strides"][0] + 1024
    assert msa.kv_cache_shape(5, 3, dtype, layout) == tuple(g["shape"])


def test_nvfp4_and_index_and_scales_geometry():
    assert msa.kv_cache_geometry(4, 2, "nvfp4")["shape"] == (4, 4, 128, 72)
    c = msa.allocate_kv_cache(4, 2, "nvfp4", k_scale=0.5, v_scale=0.25)
    assert c.describe()["layout"] == "nvfp4" and c.data.dtype == np.uint8
    t = msa.allocate_kv_cache(4, 2, "fp8_e5m2", kv_scales="token")
    assert t.k_scales.shape == msa.kv_scales_shape(4, 2) == (512, 2) and t.describe()["scale_mode"] == "per_token_head"
    assert msa.index_cache_shape(7) == (7, 128, 128)
    with pytest.raises(ValueError, match="fp8"):
        msa.allocate_kv_cache(1, 1, "bf16", kv_scales="token")


def test_plan_is_none_on_the_cpu_engine(rng):
    step, _, _ = small_step("numpy", rng)
    assert msa.plan_attention(step, msa.AttentionShape(16, 1)) is None


@pytest.mark.skipif(msa.has_cuda, reason="this build has the CUDA backend")
def test_cpu_only_build_says_so():
    with pytest.raises(msa.Error, match="built without the CUDA backend"):
        msa.index_workspace_bytes(1, 1, 1)


@pytest.mark.skipif(not msa.has_cuda, reason="this build has no CUDA backend")
def test_index_workspace_room_for_nvfp4_prefill_keys():
    scores = msa.index_workspace_bytes(4096, 1, 100)
    assert scores == 4096 * 100 * 4
    assert msa.index_workspace_bytes(4096, 1, 100, index_dtype="bf16", num_prefill_requests=3) == scores
    assert msa.index_workspace_bytes(4096, 1, 100, index_dtype="nvfp4", num_prefill_requests=3) == \
        scores + 3 * 100 * 128 * 128 * 2
    with pytest.raises(msa.Error, match="num_prefill_requests"):
        msa.index_workspace_bytes(4096, 1, 100, index_dtype="nvfp4", num_prefill_requests=-1)


def test_minimax_m3_numbers():
    m = msa.minimax_m3(4)
    assert (m["num_q_heads"], m["num_kv_heads"], m["topk"], m["block_size"]) == (16, 1, 16, 128)
