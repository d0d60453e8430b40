// One case of `msa check`. Each stage runs on the GPU with a DeviceCheck
// buffer, then the CPU engine runs on the very bytes the GPU produced (the
// downloaded caches, the GPU's block scores), so every stage is judged on its
// own even when an earlier one failed:
//  insert: cache bytes (and per-token scales) bit-identical to cpu::insert_*;
//  index:  scores close to cpu::block_scores on the GPU's index cache, and the
//          GPU's top-k bit-identical to cpu::select_row on the GPU's scores;
//  attend: out and lse close to cpu::attend on the GPU's cache and the same top-k;
//  pre-attention: q, index q and cache bytes identical to cpu::pre_attention's
//          (check_pre_attention.hpp).
#include "check_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <utility>

#include "check_compare.hpp"
#include "check_data.hpp"
#include "check_pre_attention.hpp"
#include "device_memory.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/select.hpp"
#include "rng.hpp"

namespace msa::tool {

namespace {

constexpr int kPoisonByte = 0x5A;  // caches start as this pattern on both sides
constexpr double kScoreBound = 1e-3;
// An e4m3 index query is scored on fp8 tensor cores, whose accumulation keeps
// fewer bits than fp32 (the bound of the GPU indexer tests).
constexpr double kFp8QueryScoreBound = 4e-3;
constexpr double kLseBound = 1e-3;

std::string what_of(const std::exception& e) { return e.what(); }

// Runs a GPU stage and reads its DeviceCheck. `error` is the stage's exception,
// `recorded` what the DeviceCheck holds (both empty when all is well).
struct Outcome {
  std::string error;
  std::string recorded;
  bool ok() const { return error.empty(); }
};

Outcome run_gpu(const std::function<void()>& stage, const cuda::DeviceCheck& check, cuda::Stream s) {
  Outcome o;
  try {
    cuda::reset_check(check, s);
    stage();
    sync_stream(s);
  } catch (const std::exception& e) {
    o.error = "GPU: " + what_of(e);
    return o;
  }
  try {
    cuda::read_check(check, s);
  } catch (const std::exception& e) {
    o.recorded = e.what();
  }
  return o;
}

std::vector<float> half_to_floats(const std::vector<std::uint16_t>& h, DType dtype) {
  std::vector<float> f(h.size());
  for (std::size_t i = 0; i < h.size(); ++i)
    f[i] = dtype == DType::bf16 ? num::bf16_to_float(h[i]) : num::fp16_to_float(h[i]);
  return f;
}

CheckRow row(const std::string& what, double error, double bound, const std::string& note) {
  CheckRow r;
  r.what = what;
  r.error = error;
  r.bound = bound;
  r.pass = error <= bound;  // NaN and inf fail
  r.note = r.pass ? std::string() : note;
  return r;
}

CheckRow failed_row(const std::string& what, double bound, const std::string& why) {
  CheckRow r;
  r.what = what;
  r.error = kInf;
  r.bound = bound;
  r.pass = false;
  r.note = why;
  return r;
}

std::string hex(double byte) {
  std::ostringstream s;
  s << "0x" << std::hex << int(byte);
  return s.str();
}

// Everything one case holds on the device and its host mirrors.
struct CaseState {
  CaseState(const CheckCase& c_, const CheckData& d_, cuda::Stream s_, cuda::DeviceCheck check_,
            std::vector<CheckRow>& rows_)
      : c(c_), d(d_), s(s_), check(check_), rows(rows_) {}

  const CheckCase& c;
  const CheckData& d;
  cuda::Stream s;
  cuda::DeviceCheck check;
  std::vector<CheckRow>& rows;
  std::vector<std::string> recorded;  // DeviceCheck reports, "stage: message"

  // GPU caches and the bytes downloaded after insert.
  DeviceBuffer cache, k_scales, v_scales, index_cache;
  std::vector<std::uint8_t> g_cache, g_index;
  std::vector<float> g_k_scales, g_v_scales;
  // Device copy of the step.
  DeviceBuffer step, table, index_table;
  StepView gstep;
  // The top-k the attention reads, chosen from the GPU's scores.
  std::vector<std::int32_t> topk;

