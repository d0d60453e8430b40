// The pure host pieces of `msa bench --set pre_attention`
// (tools/msa/cuda/bench_pre_attention.hpp): the case list and the bytes.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "../../tools/msa/cuda/bench_pre_attention.hpp"

namespace {

using namespace msa;
using namespace msa::tool;

TEST(PreAttentionBench, CasesCoverShapesDtypesAndSizes) {
  const std::vector<BenchCase> cases = pre_attention_bench_cases();
  std::set<std::string> names, dtypes, shapes;
  std::set<std::int64_t> tokens;
  for (const BenchCase& c : cases) {
    EXPECT_EQ(c.op, BenchOp::pre_attention);
    names.insert(c.name());
    dtypes.insert(dtype_name(c.dtype));
    shapes.insert(std::to_string(c.num_q_heads) + "/" + std::to_string(c.num_kv_heads));
    tokens.insert(c.num_tokens());
  }
  EXPECT_EQ(names.size(), cases.size()) << "names must be unique (they are the --case filters)";
  EXPECT_EQ(dtypes, (std::set<std::string>{"bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "nvfp4"}));
  EXPECT_EQ(shapes, (std::set<std::string>{"16/1", "64/4"}));
  EXPECT_EQ(*tokens.begin(), 1);
  EXPECT_EQ(*tokens.rbegin(), 32768);
  EXPECT_EQ(cases.front().name(), "pre_attention 16/1 bf16 n=1");
  EXPECT_TRUE(matches_any(cases.back(), {"pre_attention 64/4 nvfp4 n=32768"}));
}

TEST(PreAttentionBench, BytesPerTokenByHand) {
  BenchCase c = make_bench_case(BenchOp::pre_attention, false, 16, 1, DType::bf16, 0, 10, 1);
  // Read: 20 heads x 256 + position 8 + slot 8 + cos/sin 256. Write: q 16 x 256,
  // index q 256, index key 256, K and V 512.
  const double read = 20 * 256 + 8 + 8 + 256, write = 16 * 256 + 256 + 256 + 512;
  EXPECT_DOUBLE_EQ(pre_attention_bytes_per_token(c, ScaleMode::none), read + write);
  EXPECT_DOUBLE_EQ(pre_attention_traffic(c, ScaleMode::none).bytes, 10 * (read + write) + 4 * 128 * 4);
  c.dtype = DType::fp8_e4m3;
  EXPECT_DOUBLE_EQ(pre_attention_bytes_per_token(c, ScaleMode::per_tensor), read + write - 256);
  EXPECT_DOUBLE_EQ(pre_attention_bytes_per_token(c, ScaleMode::per_token_head), read + write - 256 + 8);
  c.dtype = DType::nvfp4;
  c.num_q_heads = 64;
  c.num_kv_heads = 4;
  const double read4 = 77 * 256 + 8 + 8 + 256, write4 = 64 * 256 + 4 * 256 + 256 + 4 * 144;
  EXPECT_DOUBLE_EQ(pre_attention_bytes_per_token(c, ScaleMode::per_tensor), read4 + write4);
  EXPECT_EQ(pre_attention_traffic(c, ScaleMode::per_tensor).flops, 0.0);
}

}  // namespace
