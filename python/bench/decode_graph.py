"""The CUDA-graph replay of a decode step's attention through the Python API (msa.engine's
forward on torch tensors), timed as `msa bench` times the same case through the C++ API, and the
two medians side by side.

Both sides: MiniMax-M3 per-rank heads, `batch` requests of `context` cached tokens and
`query_len` new ones, synthetic top-k lists (the lead block plus blocks drawn uniformly over the
eligible ones, as `msa bench --pattern random`), bf16 queries and output; `copies` input sets
(own top-k lists, own block tables, own physical pages for the selected blocks; unselected blocks
map to one shared page attention never reads), together at least 4x the L2, one graph per copy,
replay i runs copy i % copies; a GPU spin queued first so that the replays run back to back and
the event pair around each measures GPU time; warm-up replays, then the median.

    python python/bench/decode_graph.py                      # the default cases, msa from PATH
    python python/bench/decode_graph.py --msa build-gpu/msa --case 16/1:bf16:32768:32:1

Prints one line per case and writes JSON with --json. Needs a CUDA build of msa and a GPU."""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np
import torch

import msa
from msa.engine import MsaAttentionImpl, MsaMetadataBuilder

# heads / kv dtype / context / batch / query length
DEFAULT_CASES = ["16/1:bf16:32768:32:1", "16/1:bf16:8192:1:1", "16/1:bf16:32768:64:2", "64/4:bf16:32768:32:1",
                 "16/1:fp8_e4m3:32768:32:1", "16/1:nvfp4:32768:32:1"]


def parse_case(text):
    heads, dtype, ctx, batch, q = text.split(":")
    qh, kvh = (int(x) for x in heads.split("/"))
    return dict(num_q_heads=qh, num_kv_heads=kvh, kv_dtype=dtype, context=int(ctx), batch=int(batch), query_len=int(q))


def bench_name(c):
    """The case's name in `msa bench` (BenchCase::name)."""
    mode = "verify" if c["query_len"] > 1 else "decode"
    ctx = f"{c['context'] // 1024}K" if c["context"] % 1024 == 0 else str(c["context"])
    return (f"attend {mode} {c['num_q_heads']}/{c['num_kv_heads']} {c['kv_dtype']} ctx={ctx} b={c['batch']} "
            f"q={c['query_len']}")


def random_topk(rng, c, topk=16):
    """[batch * query_len, num_kv_heads, topk]: each row its own block, then distinct blocks drawn
    uniformly over the eligible ones (the rows of a request share most of them), ascending."""
    T, H = c["batch"] * c["query_len"], c["num_kv_heads"]
    out = np.full((T, H, topk), -1, np.int32)
    seq = c["context"] + c["query_len"]
    for r in range(c["batch"]):
        for h in range(H):
            first_last = c["context"] // 128
            base = list(rng.choice(first_last, size=min(topk - 1, first_last), replace=False)) if first_last else []
            for i in range(c["query_len"]):
                last = (seq - c["query_len"] + i) // 128
                row = {last}
                for b in base:
                    if len(row) >= min(topk, last + 1):
                        break
                    row.add(int(rng.integers(0, last + 1)) if rng.random() < 0.25 else int(b))
                while len(row) < min(topk, last + 1):
                    row.add(int(rng.integers(0, last + 1)))
                ids = sorted(row)
                out[r * c["query_len"] + i, h, : len(ids)] = ids
    return out


