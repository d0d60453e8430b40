// Bad input at every public entry point of the library, one case per way a
// caller can get an argument wrong: each must throw msa::Error whose message
// names the argument and the value, and leave every cache and output as it was.
// The cases run on one small valid step (TP2: 32 query / 2 KV heads, two
// decodes of two tokens and a prefill of 60) that each case breaks in one place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/config.hpp"
#include "msa/context_parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/k2q.hpp"
#include "msa/key_major.hpp"
#include "workload.hpp"

namespace {

using namespace msa;
constexpr cpu::Options kOpt{2, true};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The valid step, inserted and indexed, whose buffers the cases read.
Workload& world() {
  static Workload w = [] {
    WorkloadSpec s;
    s.model = ModelConfig::minimax_m3(2);
    s.model.topk = 4;
    s.requests = {{2, 300}, {2, 700}, {60, 600}};  // the prefill ends in a block of its own
    s.decode_threshold = 2;
    s.seed = 5;
    s.num_threads = 2;
    Workload x(s);
    cpu::insert_kv(x.kv_view(), x.insert_kv_args(), kOpt);
    cpu::insert_index(x.index_view(), x.insert_index_args(), kOpt);
    cpu::index(x.step(), x.indexer_args(), kOpt);
    return x;
  }();
  return w;
}

// The arguments of every operation over one copy of the step's small arrays,
// which a case may break; the caches and outputs are the world's.
struct Call {
  Workload& w = world();
  BatchMetadata meta = w.meta();
  StepView step = meta.view();
  std::vector<std::int32_t> table = w.block_table, index_table = w.index_block_table, topk = w.topk;
  std::vector<std::int64_t> slots = w.slots, index_slots = w.index_slots;
  KVCacheView cache = w.kv_view();
  InsertKVArgs kv = w.insert_kv_args();
  IndexCacheView index_cache = w.index_view();
  InsertIndexArgs ik = w.insert_index_args();
  IndexerArgs ia = w.indexer_args();
  AttentionArgs aa = w.attention_args();
  std::vector<float> scores = std::vector<float>(std::size_t(w.num_tokens()) * 2 * w.max_blocks);
  float* scores_at = nullptr;  // block_scores' output, when not `scores`
  std::int32_t max_blocks = w.max_blocks;
  K2QPlan plan;
  std::vector<float> partial_out, partial_lse;
  std::int32_t range_begin = 0, range_end = -1;

  Call() {
    kv.slots = slots.data();
    ik.slots = index_slots.data();
    ia.block_table.data = index_table.data();
    ia.out.data = topk.data();
    aa.block_table.data = table.data();
    aa.topk.data = topk.data();
    plan = build_k2q(step, aa.topk, 2);
    partial_out.resize(cpu::key_major_partial_floats(w.num_tokens(), 32, 4));
    partial_lse.resize(partial_out.size() / kHeadDim);
  }
  // The raw bytes of an argument, to break its alignment.
  template <typename T>
  static T* shifted(T* p, int bytes) {
    return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) + bytes);
  }
};

enum class Op { insert_kv, insert_index, index, block_scores, attend, key_major, k2q };

void run(Op op, Call& c) {
  switch (op) {
    case Op::insert_kv: cpu::insert_kv(c.cache, c.kv, kOpt); return;
    case Op::insert_index: cpu::insert_index(c.index_cache, c.ik, kOpt); return;
    case Op::index: cpu::index(c.step, c.ia, kOpt); return;
    case Op::block_scores:
      cpu::block_scores(c.step, c.ia, c.scores_at ? c.scores_at : c.scores.data(), c.max_blocks, kOpt);
      return;
    case Op::attend: cpu::attend(c.step, c.aa, kOpt); return;
    case Op::key_major:
      cpu::attend_key_major(c.step, c.aa, c.plan, c.partial_out.data(), c.partial_lse.data(), kOpt, c.range_begin,
                            c.range_end);
      return;
    case Op::k2q: build_k2q(c.step, c.aa.topk, c.aa.cache.num_kv_heads, c.range_begin, c.range_end); return;
  }
}

