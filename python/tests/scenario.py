"""One engine step of one sparse layer driven through msa.engine, as an engine would: caches
allocated by the backend, the cached context written through the insert operations on shuffled
physical pages, the step's inputs in padded engine buffers (more rows than the step's tokens),
and the float64 check of what the step wrote."""

import numpy as np
import torch

import msa
from msa.engine import MsaAttentionBackend, MsaAttentionImpl, MsaMetadataBuilder
import reference as ref

PAD = 5  # engine buffers hold this many rows past the step's tokens


def to_numpy(t, raw_dtype=None):
    """A host numpy copy of a tensor; bf16 as uint16 bits, float8 as uint8 codes."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def index_keys(rng, n, first, block_bias):
    """Index keys of positions first..first+n-1: a per-block direction plus noise, so that
    neighbouring queries prefer mostly the same blocks."""
    pos = np.arange(first, first + n)
    return block_bias[pos // 128] + 0.5 * rng.standard_normal((n, 128))


class LayerStep:
    def __init__(self, device, *, requests, num_q_heads=16, num_kv_heads=1, kv_dtype="bf16", layout="HND", topk=16,
                 query_fp8=False, init_blocks=0, local_blocks=1, seed=0, spare_pages=7):
        """requests: [(query_len, context_len)], decodes first (query_len 1 + draft tokens);
        spare_pages: free pages for the blocks later steps need (advance)."""
        rng = np.random.default_rng(seed)
        self.device = torch.device(device)
        self.requests = requests
        H, QH = num_kv_heads, num_q_heads
        self.H, self.QH, self.topk = H, QH, topk
        self.kv_dtype, self.query_fp8 = kv_dtype, query_fp8
        qlens = [q for q, _ in requests]
        self.seq_lens = [q + c for q, c in requests]
        decode_len = qlens[0]
        self.num_decodes = 0
        while self.num_decodes < len(qlens) and qlens[self.num_decodes] == decode_len and decode_len <= 4:
            self.num_decodes += 1
        blocks = [-(-s // 128) for s in self.seq_lens]
        self.max_blocks = max(blocks) + 2
        num_pages = sum(blocks) + spare_pages
        perm = rng.permutation(num_pages)
        table = np.full((len(requests), self.max_blocks), -1, dtype=np.int32)
        used = 0
        for r, b in enumerate(blocks):
            table[r, :b] = perm[used:used + b]
            used += b
        self.table_np = table
        self.free_pages = list(perm[used:])
        dev = self.device
        self.k_scale = self.v_scale = 1.0 / 16 if kv_dtype.startswith("fp8") else 1.0
        if kv_dtype == "nvfp4":
            self.k_scale = self.v_scale = 1.0 / 64
        self.kv_cache = MsaAttentionBackend.allocate_kv_cache(num_pages, H, kv_dtype, layout, device=dev)
        self.index_cache = torch.zeros(MsaAttentionBackend.get_index_cache_shape(num_pages), dtype=torch.bfloat16,
                                       device=dev)
        self.block_table = torch.from_numpy(table).to(dev)
        self.impl = MsaAttentionImpl(QH, 128, msa.DEFAULT_SOFTMAX_SCALE, H, kv_dtype, topk_blocks=topk,
                                     init_blocks=init_blocks, local_blocks=local_blocks)
        self.builder = MsaMetadataBuilder(QH, H, topk=topk, kv_cache_dtype=kv_dtype, query_fp8=query_fp8, device=dev)

        # The cached context of every request, written through insert (one call per cache).
        self.block_bias = [rng.standard_normal((b, 128)) for b in blocks]
        ks, vs, iks, slots = [], [], [], []
        for r, (q, c) in enumerate(requests):
            pos = np.arange(c)
            slots.append(table[r, pos // 128].astype(np.int64) * 128 + pos % 128)
            ks.append(rng.standard_normal((c, H, 128)))
            vs.append(rng.standard_normal((c, H, 128)))
            iks.append(index_keys(rng, c, 0, self.block_bias[r]))
        bf = lambda a: torch.from_numpy(np.concatenate(a)).to(torch.bfloat16).to(dev)  # noqa: E731
        ctx_slots = torch.from_numpy(np.concatenate(slots)).to(dev)
        msa.insert_kv(self.cache(), bf(ks), bf(vs), ctx_slots)
        msa.insert_index(self.index_cache, bf(iks), ctx_slots)

        # The step's inputs, in padded engine buffers.
        T = sum(qlens)
        self.T = T
        qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        self.query_start_loc_cpu = torch.from_numpy(qsl)
        self.seq_lens_cpu = torch.tensor(self.seq_lens, dtype=torch.int32)
        new_slots, new_iks = [], []
        for r, (q, c) in enumerate(requests):
            pos = np.arange(c, c + q)
            new_slots.append(table[r, pos // 128].astype(np.int64) * 128 + pos % 128)
            new_iks.append(index_keys(rng, q, c, self.block_bias[r]))
        pad = lambda a: np.concatenate([a, np.zeros((PAD,) + a.shape[1:], a.dtype)])  # noqa: E731
        self.slot_mapping = torch.from_numpy(pad(np.concatenate(new_slots))).to(dev)
        self.k = torch.from_numpy(pad(rng.standard_normal((T, H * 128)))).to(torch.bfloat16).to(dev)
        self.v = torch.from_numpy(pad(rng.standard_normal((T, H * 128)))).to(torch.bfloat16).to(dev)
        self.index_k = torch.from_numpy(pad(np.concatenate(new_iks))).to(torch.bfloat16).to(dev)
        # Index queries drift along each request's blocks; every KV head has its own.
        iq = np.concatenate([np.repeat(self.block_bias[r][rng.integers(0, len(self.block_bias[r]), 1)], q, 0)
                             for r, (q, _) in enumerate(requests)])
        iq = iq[:, None, :] + 0.3 * rng.standard_normal((T, H, 128))
        self.index_q = torch.from_numpy(pad(iq)).to(torch.bfloat16).to(dev)
        self.query = torch.from_numpy(pad(rng.standard_normal((T, QH * 128)))).to(torch.bfloat16).to(dev)
        self.q_scale = 1.0 / 8
        self.query_fp8 = (self.query.float() / self.q_scale).to(torch.float8_e4m3fn) if query_fp8 else None
        self.topk_buffer = torch.full((T + PAD, H, topk), -7, dtype=torch.int32, device=dev)
        self.output = torch.full((T + PAD, QH * 128), float("nan"), dtype=torch.bfloat16, device=dev)
        self.lse = torch.full((T, QH), float("nan"), dtype=torch.float32, device=dev)

    def advance(self, md, rng):
        """The next decode step in the same buffers: the tokens the last step inserted become
        context, each request gets new positions (a new page where it enters a new block), new
        keys, values, queries and index queries; md's device seq_lens and host metadata follow."""
        new_slots, new_iks = [], []
        for r, (q, c) in enumerate(self.requests):
            c += q
            self.requests[r] = (q, c)
            self.seq_lens[r] = c + q
            for b in range(-(-(c + q) // 128)):
                if self.table_np[r, b] < 0:
                    self.table_np[r, b] = self.free_pages.pop()
                    self.block_table[r, b] = int(self.table_np[r, b])
                    self.block_bias[r] = np.concatenate([self.block_bias[r], rng.standard_normal((1, 128))])
            pos = np.arange(c, c + q)
            new_slots.append(self.table_np[r, pos // 128].astype(np.int64) * 128 + pos % 128)
            new_iks.append(index_keys(rng, q, c, self.block_bias[r]))
        T, H, QH = self.T, self.H, self.QH
        fill = lambda t, a: t[:T].copy_(torch.from_numpy(np.asarray(a)).to(t.dtype).view(t[:T].shape))  # noqa: E731
        fill(self.slot_mapping, np.concatenate(new_slots))
        fill(self.k, rng.standard_normal((T, H * 128)))
        fill(self.v, rng.standard_normal((T, H * 128)))
        fill(self.index_k, np.concatenate(new_iks))
        iq = np.concatenate([np.repeat(self.block_bias[r][-1:], q, 0) for r, (q, _) in enumerate(self.requests)])
        fill(self.index_q, iq[:, None, :] + 0.3 * rng.standard_normal((T, H, 128)))
        fill(self.query, rng.standard_normal((T, QH * 128)))
        if self.query_fp8 is not None:
            self.query_fp8.copy_((self.query.float() / self.q_scale).to(torch.float8_e4m3fn))
        self.lse.fill_(float("nan"))
        md.step.update_seq_lens(self.seq_lens)

    def cache(self):
        return msa.KVCache(self.kv_cache, self.kv_dtype, self.k_scale, self.v_scale)

    def build(self):
        return self.builder.build(self.query_start_loc_cpu, self.seq_lens_cpu, self.block_table, self.slot_mapping,
                                  self.num_decodes)

    def run(self, md=None):
        """insert, index, forward through the adapter; returns the metadata."""
        md = self.build() if md is None else md
        self.impl.insert(self.k, self.v, self.index_k, self.kv_cache, self.index_cache, md, k_scale=self.k_scale,
                         v_scale=self.v_scale)
        self.impl.index(self.index_q, self.index_cache, self.topk_buffer, md)
        self.impl.forward(self.query, self.kv_cache, self.output, self.topk_buffer, md, self.query_fp8,
                          q_scale=self.q_scale, k_scale=self.k_scale, v_scale=self.v_scale, lse=self.lse)
        return md

    # ---- the float64 check ----------------------------------------------------------------------
    def check(self, rows=None, out=None, lse=None, topk=None):
        """Every (or the given) token row against float64: the selection against the block scores
        of the index cache as it holds the keys, the output and lse against dense masked
        attention over the selected blocks of the KV cache as stored. Returns the worst errors."""
        cache = to_numpy(self.kv_cache)
        index_cache = ref.bf16_to_f64(to_numpy(self.index_cache))
        out = to_numpy(self.output if out is None else out)[: self.T].reshape(self.T, self.QH, 128)
        out = ref.decode(out, "bf16")
        lse = to_numpy(self.lse if lse is None else lse)
        topk = to_numpy(self.topk_buffer if topk is None else topk)
        if self.query_fp8 is not None:
            q_all = ref.decode(to_numpy(self.query_fp8)[: self.T], "fp8_e4m3") * self.q_scale
        else:
            q_all = ref.bf16_to_f64(to_numpy(self.query)[: self.T])
        q_all = q_all.reshape(self.T, self.QH, 128)
        G = self.QH // self.H
        worst_out = worst_lse = 0.0
        t0 = 0
        for r, (qlen, ctx) in enumerate(self.requests):
            s = self.seq_lens[r]
            dense = [ref.dense_kv(cache, self.kv_dtype, self.table_np[r], s, h, k_scale=self.k_scale,
                                  v_scale=self.v_scale) for h in range(self.H)]
            ik = index_cache[self.table_np[r, : -(-s // 128)]].reshape(-1, 128)
            for i in range(qlen):
                t = t0 + i
                if rows is not None and t not in rows:
                    continue
                p = s - qlen + i
                for h in range(self.H):
                    iq = ref.bf16_to_f64(to_numpy(self.index_q)[t, h])
                    ref.check_selection(topk[t, h], ref.block_scores(iq, ik, p), self.topk,
                                        self.impl.init_blocks, self.impl.local_blocks)
                    want, want_lse = ref.attend_row(q_all[t, h * G:(h + 1) * G], *dense[h], topk[t, h], p,
                                                    self.impl.scale)
                    worst_out = max(worst_out, ref.rel_frobenius(out[t, h * G:(h + 1) * G], want))
                    worst_lse = max(worst_lse, float(np.abs(lse[t, h * G:(h + 1) * G] - want_lse).max()))
            t0 += qlen
        return worst_out, worst_lse
