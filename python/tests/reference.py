"""An independent float64 reference of one sparse layer, in numpy: decoders of the stored
formats, dense K / V read back from a paged cache, block scores, and dense masked attention."""

import numpy as np

BLOCK = 128
D = 128


# ---- decoders of the stored formats (exact) ----------------------------------------------------
def bf16_to_f64(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _minifloat_table(exp_bits, man_bits, bias, e4m3fn):
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    m = codes & ((1 << man_bits) - 1)
    normal = (1.0 + m / (1 << man_bits)) * np.exp2(e - bias)
    sub = (m / (1 << man_bits)) * np.exp2(1 - bias)
    v = sign * np.where(e == 0, sub, normal)
    if e4m3fn:
        v[(codes & 0x7F) == 0x7F] = np.nan
    else:
        top = e == (1 << exp_bits) - 1
        v[top & (m == 0)] = sign[top & (m == 0)] * np.inf
        v[top & (m != 0)] = np.nan
    return v


E4M3 = _minifloat_table(4, 3, 7, True)
E5M2 = _minifloat_table(5, 2, 15, False)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def decode(raw, dtype):
    """float64 values of stored elements (raw: uint16 for bf16 / fp16, uint8 for fp8)."""
    if dtype == "bf16":
        return bf16_to_f64(raw)
    if dtype == "fp16":
        return np.asarray(raw, dtype=np.uint16).view(np.float16).astype(np.float64)
    if dtype == "fp8_e4m3":
        return E4M3[np.asarray(raw, dtype=np.uint8)]
    if dtype == "fp8_e5m2":
        return E5M2[np.asarray(raw, dtype=np.uint8)]
    if dtype == "f32":
        return np.asarray(raw, dtype=np.float32).astype(np.float64)
    raise ValueError(dtype)


def nvfp4_slot(slot_bytes, global_scale):
    """[128, 128] float64 values of one head-slot (128 x 64 code bytes, then 128 x 8 e4m3 scales)."""
    data = slot_bytes[: BLOCK * 64].reshape(BLOCK, 64)
    scales = E4M3[slot_bytes[BLOCK * 64:].reshape(BLOCK, 8)]
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(BLOCK, D)
    return E2M1[codes] * np.repeat(scales, 16, axis=1) * global_scale


# ---- dense K / V of one request from the paged cache -------------------------------------------
def dense_kv(cache, kv_dtype, table_row, seq_len, head, *, k_scale=1.0, v_scale=1.0, k_scales=None,
             v_scales=None):
    """K, V [seq_len, 128] float64 of one KV head. cache: the logical array (numpy) as msa takes
    it: [P, H, 128, 256] (any strides), [P, 2, 128, H, 128] (split) or nvfp4 [P, 2H, 128, 72]."""
    nblocks = -(-seq_len // BLOCK)
    ks, vs = [], []
    for b in range(nblocks):
        page = int(table_row[b])
        if kv_dtype == "nvfp4":
            page_bytes = np.ascontiguousarray(cache[page]).reshape(-1)
            slot = BLOCK * 72
            ks.append(nvfp4_slot(page_bytes[(2 * head) * slot:(2 * head + 1) * slot], k_scale))
            vs.append(nvfp4_slot(page_bytes[(2 * head + 1) * slot:(2 * head + 2) * slot], v_scale))
            continue
        if cache.ndim == 5:
            kraw, vraw = cache[page, 0, :, head, :], cache[page, 1, :, head, :]
        else:
            kraw, vraw = cache[page, head, :, :D], cache[page, head, :, D:]
        k, v = decode(kraw, kv_dtype), decode(vraw, kv_dtype)
        if kv_dtype.startswith("fp8"):
            if k_scales is not None:
                rows = page * BLOCK + np.arange(BLOCK)
                k = k * k_scales[rows, head][:, None].astype(np.float64)
                v = v * v_scales[rows, head][:, None].astype(np.float64)
            else:
                k, v = k * k_scale, v * v_scale
        ks.append(k)
        vs.append(v)
    return np.concatenate(ks)[:seq_len], np.concatenate(vs)[:seq_len]


# ---- the operations in float64 -----------------------------------------------------------------
def block_scores(iq, ik, p):
    """Scores of blocks 0..p // 128 for one (token, KV head): max over the visible keys j <= p of
    each block of iq . ik_j. iq [128], ik [>= p + 1, 128] float64."""
    dots = ik[: p + 1] @ iq
    last = p // BLOCK
    return np.array([dots[b * BLOCK:min((b + 1) * BLOCK, p + 1)].max() for b in range(last + 1)])


def check_selection(row, scores, topk, init_blocks=0, local_blocks=1, tol=1e-3):
    """Asserts that a top-k row follows the contract against float64 scores: ascending distinct
    valid ids, then -1; min(topk, last + 1) of them; forced blocks in; no left-out block
    outscores a selected unforced one beyond `tol` (relative to the score scale)."""
    last = len(scores) - 1
    n = min(topk, last + 1)
    ids = [int(x) for x in row]
    assert all(x == -1 for x in ids[n:]), ids
    sel = ids[:n]
    assert sel == sorted(set(sel)) and all(0 <= x <= last for x in sel), ids
    forced = {b for b in range(last + 1) if b < init_blocks or b > last - local_blocks}
    assert forced <= set(sel) or len(forced) > n, (forced, sel)
    free_sel = [b for b in sel if b not in forced]
    left = [b for b in range(last + 1) if b not in sel]
    if free_sel and left:
        scale = max(1.0, float(np.abs(scores).max()))
        assert scores[left].max() <= scores[free_sel].min() + tol * scale, (scores[left].max(), scores[free_sel].min())


def attend_row(q, k, v, ids, p, scale):
    """Output [G, 128] and natural-log lse [G] of the query heads q [G, 128] of one (token, KV
    head) over the keys j <= p of the blocks `ids` (-1 entries skipped); k, v [seq_len, 128]."""
    keys = [j for b in ids if b >= 0 for j in range(b * BLOCK, min((b + 1) * BLOCK, p + 1, len(k)))]
    if not keys:
        return np.zeros((q.shape[0], D)), np.full(q.shape[0], -np.inf)
    s = (q @ k[keys].T) * scale
    m = s.max(axis=1, keepdims=True)
    w = np.exp(s - m)
    z = w.sum(axis=1, keepdims=True)
    return (w / z) @ v[keys], (m + np.log(z))[:, 0]


def rel_frobenius(got, want):
    den = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (den if den > 0 else 1.0)