def map_pages(topk, c, first_page):
    """The copy's block table: selected blocks on pages of their own from first_page + 1 on,
    every other block on first_page. Returns (table, pages used)."""
    blocks = -(-(c["context"] + c["query_len"]) // 128)
    table = np.full((c["batch"], blocks), first_page, np.int32)
    pages = 1
    q = c["query_len"]
    for r in range(c["batch"]):
        used = sorted({int(b) for b in topk[r * q:(r + 1) * q].reshape(-1) if b >= 0})
        for b in used:
            table[r, b] = first_page + pages
            pages += 1
    return table, pages


def time_replays(launch, copies, warmup, replays):
    """Milliseconds of each timed replay (events around each, queued behind a GPU spin)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # about 0.1 s at H200 clocks: the host queues everything meanwhile
    for i in range(warmup):
        launch(i % copies)
    for i in range(replays):
        starts[i].record()
        launch((warmup + i) % copies)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def python_case(c, seed, warmup, replays, l2_bytes):
    dev = torch.device("cuda")
    rng = np.random.default_rng(seed)
    T, H, QH = c["batch"] * c["query_len"], c["num_kv_heads"], c["num_q_heads"]
    kv_dtype = c["kv_dtype"]
    page_bytes = (2 * 128 * 72 if kv_dtype == "nvfp4" else 2 * 128 * 128 * msa._msa.dtype_bytes(kv_dtype)) * H
    topk0 = random_topk(rng, c)
    step_bytes = page_bytes * (map_pages(topk0, c, 0)[1] - 1)
    copies = min(64, max(2, math.ceil(4 * l2_bytes / step_bytes)))
    lists, tables, first = [topk0], [], 0
    for i in range(copies):
        if i:
            lists.append(random_topk(rng, c))
        table, pages = map_pages(lists[i], c, first)
        tables.append(table)
        first += pages
    kv_cache = msa.engine.MsaAttentionBackend.allocate_kv_cache(first, H, kv_dtype, "HND", device=dev)
    if kv_dtype == "nvfp4":  # per slot: 128 x 64 random code bytes, then 128 x 8 group scales (e4m3 1.0)
        slots = kv_cache.reshape(first, 2 * H, 128 * 72)
        slots[..., : 128 * 64].random_(0, 256)
        slots[..., 128 * 64:].fill_(0x38)
    elif kv_dtype.startswith("fp8"):
        kv_cache.view(torch.uint8).random_(0, 256).bitwise_and_(0xBF)  # finite codes of magnitude < 2
    else:
        kv_cache.normal_()
    scale = 1.0 / 64 if kv_dtype == "nvfp4" else 1.0

    qsl = torch.arange(0, T + 1, c["query_len"], dtype=torch.int32)
    seq_lens = torch.full((c["batch"],), c["context"] + c["query_len"], dtype=torch.int32)
    builder = MsaMetadataBuilder(QH, H, kv_cache_dtype=kv_dtype, device=dev)
    impl = MsaAttentionImpl(QH, 128, msa.DEFAULT_SOFTMAX_SCALE, H, kv_dtype, topk_blocks=16)
    slot_mapping = torch.full((T,), -1, dtype=torch.int64, device=dev)
    md = builder.build(qsl, seq_lens, torch.from_numpy(tables[0]).to(dev), slot_mapping, c["batch"],
                       decode_query_len=c["query_len"])
    query = torch.randn(T, QH * 128, dtype=torch.bfloat16, device=dev)
    output = torch.empty_like(query)
    mds = [replace(md, block_table=torch.from_numpy(t).to(dev)) for t in tables]
    topks = [torch.from_numpy(t).to(dev) for t in lists]

    def forward(i):
        impl.forward(query, kv_cache, output, topks[i], mds[i], k_scale=scale, v_scale=scale)

    forward(0)
    torch.cuda.synchronize()
    graphs = []
    for i in range(copies):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward(i)
        graphs.append(g)
    time.sleep(1.0)  # start from an idle GPU, as msa bench does (--settle-ms 1000)
    ms = time_replays(lambda i: graphs[i].replay(), copies, warmup, replays)
    return dict(median_us=float(np.median(ms)) * 1e3, min_us=float(np.min(ms)) * 1e3, copies=copies,
                replays=replays, plan=md.plan.info())


def cpp_case(msa_cmd, c, warmup, replays):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        cmd = [msa_cmd, "bench", "--case", bench_name(c), "--iters", str(replays), "--warmup", str(warmup),
               "--ceiling-replays", "1", "--json", path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            cases = json.load(f)["cases"]
    match = [x for x in cases if x["name"] == bench_name(c)]
    if not match or "error" in match[0]:
        raise RuntimeError(f"msa bench: no result for {bench_name(c)}: {match}")
    t = match[0]["time_us"]
    return dict(median_us=t["median"], min_us=t["min"], copies=match[0]["copies"], replays=t["replays"],
                graph=match[0]["graph"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append",
                    help="HEADS:KV_DTYPE:CONTEXT:BATCH:QUERY_LEN, e.g. 16/1:bf16:32768:32:1 (repeatable)")
    ap.add_argument("--msa", default=shutil.which("msa"), help="the msa command (default: msa on PATH)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    o = ap.parse_args()
    if not (msa.has_cuda and torch.cuda.is_available()):
        sys.exit("decode_graph: needs msa built with CUDA and a GPU")
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (50 << 20)
    rows = []
    print(f"{'case':52} {'python us':>10} {'msa bench us':>13} {'ratio':>7}  copies")
    for text in o.case or DEFAULT_CASES:
        c = parse_case(text)
        py = python_case(c, o.seed, o.warmup, o.replays, l2)
        cpp = cpp_case(o.msa, c, o.warmup, o.replays) if o.msa else None
        ratio = py["median_us"] / cpp["median_us"] if cpp else float("nan")
        print(f"{bench_name(c):52} {py['median_us']:10.2f} {cpp['median_us'] if cpp else float('nan'):13.2f} "
              f"{ratio:7.3f}  {py['copies']}/{cpp['copies'] if cpp else '-'}", flush=True)
        rows.append(dict(case=bench_name(c), python=py, msa_bench=cpp, ratio=ratio))
    if o.json:
        with open(o.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), cases=rows), f, indent=1)


if __name__ == "__main__":
    main()
