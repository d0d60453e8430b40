"""One engine step of one MiniMax-M3 sparse attention layer through msa's engine adapter, with
torch tensors: a TP4 rank (16 query heads, 1 KV head, head_dim 128, top-16 blocks of 128 tokens).

The step is decode-first: 4 decode requests with one speculative draft token each (query length
2) at cached contexts of 1.2K-8K tokens, then a chunked prefill of 256 new tokens on a 4K cached
context. The caches' physical pages are shuffled; the cached context is written through the
insert operation first. Then the step: insert the new K / V / index keys, index (block scores and
top-k), attend. On a CUDA device (when msa was built with CUDA) it runs there, else on the CPU
engine. Sampled rows are checked against float64 dense attention over the selected blocks.

    python examples/python/minimax_m3_step.py [--device cpu|cuda] [--kv-dtype bf16|fp8_e4m3|nvfp4]
"""

import argparse
import math
import sys
import time

import torch

import msa
from msa.engine import MsaAttentionBackend, MsaAttentionImpl, MsaMetadataBuilder

BLOCK = msa.BLOCK_SIZE


def main():
    ap = argparse.ArgumentParser(description="one MiniMax-M3 sparse layer step through msa.engine")
    ap.add_argument("--device", default="cuda" if msa.has_cuda and torch.cuda.is_available() else "cpu")
    ap.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "nvfp4"])
    ap.add_argument("--layout", default="HND", choices=["HND", "NHD", "split"])
    ap.add_argument("--seed", type=int, default=0)
    o = ap.parse_args()
    torch.manual_seed(o.seed)
    dev = torch.device(o.device)

    m = msa.minimax_m3(tp=4)
    QH, H, K, D = m["num_q_heads"], m["num_kv_heads"], m["topk"], m["head_dim"]
    model_dtype = torch.float16 if o.kv_dtype == "fp16" else torch.bfloat16
    requests = [(2, 3000), (2, 5000), (2, 1200), (2, 8000), (256, 4096)]  # (new tokens, cached tokens)
    num_decodes = 4

    # Caches: one page = one block of 128 tokens; pages handed out in a shuffled order.
    blocks = [math.ceil((q + c) / BLOCK) for q, c in requests]
    num_pages = sum(blocks) + 16
    order = torch.randperm(num_pages).tolist()
    max_blocks = max(blocks)
    table = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
    for r, b in enumerate(blocks):
        table[r, :b] = torch.tensor(order[:b])
        del order[:b]
    kv_cache = MsaAttentionBackend.allocate_kv_cache(num_pages, H, o.kv_dtype, o.layout, device=dev,
                                                     model_dtype=model_dtype)
    index_cache = torch.zeros(MsaAttentionBackend.get_index_cache_shape(num_pages), dtype=model_dtype, device=dev)
    scale = {"fp8_e4m3": 1 / 16, "fp8_e5m2": 1 / 16, "nvfp4": 1 / 64}.get(o.kv_dtype, 1.0)
    block_table = table.to(dev)

    def slots(r, first, n):
        pos = torch.arange(first, first + n)
        return (table[r, pos // BLOCK].long() * BLOCK + pos % BLOCK)

    # The cached context, written through insert: K, V and index keys (a per-block direction plus
    # noise, so that neighbouring queries prefer the same blocks, as a model's do).
    bias = [torch.randn(b, D) for b in blocks]
    ctx_k, ctx_v = [], []
    for r, (q, c) in enumerate(requests):
        ctx_k.append(torch.randn(c, H, D))
        ctx_v.append(torch.randn(c, H, D))
    ctx_slots = torch.cat([slots(r, 0, c) for r, (q, c) in enumerate(requests)]).to(dev)
    ctx_ik = torch.cat([bias[r][torch.arange(c) // BLOCK] + 0.5 * torch.randn(c, D)
                        for r, (q, c) in enumerate(requests)])
    cache = msa.KVCache(kv_cache, o.kv_dtype, scale, scale)
    msa.insert_kv(cache, torch.cat(ctx_k).to(model_dtype).to(dev), torch.cat(ctx_v).to(model_dtype).to(dev), ctx_slots)
    msa.insert_index(index_cache, ctx_ik.to(model_dtype).to(dev), ctx_slots)

    # The step's inputs, as an engine holds them.
    T = sum(q for q, _ in requests)
    query_start_loc = torch.tensor([0] + [sum(q for q, _ in requests[: i + 1]) for i in range(len(requests))],
                                   dtype=torch.int32)
    seq_lens = torch.tensor([q + c for q, c in requests], dtype=torch.int32)
    slot_mapping = torch.cat([slots(r, c, q) for r, (q, c) in enumerate(requests)]).to(dev)
    new_k, new_v = torch.randn(T, H * D), torch.randn(T, H * D)
    index_k = torch.cat([bias[r][torch.arange(c, c + q) // BLOCK] + 0.5 * torch.randn(q, D)
                         for r, (q, c) in enumerate(requests)])
    index_q = torch.cat([bias[r][-1].expand(q, D) for r, (q, _) in enumerate(requests)])[:, None, :]
    index_q = index_q + 0.3 * torch.randn(T, H, D)
    query = torch.randn(T, QH * D)
    to = lambda t: t.to(model_dtype).to(dev)  # noqa: E731
    new_k, new_v, index_k, index_q, query = map(to, (new_k, new_v, index_k, index_q, query))
    topk_buffer = torch.full((T, H, K), -1, dtype=torch.int32, device=dev)
    output = torch.empty(T, QH * D, dtype=model_dtype, device=dev)

    # One step: metadata (with the CUDA plan), then insert, index, attend.
    builder = MsaMetadataBuilder(QH, H, topk=K, kv_cache_dtype=o.kv_dtype, model_dtype=model_dtype, device=dev)
    impl = MsaAttentionImpl(QH, D, m["softmax_scale"], H, o.kv_dtype, topk_blocks=K, model_dtype=model_dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = {}

    def stage(name, fn):
        sync()
        t0 = time.perf_counter()
        result = fn()
        sync()
        times[name] = time.perf_counter() - t0
        return result

    md = stage("metadata", lambda: builder.build(query_start_loc, seq_lens, block_table, slot_mapping, num_decodes))
    stage("insert", lambda: impl.insert(new_k, new_v, index_k, kv_cache, index_cache, md, k_scale=scale, v_scale=scale))
    stage("index", lambda: impl.index(index_q, index_cache, topk_buffer, md))
    stage("attend", lambda: impl.forward(query, kv_cache, output, topk_buffer, md, k_scale=scale, v_scale=scale))

    print(f"MiniMax-M3 sparse layer, TP4 rank: {QH} query heads / {H} KV head, top-{K} blocks of {BLOCK} tokens")
    print(f"device {dev}, KV cache {o.kv_dtype} {o.layout} ({num_pages} pages), {md.step!r}")
    for name, s in times.items():
        print(f"  {name:9} {s * 1e3:8.2f} ms")

    # float64 check of sampled rows: dense attention over the selected blocks of the K / V the
    # step wrote (the values as given, so only for the lossless bf16 / fp16 caches).
    if o.kv_dtype not in ("bf16", "fp16"):
        print("check skipped: a quantized cache holds other values than the ones written")
        return 0
    keys = [torch.cat([ctx_k[r], new_k.cpu().double()[query_start_loc[r]:query_start_loc[r + 1]].view(-1, H, D)])
            for r in range(len(requests))]
    vals = [torch.cat([ctx_v[r], new_v.cpu().double()[query_start_loc[r]:query_start_loc[r + 1]].view(-1, H, D)])
            for r in range(len(requests))]
    worst = 0.0
    topk, out, q64 = topk_buffer.cpu(), output.cpu().double().view(T, QH, D), query.cpu().double().view(T, QH, D)
    rows = list(range(2 * num_decodes)) + list(range(2 * num_decodes, T, 17))
    for t in rows:
        r = int(torch.searchsorted(query_start_loc, t, right=True)) - 1
        p = int(seq_lens[r]) - (int(query_start_loc[r + 1]) - int(query_start_loc[r])) + t - int(query_start_loc[r])
        ids = [b for b in topk[t, 0].tolist() if b >= 0]
        assert p // BLOCK in ids, f"token {t}: its own block {p // BLOCK} is not selected"
        j = torch.tensor([x for b in ids for x in range(b * BLOCK, min(b * BLOCK + BLOCK, p + 1))])
        k, v = keys[r].double()[j, 0], vals[r].double()[j, 0]
        w = torch.softmax(q64[t] @ k.T * m["softmax_scale"], dim=-1)
        want = w @ v
        worst = max(worst, float((out[t] - want).norm() / want.norm()))
    ok = worst < 1e-2
    print(f"check: {len(rows)} rows against float64 attention, max relative error {worst:.2e} (bound 1e-2): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