struct Case {
  const char* name;
  Op op;
  std::function<void(Call&)> spoil;
  std::vector<std::string> words;  // each must be in the message
};

// What the world's caches and outputs hold; a failed call must not change it.
struct Snapshot {
  std::vector<std::uint8_t> kv, index, out;
  std::vector<float> lse, k_scales, v_scales;
  std::vector<std::int32_t> topk;
  explicit Snapshot(const Workload& w)
      : kv(w.kv_bytes), index(w.index_bytes), out(w.out), lse(w.lse), k_scales(w.k_scales),
        v_scales(w.v_scales), topk(w.topk) {}
  bool operator==(const Snapshot& o) const {
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
               return x == y || (std::isnan(x) && std::isnan(y));
             });
    };
    return kv == o.kv && index == o.index && out == o.out && same(lse, o.lse) && same(k_scales, o.k_scales) &&
           same(v_scales, o.v_scales) && topk == o.topk;
  }
};

void expect_refused(const Case& c) {
  SCOPED_TRACE(c.name);
  Call call;
  c.spoil(call);
  const Snapshot before(call.w);
  std::vector<std::int32_t> topk_before = call.topk;
  try {
    run(c.op, call);
    ADD_FAILURE() << "no msa::Error (expected one mentioning '" << c.words.front() << "')";
  } catch (const Error& e) {
    for (const std::string& word : c.words)
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << word << "'";
  }
  EXPECT_TRUE(Snapshot(call.w) == before) << "a failed call changed a cache or an output";
  if (c.op == Op::index) {
    EXPECT_TRUE(call.topk == topk_before) << "a failed index wrote top-k";
  }
}

// ---- the step ------------------------------------------------------------------------

