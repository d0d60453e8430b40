"""The CUDA backend through Python (marker gpu; skipped without a CUDA device or without the
CUDA backend in this build): torch CUDA tensors against the C++ CPU engine, a decode step
captured in a torch.cuda.CUDAGraph and replayed with changed inputs, and the adapter's forward
against the CPU engine."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import reference as ref  # noqa: E402
from scenario import LayerStep  # noqa: E402
from test_engine_equal import CASES, MIXED, run_python_step  # noqa: E402

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_step_against_cpu_engine(case):
    """insert bit-identical to the CPU engine; the top-k valid against float64 block scores; the
    output and lse within the contract's bounds of the CPU engine's attend over the same top-k."""
    spec = dict(requests=MIXED, decode_threshold=2, seed=21 + len(case), num_threads=2, **CASES[case])
    cpu = msa._msa.testing.reference_step(spec)
    gpu = run_python_step(cpu, spec, "cuda")
    assert np.array_equal(gpu["kv"], cpu["kv_after"]), "KV cache after insert_kv"
    for name in ("k_scales", "v_scales"):
        assert np.array_equal(gpu[name].view(np.uint32), cpu[name + "_after"].view(np.uint32)), name
    assert np.array_equal(gpu["index"], cpu["index_after"]), "index cache after insert_index"

    H, K, T = cpu["num_kv_heads"], cpu["topk"], cpu["num_tokens"]
    topk = gpu["topk"].view(np.int32).reshape(T, H, K)
    index_dtype = spec.get("index_dtype", "bf16")
    index_cache = cpu["index_after"].view(np.uint16 if index_dtype == "bf16" else np.uint8).reshape(-1, 128, 128)
    table = cpu["index_block_table"].reshape(len(cpu["seq_lens"]), -1)
    iq = ref.decode(cpu["index_q"].view(np.uint16), "bf16" if cpu["src_dtype"] == "bf16" else "fp16")
    iq = iq.reshape(T, H, 128)
    qs, sl = cpu["query_start"], cpu["seq_lens"]
    for r in range(len(sl)):
        ik = ref.decode(index_cache[table[r, : -(-sl[r] // 128)]].reshape(-1, 128), index_dtype)
        for t in range(qs[r], qs[r + 1]):
            p = sl[r] - (qs[r + 1] - qs[r]) + (t - qs[r])
            for h in range(H):
                ref.check_selection(topk[t, h], ref.block_scores(iq[t, h], ik, p), K, spec.get("init_blocks", 0),
                                    spec.get("local_blocks", 1))

    # The CPU engine's attend over the GPU's top-k.
    want = run_python_step(cpu, spec, "numpy", topk_override=topk)
    QH = cpu["num_q_heads"]
    dt = "bf16" if cpu["out_dtype"] == "bf16" else "fp16"
    got_out = ref.decode(gpu["out"].view(np.uint16), dt).reshape(T, QH, 128)
    want_out = ref.decode(want["out"].view(np.uint16), dt).reshape(T, QH, 128)
    worst = max(ref.rel_frobenius(got_out[t], want_out[t]) for t in range(T))
    assert worst < 1e-2, worst
    assert np.abs(gpu["lse"].view(np.float32) - want["lse"].view(np.float32)).max() < 1e-3


# Decodes with one draft token each (query length 2), MiniMax-M3 TP4 shapes.
DECODES = [(2, 1000), (2, 3000), (2, 255), (2, 129), (2, 4000), (2, 60), (2, 2047), (2, 777)]


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "nvfp4"])
def test_decode_step_graph_capture_and_replay(kv_dtype):
    """insert + index + forward captured once; each replay after new queries, keys, sequence
    lengths and block-table entries are written into the same buffers matches float64."""
    s = LayerStep("cuda", requests=DECODES, kv_dtype=kv_dtype, seed=13, spare_pages=64)
    md = s.build()
    s.run(md)  # eager: loads the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s.run(md)
    previous = None
    for i in range(3):
        s.advance(md, np.random.default_rng(100 + i))  # the next step's inputs, in place
        s.output[: s.T].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err_out, err_lse = s.check()
        assert err_out < 1e-2 and err_lse < 1e-3, (i, err_out, err_lse)
        now = s.output[: s.T].clone()
        assert previous is None or not torch.equal(now, previous)
        previous = now


@pytest.mark.parametrize("kv_dtype,layout,query_fp8", [
    ("bf16", "HND", False), ("bf16", "NHD", False), ("fp8_e4m3", "split", True), ("nvfp4", "HND", False)])
def test_adapter_forward_against_cpu_engine(kv_dtype, layout, query_fp8):
    """The same engine step through msa.engine on the GPU and on the CPU engine (a mixed step:
    decodes with a draft token, chunked prefills), run on a side stream."""
    requests = [(2, 700), (2, 2000), (2, 130), (300, 1000), (129, 0)]
    gpu = LayerStep("cuda", requests=requests, kv_dtype=kv_dtype, layout=layout, query_fp8=query_fp8, seed=17)
    cpu = LayerStep("cpu", requests=requests, kv_dtype=kv_dtype, layout=layout, query_fp8=query_fp8, seed=17)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the cached context was inserted on the default stream
    with torch.cuda.stream(side):
        md = gpu.run()
    side.synchronize()
    cpu.run()
    assert md.plan is not None and md.plan.info()["num_tokens"] == gpu.T
    as_bytes = lambda t: t.cpu().contiguous().view(torch.uint8)  # noqa: E731
    assert torch.equal(as_bytes(gpu.kv_cache), as_bytes(cpu.kv_cache)), "insert differs from the CPU engine"
    err_out, err_lse = gpu.check()
    assert err_out < 1e-2 and err_lse < 1e-3
    same = (gpu.topk_buffer.cpu() == cpu.topk_buffer).all(dim=-1).all(dim=-1)
    assert same.float().mean() > 0.95, same.float().mean()
    g = gpu.output.cpu().float()[: gpu.T][same[: gpu.T]]
    c = cpu.output.float()[: cpu.T][same[: cpu.T]]
    rows = [ref.rel_frobenius(a.numpy(), b.numpy()) for a, b in zip(g, c)]
    assert max(rows) < 1e-2, max(rows)


def test_cuda_errors():
    s = LayerStep("cuda", requests=[(1, 300)], seed=2)
    md = s.build()
    T = s.T
    q = s.query[:T].view(T, 16, 128)
    out = s.output[:T].view(T, 16, 128)
    with pytest.raises(msa.Error, match="plan: attend on a CUDA device needs the plan"):
        msa.attend(md.step, q, s.cache(), s.block_table, s.topk_buffer[:T], out)
    with pytest.raises(msa.Error, match="the arrays of one call must be on one device"):
        msa.attend(md.step, q, s.cache(), s.block_table.cpu(), s.topk_buffer[:T], out, plan=md.plan)
    other = msa.build_step([0, 2], [300], device="cuda")
    with pytest.raises(msa.Error, match="the plan is for"):
        msa.attend(other, s.query[:2].view(2, 16, 128), s.cache(), s.block_table, s.topk_buffer[:2],
                   s.output[:2].view(2, 16, 128), plan=md.plan)
