#include "bench_cp_case.hpp"

#include <algorithm>

#include "fill.hpp"
#include "msa/cache.hpp"
#include "msa/config.hpp"
#include "msa/error.hpp"
#include "rng.hpp"

namespace msa::tool {

namespace {

namespace ccp = cuda::cp;

BenchCase cp_case(bool prefill, int qh, int kvh, std::int32_t context, std::int32_t batch,
                  std::int32_t query_len) {
  return BenchCase{.op = BenchOp::attend, .prefill = prefill, .num_q_heads = qh, .num_kv_heads = kvh,
                   .dtype = DType::bf16, .context = context, .batch = batch, .query_len = query_len,
                   .topk = ModelConfig{}.topk};
}

// Seeds of a block's contents: a function of (seed, what, request, block) only.
std::uint64_t block_seed(std::uint64_t seed, std::uint64_t what, std::int32_t request, std::int32_t block) {
  return mix64(mix64(seed * 31 + what) ^ (std::uint64_t(std::uint32_t(request)) << 32 | std::uint32_t(block)));
}

// Elements of an index-cache page [128 tokens][128], and of one KV head's part
// of a main-cache page (hnd: [128 tokens][K 128 | V 128]).
constexpr std::int64_t kIndexPageElems = std::int64_t(kBlockSize) * kHeadDim;
constexpr std::int64_t kKvHeadElems = 2 * std::int64_t(kBlockSize) * kHeadDim;

}  // namespace

std::vector<BenchCase> default_cp_cases() {
  std::vector<BenchCase> out;
  for (const auto& [qh, kvh] : {std::pair{16, 1}, std::pair{64, 4}}) {
    for (const std::int32_t q : {1, 2}) out.push_back(cp_case(false, qh, kvh, kCpDecodeContext, kCpDecodeBatch, q));
    out.push_back(cp_case(true, qh, kvh, kCpPrefillContext, 1, kCpPrefillChunk));
  }
  return out;
}

std::vector<BenchCase> quick_cp_cases() {
  return {cp_case(false, 64, 4, kCpDecodeContext, kCpDecodeBatch, 1),
          cp_case(true, 16, 1, kCpPrefillContext, 1, kCpPrefillChunk)};
}

std::string cp_case_name(const BenchCase& c) {
  const std::string n = c.name();
  const std::size_t space = n.find(' ');
  return space == std::string::npos ? n : n.substr(space + 1);
}

std::int32_t cp_case_blocks(const BenchCase& c) { return (c.seq_len() + kBlockSize - 1) / kBlockSize; }

cp::Sharding cp_sharding(const BenchCase& c, int ranks, int run_blocks) {
  cp::Sharding s{ranks, run_blocks};
  if (run_blocks < 0) s.run_blocks = (cp_case_blocks(c) + ranks - 1) / ranks;
  return s;
}

std::string sharding_name(const cp::Sharding& s) {
  if (s.run_blocks <= 0) return "round-robin";
  return "runs of " + std::to_string(s.run_blocks) + " blocks";
}

CpRank::CpRank(const BenchCase& c, const ccp::Group& group, std::uint64_t seed, bool from_scores,
               ccp::PartialMerge merge, cuda::Stream stream)
    : c_(c), from_scores_(from_scores) {
  const int H = c.num_kv_heads, QH = c.num_q_heads, K = c.topk;
  BatchSpec spec;
  spec.query_lens.assign(std::size_t(c.batch), c.query_len);
  spec.seq_lens.assign(std::size_t(c.batch), c.seq_len());
  spec.decode_threshold = c.prefill ? 1 : c.query_len;
  meta_ = build_metadata(spec);
  const std::int64_t T = meta_.num_tokens;
  max_blocks_ = cp_case_blocks(c);

  // The step's three arrays in one upload.
  std::vector<std::int32_t> arrays = meta_.query_start;
  arrays.insert(arrays.end(), meta_.seq_lens.begin(), meta_.seq_lens.end());
  arrays.insert(arrays.end(), meta_.token_request.begin(), meta_.token_request.end());
  step_arrays_ = to_device(arrays);
  view_ = meta_.view();
  view_.query_start = step_arrays_.as<std::int32_t>();
  view_.seq_lens = view_.query_start + meta_.query_start.size();
  view_.token_request = view_.seq_lens + meta_.seq_lens.size();

  // Owned blocks -> local pages, in request-then-block order.
  const cp::Sharding& sh = group.sharding;
  std::vector<std::int32_t> table(std::size_t(c.batch) * std::size_t(max_blocks_), -1);
  for (std::int32_t r = 0; r < c.batch; ++r)
    for (std::int32_t b = 0; b < max_blocks_; ++b)
      if (sh.owner(b) == group.rank) table[std::size_t(r) * std::size_t(max_blocks_) + std::size_t(b)] = std::int32_t(owned_pages_++);
  table_ = to_device(table);
  const std::int64_t pages = std::max<std::int64_t>(owned_pages_, 1);
  const std::int64_t kv_page_elems = H * kKvHeadElems;
  kv_ = DeviceBuffer(std::size_t(pages * kv_page_elems * 2));
  index_ = DeviceBuffer(std::size_t(pages * kIndexPageElems * 2));
  for (std::int32_t r = 0; r < c.batch; ++r)
    for (std::int32_t b = 0; b < max_blocks_; ++b) {
      const std::int32_t page = table[std::size_t(r) * std::size_t(max_blocks_) + std::size_t(b)];
      if (page < 0) continue;
      fill_random(kv_.as<std::uint16_t>() + page * kv_page_elems, kv_page_elems, DType::bf16, 1.0f,
                  block_seed(seed, 1, r, b), stream);
      fill_random(index_.as<std::uint16_t>() + page * kIndexPageElems, kIndexPageElems, DType::bf16, 1.0f,
                  block_seed(seed, 2, r, b), stream);
    }
  q_ = DeviceBuffer(std::size_t(T * QH * kHeadDim * 2));
  index_q_ = DeviceBuffer(std::size_t(T * H * kHeadDim * 2));
  fill_random(q_.get(), T * QH * kHeadDim, DType::bf16, 1.0f, mix64(seed + 3), stream);
  fill_random(index_q_.get(), T * H * kHeadDim, DType::bf16, 1.0f, mix64(seed + 4), stream);

  const std::size_t score_bytes = cuda::index_workspace_bytes(std::int32_t(T), H, max_blocks_);
  scores_ = DeviceBuffer(score_bytes);
  index_topk_ = DeviceBuffer(std::size_t(T * H * K) * sizeof(std::int32_t));
  out_ = DeviceBuffer(std::size_t(T * QH * kHeadDim * 2));
  if (sh.num_ranks == 1) single_out_ = DeviceBuffer(out_.bytes());

  const BlockTable bt{table_.as<std::int32_t>(), c.batch, max_blocks_, max_blocks_};
  const ModelConfig model;
  index_args_.index_q = index_q_.get();
  index_args_.iq_dtype = DType::bf16;
  index_args_.num_kv_heads = H;
  index_args_.init_blocks = model.init_blocks;
  index_args_.local_blocks = model.local_blocks;
  index_args_.cache = IndexCacheView{DType::bf16, index_.get(), pages};
  index_args_.block_table = bt;
  index_args_.out = TopkView::token_major(index_topk_.as<std::int32_t>(), H, K);

  attention_args_.q = q_.get();
  attention_args_.q_dtype = DType::bf16;
  attention_args_.out = out_.get();
  attention_args_.out_dtype = DType::bf16;
  attention_args_.num_q_heads = QH;
  attention_args_.softmax_scale = model.softmax_scale;
  attention_args_.cache = make_cache_view(DType::bf16, kv_.get(), pages, H, Layout::hnd);
  attention_args_.block_table = bt;
  single_args_ = attention_args_;
  single_args_.out = single_out_.get();
  single_args_.topk = index_args_.out;

  AttentionArgs problem = attention_args_;
  problem.topk.topk = K;
  const ccp::SelectShape select{H, K, model.init_blocks, model.local_blocks, max_blocks_};
  const std::size_t ws = ccp::layer_workspace_bytes(meta_, select, problem, sh.num_ranks, {}, merge);
  layer_ws_ = DeviceBuffer(ws);
  plan_ = ccp::plan_layer(group, meta_, select, problem, {layer_ws_.get(), ws}, stream, {}, merge);
  sync_stream(stream);
}

void CpRank::step(cuda::Stream stream) const {
  cuda::index(view_, index_args_, max_blocks_, {scores_.get(), scores_.bytes()}, stream);
  if (from_scores_) ccp::run_layer(plan_, view_, scores_.as<float>(), attention_args_, stream);
  else ccp::run_layer(plan_, view_, scores_.as<float>(), index_args_.out, attention_args_, stream);
}

void CpRank::index_phase(cuda::Stream stream) const {
  cuda::index(view_, index_args_, max_blocks_, {scores_.get(), scores_.bytes()}, stream);
  if (from_scores_) ccp::propose(plan_, view_, scores_.as<float>(), stream);
  else ccp::propose(plan_, view_, scores_.as<float>(), index_args_.out, stream);
  ccp::exchange_candidates(plan_, stream);
  ccp::merge_topk(plan_, view_, stream);
}

void CpRank::attend_phase(cuda::Stream stream) const {
  ccp::attend_owned(plan_, view_, attention_args_, stream);
  ccp::exchange_partials(plan_, stream);
  ccp::combine(plan_, attention_args_.out, nullptr, stream);
}

void CpRank::single_index(cuda::Stream stream) const {
  MSA_CHECK(plan_.group.sharding.num_ranks == 1, "CpRank::single_index: the single-GPU path needs one rank, not ",
            plan_.group.sharding.num_ranks);
  cuda::index(view_, index_args_, max_blocks_, {scores_.get(), scores_.bytes()}, stream);
}

void CpRank::single_attend(cuda::Stream stream) const {
  MSA_CHECK(plan_.group.sharding.num_ranks == 1, "CpRank::single_attend: the single-GPU path needs one rank, not ",
            plan_.group.sharding.num_ranks);
  cuda::attend(plan_.attention, view_, single_args_, stream);
}

std::vector<std::int32_t> CpRank::cp_topk() const {
  // plan_.topk lies inside the layer workspace.
  const std::size_t n = std::size_t(meta_.num_tokens) * std::size_t(c_.num_kv_heads * c_.topk);
  const auto offset = std::size_t(reinterpret_cast<const std::uint8_t*>(plan_.topk) - layer_ws_.as<std::uint8_t>());
  return to_host<std::int32_t>(layer_ws_, n, offset);
}

std::vector<std::uint16_t> CpRank::cp_output() const { return to_host<std::uint16_t>(out_, out_.bytes() / 2); }

std::vector<std::int32_t> CpRank::single_topk() const {
  return to_host<std::int32_t>(index_topk_, index_topk_.bytes() / sizeof(std::int32_t));
}

std::vector<std::uint16_t> CpRank::single_output() const {
  return to_host<std::uint16_t>(single_out_, single_out_.bytes() / 2);
}

double CpRank::index_bytes() const { return double(owned_pages_) * double(kIndexPageElems) * 2.0; }

double CpRank::device_bytes() const {
  double b = 0;
  for (const DeviceBuffer* d : {&step_arrays_, &table_, &kv_, &index_, &q_, &index_q_, &scores_, &index_topk_,
                                &layer_ws_, &out_, &single_out_})
    b += double(d->bytes());
  return b;
}

}  // namespace msa::tool