  void note_check(const char* stage, const Outcome& o) {
    if (!o.recorded.empty()) recorded.push_back(std::string(stage) + ": " + o.recorded);
  }
  KVCacheView host_cache_view() {
    return main_cache_view(c, d, g_cache.data(), g_k_scales.data(), g_v_scales.data());
  }
};

void insert_stage(CaseState& st) {
  const CheckCase& c = st.c;
  const CheckData& d = st.d;
  st.cache = DeviceBuffer(std::size_t(d.cache_bytes));
  st.cache.fill_bytes(kPoisonByte);
  st.index_cache = DeviceBuffer(std::size_t(d.index_bytes));
  st.index_cache.fill_bytes(kPoisonByte);
  std::vector<std::uint8_t> h_cache(std::size_t(d.cache_bytes), kPoisonByte);
  std::vector<std::uint8_t> h_index(std::size_t(d.index_bytes), kPoisonByte);
  std::vector<float> h_ks(std::size_t(d.scale_count)), h_vs(std::size_t(d.scale_count));
  std::memset(h_ks.data(), kPoisonByte, h_ks.size() * sizeof(float));
  std::memset(h_vs.data(), kPoisonByte, h_vs.size() * sizeof(float));
  st.k_scales = DeviceBuffer(h_ks.size() * sizeof(float));
  st.v_scales = DeviceBuffer(h_vs.size() * sizeof(float));
  st.k_scales.fill_bytes(kPoisonByte);
  st.v_scales.fill_bytes(kPoisonByte);

  const DeviceBuffer k = to_device(d.k), v = to_device(d.v), ik = to_device(d.index_k);
  const DeviceBuffer slots = to_device(d.slots), islots = to_device(d.index_slots);
  const KVCacheView gview = main_cache_view(c, d, st.cache.get(), st.k_scales.as<float>(), st.v_scales.as<float>());
  const IndexCacheView gindex = index_cache_view(c, d, st.index_cache.get());
  const InsertKVArgs gkv{k.get(), v.get(), c.src_dtype, slots.as<std::int64_t>(), d.num_insert};
  const InsertIndexArgs gik{ik.get(), c.src_dtype, islots.as<std::int64_t>(), d.num_insert};
  const Outcome o = run_gpu(
      [&] {
        cuda::insert_kv(gview, gkv, st.s, st.check);
        cuda::insert_index(gindex, gik, st.s, st.check);
      },
      st.check, st.s);
  st.note_check("insert", o);

  std::string cpu_error;
  try {
    const KVCacheView hview = main_cache_view(c, d, h_cache.data(), h_ks.data(), h_vs.data());
    cpu::insert_kv(hview, InsertKVArgs{d.k.data(), d.v.data(), c.src_dtype, d.slots.data(), d.num_insert});
    cpu::insert_index(index_cache_view(c, d, h_index.data()),
                      InsertIndexArgs{d.index_k.data(), c.src_dtype, d.index_slots.data(), d.num_insert});
  } catch (const std::exception& e) {
    cpu_error = "CPU reference: " + what_of(e);
  }

  st.g_cache = to_host<std::uint8_t>(st.cache, std::size_t(d.cache_bytes));
  st.g_index = to_host<std::uint8_t>(st.index_cache, std::size_t(d.index_bytes));
  st.g_k_scales = to_host<float>(st.k_scales, h_ks.size());
  st.g_v_scales = to_host<float>(st.v_scales, h_vs.size());
  if (!o.ok() || !cpu_error.empty()) {
    const std::string why = o.ok() ? cpu_error : o.error;
    st.rows.push_back(failed_row("insert.kv", 0, why));
    st.rows.push_back(failed_row("insert.index", 0, why));
    return;
  }
  Diff kv = byte_mismatch(st.g_cache.data(), h_cache.data(), h_cache.size());
  std::string where = "cache byte " + std::to_string(kv.worst);
  const auto scale_bytes = h_ks.size() * sizeof(float);
  for (int side = 0; side < 2; ++side) {
    const auto* got = reinterpret_cast<const std::uint8_t*>(side ? st.g_v_scales.data() : st.g_k_scales.data());
    const auto* want = reinterpret_cast<const std::uint8_t*>(side ? h_vs.data() : h_ks.data());
    const Diff sd = byte_mismatch(got, want, scale_bytes);
    if (sd.count && kv.worst < 0) {
      kv = sd;
      where = std::string(side ? "v_scales" : "k_scales") + " byte " + std::to_string(sd.worst);
    } else {
      kv.count += sd.count;
    }
  }
  kv.error = double(kv.count);
  st.rows.push_back(row("insert.kv", kv.error, 0,
                        std::to_string(kv.count) + " bytes differ; first: " + where + " gpu " + hex(kv.got) +
                            " cpu " + hex(kv.want)));
  const Diff ix = byte_mismatch(st.g_index.data(), h_index.data(), h_index.size());
  st.rows.push_back(row("insert.index", ix.error, 0,
                        std::to_string(ix.count) + " bytes differ; first: index cache byte " +
                            std::to_string(ix.worst) + " gpu " + hex(ix.got) + " cpu " + hex(ix.want)));
}

void upload_step(CaseState& st) {
  const BatchMetadata& m = st.d.meta;
  st.step = DeviceBuffer(cuda::step_workspace_bytes(m));
  st.gstep = cuda::upload_step(m, {st.step.get(), st.step.bytes()}, st.s);
  st.table = to_device(st.d.block_table);
  st.index_table = to_device(st.d.index_table);
}

void index_stage(CaseState& st) {
  const CheckCase& c = st.c;
  const CheckData& d = st.d;
  const BatchMetadata& m = d.meta;
  const int H = c.num_kv_heads, K = c.topk;
  const std::int64_t T = m.num_tokens, nb = d.max_blocks;
  const DeviceBuffer iq = to_device(d.index_q);
  const DeviceBuffer topk = to_device(std::vector<std::int32_t>(std::size_t(T * H * K), -7));
  IndexerArgs gargs;
  gargs.cache = index_cache_view(c, d, st.index_cache.get());
  const std::size_t ws_bytes = cuda::index_workspace_bytes(std::int32_t(T), H, d.max_blocks, gargs.cache.dtype,
                                                           m.num_prefills);
  DeviceBuffer ws(std::max<std::size_t>(ws_bytes, std::size_t(T * H * nb) * sizeof(float)));
  ws.fill_bytes(0xFF);
  gargs.index_q = iq.get();
  gargs.iq_dtype = c.iq_dtype();
  gargs.num_kv_heads = H;
  gargs.init_blocks = 0;
  gargs.local_blocks = 1;
  gargs.block_table = block_table_view(d, st.index_table.as<std::int32_t>());
  gargs.out = TopkView::token_major(topk.as<std::int32_t>(), H, K);
  const Outcome o = run_gpu([&] { cuda::index(st.gstep, gargs, d.max_blocks, {ws.get(), ws_bytes}, st.s, st.check); },
                            st.check, st.s);
  st.note_check("index", o);
  const std::vector<float> g_scores = to_host<float>(ws, std::size_t(T * H * nb));
  const std::vector<std::int32_t> g_topk = to_host<std::int32_t>(topk, std::size_t(T * H * K));

  // The CPU's scores on the GPU's index cache.
  std::vector<float> c_scores(std::size_t(T * H * nb), 0.0f);
  std::string cpu_error;
  try {
    IndexerArgs hargs = gargs;
    hargs.index_q = d.index_q.data();
    hargs.cache = index_cache_view(c, d, st.g_index.data());
    hargs.block_table = block_table_view(d, d.index_table.data());
    hargs.out = TopkView{};
    cpu::block_scores(m.view(), hargs, c_scores.data(), d.max_blocks);
  } catch (const std::exception& e) {
    cpu_error = "CPU reference: " + what_of(e);
  }

  // Selection from the GPU's scores (the CPU's when the GPU stage failed).
  const std::vector<float>& basis = o.ok() ? g_scores : c_scores;
  st.topk.assign(std::size_t(T * H * K), -1);
  std::vector<float> got, want;
  std::int64_t bad_rows = 0;
  std::string first_bad;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t p = m.token_position[std::size_t(t)];
    for (int h = 0; h < H; ++h) {
      const std::int64_t r = t * H + h;
      std::int32_t* sel = st.topk.data() + r * K;
      if (p >= 0) {
        cpu::select_row(basis.data() + r * nb, p / kBlockSize, K, 0, 1, sel);
        got.insert(got.end(), g_scores.begin() + r * nb, g_scores.begin() + (r + 1) * nb);
        want.insert(want.end(), c_scores.begin() + r * nb, c_scores.begin() + (r + 1) * nb);
      }
      if (!std::equal(sel, sel + K, g_topk.begin() + r * K)) {
        if (bad_rows++ == 0) {
          std::ostringstream s;
          s << "row t=" << t << " h=" << h << " (p=" << p << "): gpu [";
          for (int k = 0; k < K; ++k) s << (k ? " " : "") << g_topk[std::size_t(r * K + k)];
          s << "] cpu [";
          for (int k = 0; k < K; ++k) s << (k ? " " : "") << sel[k];
          first_bad = s.str() + "]";
        }
      }
    }
  }
  const double score_bound = c.fp8_index_query ? kFp8QueryScoreBound : kScoreBound;
  if (!o.ok()) {
    st.rows.push_back(failed_row("index.scores", score_bound, o.error));
    st.rows.push_back(failed_row("index.topk", 0, o.error));
    return;
  }
  if (!cpu_error.empty()) {
    st.rows.push_back(failed_row("index.scores", score_bound, cpu_error));
  } else {
    const Diff sd = score_error(got, want);
    std::ostringstream s;
    s << sd.count << " scores differ; worst gpu " << sd.got << " cpu " << sd.want << " (entry " << sd.worst
      << " of the non-padding rows)";
    st.rows.push_back(row("index.scores", sd.error, score_bound, s.str()));
  }
  st.rows.push_back(row("index.topk", double(bad_rows), 0,
                        std::to_string(bad_rows) + " rows differ; first " + first_bad));
}

void attend_stage(CaseState& st) {
  const CheckCase& c = st.c;
  const CheckData& d = st.d;
  const BatchMetadata& m = d.meta;
  const int H = c.num_kv_heads, QH = c.num_q_heads(), K = c.topk;
  const std::int64_t T = m.num_tokens;
  if (c.shuffle_topk) {  // the result must not depend on the order of the valid entries
    Rng rng(c.seed ^ 0x5EED5EEDull);
    for (std::int64_t r = 0; r < T * H; ++r) {
      std::int32_t* sel = st.topk.data() + r * K;
      const auto valid = std::int32_t(std::find(sel, sel + K, -1) - sel);
      for (std::int32_t i = valid; i > 1; --i) std::swap(sel[i - 1], sel[rng.between(0, i - 1)]);
    }
  }
  const DeviceBuffer topk = to_device(st.topk), q = to_device(d.q);
  DeviceBuffer out(std::size_t(T * QH * kHeadDim) * 2), lse(std::size_t(T * QH) * sizeof(float));
  out.fill_bytes(0xFF);  // NaN in bf16 and fp16
  lse.fill_bytes(0xFF);
  AttentionArgs gargs;
  gargs.q = q.get();
  gargs.q_dtype = c.q_dtype;
  gargs.q_scale = d.q_scale;
  gargs.out = out.get();
  gargs.out_dtype = c.out_dtype;
  gargs.lse = lse.as<float>();
  gargs.num_q_heads = QH;
  gargs.topk = TopkView::token_major(topk.as<std::int32_t>(), H, K);
  gargs.cache = main_cache_view(c, d, st.cache.get(), st.k_scales.as<float>(), st.v_scales.as<float>());
  gargs.block_table = block_table_view(d, st.table.as<std::int32_t>());
  cuda::AttentionTuning tuning;
  tuning.prefill_order = c.key_major ? cuda::PrefillOrder::key_major : cuda::PrefillOrder::query_major;
  DeviceBuffer ws;
  const Outcome o = run_gpu(
      [&] {
        const std::size_t bytes = cuda::attention_workspace_bytes(m, gargs, tuning);
        ws = DeviceBuffer(bytes);
        const cuda::AttentionPlan plan = cuda::plan_attention(m, gargs, {ws.get(), bytes}, st.s, tuning);
        cuda::attend(plan, st.gstep, gargs, st.s, st.check);
      },
      st.check, st.s);
  st.note_check("attend", o);
  if (!o.ok()) {
    st.rows.push_back(failed_row("attend.out", c.attend_bound(), o.error));
    st.rows.push_back(failed_row("attend.lse", kLseBound, o.error));
    return;
  }
  const std::vector<float> g_out = half_to_floats(to_host<std::uint16_t>(out, std::size_t(T * QH * kHeadDim)), c.out_dtype);
  const std::vector<float> g_lse = to_host<float>(lse, std::size_t(T * QH));

  std::vector<std::uint16_t> h_out16(std::size_t(T * QH * kHeadDim), 0xFFFF);
  std::vector<float> h_lse(std::size_t(T * QH), 0.0f);
  try {
    AttentionArgs hargs = gargs;
    hargs.q = d.q.data();
    hargs.out = h_out16.data();
    hargs.lse = h_lse.data();
    hargs.topk = TopkView::token_major(st.topk.data(), H, K);
    hargs.cache = st.host_cache_view();
    hargs.block_table = block_table_view(d, d.block_table.data());
    cpu::attend(m.view(), hargs);
  } catch (const std::exception& e) {
    st.rows.push_back(failed_row("attend.out", c.attend_bound(), "CPU reference: " + what_of(e)));
    st.rows.push_back(failed_row("attend.lse", kLseBound, "CPU reference: " + what_of(e)));
    return;
  }
  const std::vector<float> h_out = half_to_floats(h_out16, c.out_dtype);
  const Diff od = rel_frobenius_rows(g_out, h_out, std::size_t(QH) * kHeadDim);
  std::ostringstream so;
  const std::int64_t w = std::max<std::int64_t>(od.worst, 0);
  so << od.count << " values differ; worst t=" << w / (QH * kHeadDim) << " head=" << (w / kHeadDim) % QH
     << " d=" << w % kHeadDim << ": gpu " << od.got << " cpu " << od.want;
  st.rows.push_back(row("attend.out", od.error, c.attend_bound(), so.str()));
  const Diff ld = max_abs(g_lse, h_lse);
  std::ostringstream sl;
  const std::int64_t lw = std::max<std::int64_t>(ld.worst, 0);
  sl << ld.count << " values differ; worst t=" << lw / QH << " head=" << lw % QH << ": gpu " << ld.got
     << " cpu " << ld.want;
  st.rows.push_back(row("attend.lse", ld.error, kLseBound, sl.str()));
}

}  // namespace

CaseResult run_check_case(const CheckCase& c, cuda::Stream stream) {
  const auto start = std::chrono::steady_clock::now();
  CaseResult result;
  try {
    const CheckData d = make_check_data(c);
    DeviceBuffer check_buffer(8 * sizeof(std::int64_t));
    check_buffer.fill_bytes(0);
    CaseState st(c, d, stream, cuda::DeviceCheck{check_buffer.as<std::int64_t>()}, result.rows);
    insert_stage(st);
    upload_step(st);
    index_stage(st);
    attend_stage(st);
    pre_attention_stage(c, stream, st.check, result.rows, st.recorded);
    std::string notes;
    for (const std::string& r : st.recorded) notes += (notes.empty() ? "" : "; ") + r;
    result.rows.push_back(row("device_check", double(st.recorded.size()), 0, notes));
  } catch (const std::exception& e) {
    result.rows.push_back(failed_row("setup", 0, what_of(e)));
  }
  result.fatal = device_error();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace msa::tool