TEST(BadInput, Step) {
  const std::vector<Case> cases = {
      {"num_requests < 0", Op::attend, [](Call& c) { c.step.num_requests = -1; }, {"step.num_requests = -1"}},
      {"num_tokens < 0", Op::index, [](Call& c) { c.step.num_tokens = -2; }, {"step.num_tokens = -2"}},
      {"decodes > requests", Op::attend, [](Call& c) { c.step.num_decodes = 4; }, {"step.num_decodes = 4"}},
      {"decode_query_len 0", Op::attend, [](Call& c) { c.step.decode_query_len = 0; },
       {"step.decode_query_len = 0 but the step has 2 decodes"}},
      {"decode tokens", Op::index, [](Call& c) { c.step.num_decode_tokens = 3; }, {"step.num_decode_tokens = 3"}},
      {"query_start null", Op::attend, [](Call& c) { c.step.query_start = nullptr; }, {"step.query_start is null"}},
      {"seq_lens null", Op::index, [](Call& c) { c.step.seq_lens = nullptr; }, {"step.seq_lens is null"}},
      {"token_request null", Op::attend, [](Call& c) { c.step.token_request = nullptr; },
       {"step.token_request is null"}},
      {"query_start[0]", Op::attend, [](Call& c) { c.meta.query_start[0] = 1; }, {"step.query_start[0] = 1"}},
      {"query_start decreasing", Op::index, [](Call& c) { c.meta.query_start[2] = 1; },
       {"step.query_start[2] = 1 is below query_start[1] = 2"}},
      {"seq_len negative", Op::attend, [](Call& c) { c.meta.seq_lens[1] = -4; }, {"step.seq_lens[1] = -4"}},
      {"seq_len below query", Op::attend, [](Call& c) { c.meta.seq_lens[2] = 39; },
       {"step.seq_lens[2] = 39 is below the request's query length 60"}},
      {"token_request", Op::index, [](Call& c) { c.meta.token_request[5] = 0; },
       {"step.token_request[5] = 0 but query_start puts token 5 in request 2"}},
      {"decode lengths", Op::key_major, [](Call& c) { c.meta.query_start[1] = 1; },
       {"decode request 0 has query length 1 but decode_query_len = 2"}},
      {"misaligned seq_lens", Op::attend, [](Call& c) { c.step.seq_lens = Call::shifted(c.step.seq_lens, 2); },
       {"step.seq_lens = ", "not 4-byte aligned"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- the KV cache view --------------------------------------------------------------------

TEST(BadInput, KVCacheView) {
  const auto both = [](const char* name, std::function<void(KVCacheView&)> edit, std::vector<std::string> words) {
    expect_refused({name, Op::attend, [edit](Call& c) { edit(c.aa.cache); }, words});
    expect_refused({name, Op::insert_kv, [edit](Call& c) { edit(c.cache); }, words});
  };
  both("page_stride -1", [](KVCacheView& v) { v.page_stride = -1; }, {"cache.page_stride = -1"});
  both("page_stride 100", [](KVCacheView& v) { v.page_stride = 100; }, {"cache.page_stride = 100"});
  both("token_stride -128", [](KVCacheView& v) { v.token_stride = -128; }, {"cache.token_stride = -128"});
  both("token_stride 64", [](KVCacheView& v) { v.token_stride = 64; }, {"cache.token_stride = 64"});
  both("head_stride 0", [](KVCacheView& v) { v.head_stride = 0; }, {"cache.head_stride = 0"});
  both("head_stride on the tokens", [](KVCacheView& v) { v.head_stride = 256; },
       {"cache.token_stride = 256 and cache.head_stride = 256 make rows overlap"});
  both("v == k", [](KVCacheView& v) { v.v = v.k; }, {"cache.v starts 0 elements after cache.k"});
  both("v on k's rows", [](KVCacheView& v) { v.v = Call::shifted(v.k, 128); },
       {"cache.v starts 64 elements after cache.k"});
  both("v odd bytes from k", [](KVCacheView& v) { v.v = Call::shifted(v.v, 1); }, {"cache.v = ", "not 2-byte aligned"});
  both("k misaligned", [](KVCacheView& v) { v.k = Call::shifted(v.k, 1); }, {"cache.k = ", "not 2-byte aligned"});
  both("num_pages -1", [](KVCacheView& v) { v.num_pages = -1; }, {"cache.num_pages = -1"});
  both("num_pages 2^50", [](KVCacheView& v) { v.num_pages = std::int64_t(1) << 50; }, {"num_pages", "2^62"});
  both("num_kv_heads 0", [](KVCacheView& v) { v.num_kv_heads = 0; }, {"cache.num_kv_heads = 0"});
  both("k null", [](KVCacheView& v) { v.k = nullptr; }, {"cache.k is null"});
  both("dtype f32", [](KVCacheView& v) { v.dtype = DType::f32; }, {"cache.dtype = f32"});
  both("bf16 with scales", [](KVCacheView& v) { v.scale_mode = ScaleMode::per_tensor; },
       {"cache.scale_mode = per_tensor does not go with a bf16 cache"});
  both("fp8 without scales", [](KVCacheView& v) { v.dtype = DType::fp8_e4m3; },
       {"cache.scale_mode = none does not go with a fp8_e4m3 cache"});
  both("fp8 k_scale 0", [](KVCacheView& v) {
         v.dtype = DType::fp8_e5m2, v.scale_mode = ScaleMode::per_tensor, v.k_scale = 0.0f;
       }, {"cache.k_scale = 0"});
  both("fp8 v_scale nan", [](KVCacheView& v) {
         v.dtype = DType::fp8_e4m3, v.scale_mode = ScaleMode::per_tensor, v.v_scale = kNaN;
       }, {"cache.v_scale = nan"});
  both("per-token scales null", [](KVCacheView& v) {
         v.dtype = DType::fp8_e4m3, v.scale_mode = ScaleMode::per_token_head;
       }, {"cache.k_scales is null"});
  both("nvfp4 with separate v", [](KVCacheView& v) {
         v.dtype = DType::nvfp4, v.scale_mode = ScaleMode::per_tensor;
       }, {"cache.v differs from cache.k"});
  both("nvfp4 page too small", [](KVCacheView& v) {
         v.dtype = DType::nvfp4, v.scale_mode = ScaleMode::per_tensor, v.v = v.k, v.page_stride = 1000;
       }, {"cache.page_stride = 1000 bytes is smaller than one nvfp4 page"});
}

// ---- block tables ---------------------------------------------------------------------------

TEST(BadInput, BlockTables) {
  const std::vector<Case> cases = {
      {"num_rows", Op::attend, [](Call& c) { c.aa.block_table.num_rows = 2; },
       {"block_table.num_rows = 2 but the step has 3 requests"}},
      {"max_blocks < 0", Op::attend, [](Call& c) { c.aa.block_table.max_blocks = -1; },
       {"block_table.max_blocks = -1 is negative"}},
      {"row_stride", Op::attend, [](Call& c) { c.aa.block_table.row_stride = 5; },
       {"block_table.row_stride = 5 is below max_blocks = 6"}},
      {"row_stride negative", Op::key_major, [](Call& c) { c.aa.block_table.row_stride = -9; },
       {"block_table.row_stride = -9"}},
      {"data null", Op::attend, [](Call& c) { c.aa.block_table.data = nullptr; }, {"block_table.data is null"}},
      {"page beyond the cache", Op::attend, [](Call& c) { c.table[2 * c.w.table_stride + 3] = 1 << 20; },
       {"block_table[r=2, b=3] = 1048576 but the cache has"}},
      {"page negative", Op::key_major, [](Call& c) { c.table[1 * c.w.table_stride + 5] = -1; },
       {"block_table[r=1, b=5] = -1 is negative"}},
      {"too few columns", Op::attend, [](Call& c) { c.aa.block_table.max_blocks = 5; },
       {"request 1 has seq_len 702 and needs 6 blocks but the table has 5 columns"}},
      {"index page beyond the cache", Op::index, [](Call& c) { c.index_table[0] = 1 << 20; },
       {"block_table[r=0, b=0] = 1048576 but the cache has"}},
      {"index table rows", Op::block_scores, [](Call& c) { c.ia.block_table.num_rows = 0; },
       {"indexer: block_table.num_rows = 0 but the step has 3 requests"}},
      {"index table null", Op::index, [](Call& c) { c.ia.block_table.data = nullptr; },
       {"indexer: block_table.data is null"}},
      {"table misaligned", Op::attend, [](Call& c) { c.aa.block_table.data = Call::shifted(c.table.data(), 1); },
       {"block_table = ", "not 4-byte aligned"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- top-k -------------------------------------------------------------------------------------

TEST(BadInput, Topk) {
  const std::vector<Case> cases = {
      {"topk 0", Op::attend, [](Call& c) { c.aa.topk.topk = 0; }, {"topk.topk = 0"}},
      {"topk 65", Op::attend, [](Call& c) { c.aa.topk.topk = 65; }, {"topk.topk = 65"}},
      {"data null", Op::attend, [](Call& c) { c.aa.topk.data = nullptr; }, {"topk.data is null"}},
      {"token_stride < 0", Op::attend, [](Call& c) { c.aa.topk.token_stride = -8; },
       {"topk.token_stride = -8 is negative"}},
      {"head rows overlap", Op::attend, [](Call& c) { c.aa.topk.head_stride = 2; },
       {"topk rows overlap", "head_stride = 2"}},
      {"token rows overlap", Op::k2q, [](Call& c) { c.aa.topk.token_stride = 4; },
       {"topk rows overlap", "token_stride = 4"}},
      {"misaligned", Op::attend, [](Call& c) { c.aa.topk.data = Call::shifted(c.topk.data(), 2); },
       {"topk = ", "not 4-byte aligned"}},
      {"id beyond the request", Op::attend, [](Call& c) { c.topk[(0 * 2 + 1) * 4 + 2] = 3; },
       {"topk[t=0, h=1, k=2] = 3"}},
      {"id beyond the position", Op::k2q, [](Call& c) { c.topk[(4 * 2 + 0) * 4 + 0] = 5; },
       {"topk[t=4, h=0, k=0] = 5 but the token's position 600 allows blocks 0..4"}},
      {"id -2", Op::attend, [](Call& c) { c.topk[(7 * 2 + 1) * 4 + 1] = -2; },
       {"topk[t=7, h=1, k=1] = -2 is neither -1 nor a block id"}},
      {"id after -1", Op::attend, [](Call& c) { c.topk[2] = -1, c.topk[3] = 0; },
       {"topk[t=0, h=0, k=3] = 0 follows a -1 at k=2"}},
      {"duplicate", Op::k2q, [](Call& c) { c.topk[(10 * 2 + 0) * 4 + 1] = c.topk[(10 * 2 + 0) * 4 + 0]; },
       {"topk[t=10, h=0, k=1]", "repeats topk[t=10, h=0, k=0]"}},
      {"k2q range", Op::k2q, [](Call& c) { c.range_begin = 5, c.range_end = 3; },
       {"top-k token range [5, 3) is not inside [0, num_tokens = 64]"}},
      {"k2q heads", Op::k2q, [](Call& c) { c.aa.cache.num_kv_heads = 0; }, {"num_kv_heads = 0"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- attention: query, output and heads -------------------------------------------------------

TEST(BadInput, Attention) {
  const std::vector<Case> cases = {
      {"q null", Op::attend, [](Call& c) { c.aa.q = nullptr; }, {"q is null but the step has 64 tokens"}},
      {"out null", Op::attend, [](Call& c) { c.aa.out = nullptr; }, {"out is null"}},
      {"q f32", Op::attend, [](Call& c) { c.aa.q_dtype = DType::f32; }, {"q_dtype = f32"}},
      {"out fp16", Op::attend, [](Call& c) { c.aa.out_dtype = DType::fp16; }, {"out_dtype = fp16 but q_dtype = bf16"}},
      {"out fp8", Op::key_major, [](Call& c) { c.aa.out_dtype = DType::fp8_e4m3; }, {"out_dtype = fp8_e4m3"}},
      {"fp8 q scale 0", Op::attend, [](Call& c) { c.aa.q_dtype = DType::fp8_e4m3, c.aa.q_scale = 0.0f; },
       {"q_scale = 0"}},
      {"softmax scale nan", Op::attend, [](Call& c) { c.aa.softmax_scale = kNaN; }, {"softmax_scale = nan"}},
      {"q heads 0", Op::attend, [](Call& c) { c.aa.num_q_heads = 0; }, {"num_q_heads = 0"}},
      {"q heads 33", Op::attend, [](Call& c) { c.aa.num_q_heads = 33; },
       {"num_q_heads = 33 is not divisible by num_kv_heads = 2"}},
      {"group 17", Op::attend, [](Call& c) { c.aa.num_q_heads = 34; }, {"= 17 query heads per KV head"}},
      {"out on q", Op::attend, [](Call& c) { c.aa.out = const_cast<void*>(c.aa.q); }, {"out (", "overlaps q ("}},
      {"lse on out", Op::attend, [](Call& c) { c.aa.lse = static_cast<float*>(c.aa.out) + 100; },
       {"overlaps"}},
      {"out in the cache", Op::key_major, [](Call& c) { c.aa.out = c.w.kv_bytes.data() + 4096; },
       {"out (", "overlaps cache.k"}},
      {"lse on the top-k", Op::attend, [](Call& c) { c.aa.lse = reinterpret_cast<float*>(c.topk.data()); },
       {"lse (", "overlaps topk"}},
      {"q misaligned", Op::attend, [](Call& c) { c.aa.q = Call::shifted(c.aa.q, 1); }, {"q = ", "not 2-byte aligned"}},
      {"lse misaligned", Op::attend, [](Call& c) { c.aa.lse = Call::shifted(c.aa.lse, 2); },
       {"lse = ", "not 4-byte aligned"}},
      {"key-major plan of other heads", Op::key_major, [](Call& c) { c.plan.num_kv_heads = 1; },
       {"plan.num_kv_heads = 1 but the cache has 2"}},
      {"key-major plan of another topk", Op::key_major, [](Call& c) { c.plan.topk = 8; },
       {"plan.topk = 8 but topk.topk = 4"}},
      {"key-major counts", Op::key_major, [](Call& c) { c.plan.counts[3] += 1; }, {"plan.counts[t=1, h=1]"}},
      {"key-major partials null", Op::key_major, [](Call& c) { std::vector<float>().swap(c.partial_out); },
       {"partial_out / partial_lse is null"}},
      {"key-major range", Op::key_major, [](Call& c) { c.range_end = 65; }, {"token range [0, 65)"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- the indexer -------------------------------------------------------------------------------

TEST(BadInput, Indexer) {
  const std::vector<Case> cases = {
      {"kv heads 0", Op::index, [](Call& c) { c.ia.num_kv_heads = 0; }, {"indexer: num_kv_heads = 0"}},
      {"iq fp8", Op::index, [](Call& c) { c.ia.iq_dtype = DType::fp8_e4m3; }, {"iq_dtype = fp8_e4m3"}},
      {"index_q null", Op::block_scores, [](Call& c) { c.ia.index_q = nullptr; }, {"index_q is null"}},
      {"index_q misaligned", Op::index, [](Call& c) { c.ia.index_q = Call::shifted(c.ia.index_q, 1); },
       {"indexer: index_q = ", "not 2-byte aligned"}},
      {"cache fp16", Op::index, [](Call& c) { c.ia.cache.dtype = DType::fp16; }, {"cache.dtype = fp16"}},
      {"cache page stride", Op::index, [](Call& c) { c.ia.cache.page_stride = -1; },
       {"index_cache.page_stride = -1"}},
      {"cache null", Op::block_scores, [](Call& c) { c.ia.cache.base = nullptr; }, {"cache.base is null"}},
      {"out topk 0", Op::index, [](Call& c) { c.ia.out.topk = 0; }, {"indexer: out.topk = 0"}},
      {"out null", Op::index, [](Call& c) { c.ia.out.data = nullptr; }, {"indexer: out.data is null"}},
      {"out token_stride < 0", Op::index, [](Call& c) { c.ia.out.token_stride = -8; },
       {"indexer: out.token_stride = -8 is negative"}},
      {"out rows overlap", Op::index, [](Call& c) { c.ia.out.token_stride = 0; },
       {"indexer: out rows overlap", "token_stride = 0"}},
      {"init < 0", Op::index, [](Call& c) { c.ia.init_blocks = -1; }, {"init_blocks = -1"}},
      {"local < 0", Op::index, [](Call& c) { c.ia.local_blocks = -3; }, {"local_blocks = -3"}},
      {"init + local > topk", Op::index, [](Call& c) { c.ia.init_blocks = 3, c.ia.local_blocks = 2; },
       {"3 + 2", "out.topk = 4"}},
      {"init + local overflow", Op::index,
       [](Call& c) { c.ia.init_blocks = std::numeric_limits<std::int32_t>::max(), c.ia.local_blocks = 1; },
       {"2147483647 + 1"}},
      {"out on index_q", Op::index, [](Call& c) { c.ia.out.data = static_cast<std::int32_t*>(const_cast<void*>(c.ia.index_q)); },
       {"indexer: out (", "overlaps indexer: index_q"}},
      {"out in the index cache", Op::index, [](Call& c) { c.ia.out.data = reinterpret_cast<std::int32_t*>(c.w.index_bytes.data()); },
       {"overlaps index_cache"}},
      {"scores too narrow", Op::block_scores, [](Call& c) { c.max_blocks = 5; },
       {"block_scores: max_blocks = 5 but token 2 at position 700 has 6 eligible blocks"}},
      {"scores null", Op::block_scores, [](Call& c) { std::vector<float>().swap(c.scores); },
       {"block_scores: scores is null"}},
      {"scores on index_q", Op::block_scores,
       [](Call& c) { c.scores_at = static_cast<float*>(const_cast<void*>(c.ia.index_q)); },
       {"block_scores: scores (", "overlaps indexer: index_q"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- insert ------------------------------------------------------------------------------------

TEST(BadInput, Insert) {
  const std::vector<Case> cases = {
      {"num_tokens -1", Op::insert_kv, [](Call& c) { c.kv.num_tokens = -1; }, {"num_tokens = -1"}},
      {"src fp8", Op::insert_kv, [](Call& c) { c.kv.src_dtype = DType::fp8_e4m3; },
       {"src_dtype = fp8_e4m3 is not an insert source dtype"}},
      {"k null", Op::insert_kv, [](Call& c) { c.kv.k = nullptr; }, {"k is null with num_tokens = 64"}},
      {"slots null", Op::insert_kv, [](Call& c) { c.kv.slots = nullptr; }, {"slots is null"}},
      {"slot beyond the cache", Op::insert_kv, [](Call& c) { c.slots[9] = c.w.num_pages * 128; },
       {"slots[9] = ", "but the cache has"}},
      {"slots misaligned", Op::insert_kv, [](Call& c) { c.kv.slots = Call::shifted(c.slots.data(), 4); },
       {"slots = ", "not 8-byte aligned"}},
      {"k source in the cache", Op::insert_kv, [](Call& c) { c.kv.k = c.w.kv_bytes.data() + 1024; },
       {"cache.k (", "overlaps k ("}},
      {"v misaligned", Op::insert_kv, [](Call& c) { c.kv.v = Call::shifted(c.kv.v, 1); },
       {"v = ", "not 2-byte aligned"}},
      {"index slot beyond", Op::insert_index, [](Call& c) { c.index_slots[43] = c.w.index_num_pages * 128 + 5; },
       {"index slots[43] = "}},
      {"index_k null", Op::insert_index, [](Call& c) { c.ik.index_k = nullptr; }, {"index_k is null"}},
      {"index src f32", Op::insert_index, [](Call& c) { c.ik.src_dtype = DType::f32; }, {"src_dtype = f32"}},
      {"index_k in the cache", Op::insert_index, [](Call& c) { c.ik.index_k = c.w.index_bytes.data(); },
       {"index_cache (", "overlaps index_k"}},
      {"index cache e5m2", Op::insert_index, [](Call& c) { c.index_cache.dtype = DType::fp8_e5m2; },
       {"index_cache.dtype = fp8_e5m2"}},
      {"nvfp4 index cache page", Op::insert_index,
       [](Call& c) { c.index_cache.dtype = DType::nvfp4, c.index_cache.page_stride = 9000; },
       {"index_cache.page_stride = 9000 is smaller than one page (9216 bytes)"}},
      {"nvfp4 index cache scale", Op::insert_index,
       [](Call& c) { c.index_cache.dtype = DType::nvfp4, c.index_cache.global_scale = 0.0f; },
       {"index_cache.global_scale = 0"}},
  };
  for (const Case& c : cases) expect_refused(c);
}

// ---- metadata, builders, configuration, per-row rules ------------------------------------------

TEST(BadInput, MetadataBuildersAndConfig) {
  using V = std::vector<std::int32_t>;
  const auto meta = [](V q, V s, int threshold = 1) {
    return [=] { build_metadata(BatchSpec{q, s, threshold}); };
  };
  struct Direct {
    const char* name;
    std::function<void()> call;
    std::vector<std::string> words;
  };
  float scores[8] = {};
  std::int32_t out[8];
  cp::Candidate candidates[8] = {};
  const std::vector<Direct> cases = {
      {"sizes differ", meta({1, 1}, {5}), {"query_lens has 2 entries but seq_lens has 1"}},
      {"query_len < 0", meta({-1}, {5}), {"query_lens[0] = -1 is negative"}},
      {"seq_len < 0", meta({1}, {-5}), {"seq_lens[0] = -5 is negative"}},
      {"seq_len below query", meta({1, 9}, {5, 8}), {"seq_lens[1] = 8 is below query_lens[1] = 9"}},
      {"decode after prefill", meta({5, 1}, {9, 9}), {"request 1 is a decode", "after prefill request 0"}},
      {"decode lengths", meta({2, 1}, {9, 9}, 2), {"query_lens[1] = 1 but decode request 0 has query length 2"}},
      {"threshold < 0", meta({1}, {1}, -1), {"decode_threshold = -1 is negative"}},
      {"tokens beyond int32", meta({1 << 30, 1 << 30, 1 << 30}, {1 << 30, 1 << 30, 1 << 30}, 0),
       {"more than int32 holds"}},
      {"cache builder page", [] { make_cache_view(DType::bf16, nullptr, 1, 2, Layout::nhd, 65535); },
       {"page_stride = 65535"}},
      {"cache builder layout", [] { make_cache_view(DType::bf16, nullptr, 1, 2, static_cast<Layout>(9)); },
       {"layout = 9"}},
      {"cache builder size", [] { make_cache_view(DType::bf16, nullptr, std::int64_t(1) << 48, 2, Layout::hnd); },
       {"the cache", "2^62"}},
      {"nvfp4 builder scale", [] { make_nvfp4_cache_view(nullptr, 1, 1, 0.0f, 1.0f); }, {"k_global_scale = 0"}},
      {"nvfp4 builder heads", [] { make_nvfp4_cache_view(nullptr, 1, -3, 1.0f, 1.0f); }, {"num_kv_heads = -3"}},
      {"parse dtype", [] { parse_dtype("fp7", "--kv-dtype"); }, {"--kv-dtype = 'fp7' is not a dtype"}},
      {"parse layout", [] { parse_layout("xyz", "--layout"); }, {"--layout = 'xyz' is not a layout"}},
      {"page bytes f32", [] { page_bytes_per_head(DType::f32); }, {"f32"}},
      {"fp8_max bf16", [] { fp8_max(DType::bf16); }, {"fp8_max: dtype bf16"}},
      {"config head_dim", [] { ModelConfig m; m.head_dim = 64; m.validate(); }, {"head_dim = 64"}},
      {"config group", [] { ModelConfig m; m.num_q_heads = 64; m.validate(); }, {"GQA group", "64"}},
      {"config topk", [] { ModelConfig m; m.topk = 0; m.validate(); }, {"topk = 0"}},
      {"config scale", [] { ModelConfig m; m.softmax_scale = -1.0f; m.validate(); }, {"softmax_scale = -1"}},
      {"config init + local", [] { ModelConfig m; m.init_blocks = std::numeric_limits<int>::max(); m.validate(); },
       {"init_blocks + local_blocks = 2147483648"}},
      {"tp 3", [] { ModelConfig::minimax_m3(3); }, {"tp = 3"}},
      {"select_row topk", [&] { cpu::select_row(scores, 7, 0, 0, 0, out); }, {"select_row: topk = 0"}},
      {"select_row forced", [&] { cpu::select_row(scores, 7, 4, 3, 2, out); }, {"init_blocks + local_blocks = 5"}},
      {"cp rank", [&] { cp::local_candidates(scores, 7, cp::Sharding{2, 0}, 2, 4, 0, 1, candidates); },
       {"local_candidates: rank = 2 is not in [0, 2)"}},
      {"cp topk", [&] { cp::merge_candidates(candidates, 2, 7, 65, 0, 1, out); }, {"merge_candidates: topk = 65"}},
      {"cp ranks", [&] { cp::owned_entries(out, 4, cp::Sharding{0, 0}, 0, out); },
       {"owned_entries: sharding.num_ranks = 0"}},
  };
  for (const Direct& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      c.call();
      ADD_FAILURE() << "no msa::Error";
    } catch (const Error& e) {
      for (const std::string& word : c.words)
        EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << "message '" << e.what() << "'";
    }
  }
}

}  // namespace
