// Bad input to cpu::attend: every check of check::attention_shape, plus the
// step / block-table / top-k data checks it runs first. Each must throw
// msa::Error naming the argument and the value, and leave the output untouched.
#include <functional>

#include "core/checks.hpp"
#include "test_attention_common.hpp"

namespace attn_test {
namespace {

struct Case {
  std::string name;
  std::function<void(Problem&, msa::AttentionArgs&)> spoil;
  std::string message;  // a piece the error message must contain
};

Problem small_problem(DType kv, ScaleMode mode) {
  std::mt19937 rng(4000);
  ProblemSpec ps;
  ps.requests = {{1, 300}, {5, 130}};  // token 1 is at position 125
  ps.num_decodes = 1;
  ps.cache.dtype = kv;
  ps.cache.scale_mode = mode;
  ps.cache.num_kv_heads = 2;
  ps.num_q_heads = 4;
  return make_problem(ps, rng);
}

void expect_rejected(Problem& pb, const Case& c) {
  SCOPED_TRACE(c.name);
  Result res;
  res.out.assign(std::size_t(pb.step.view.num_tokens) * pb.num_q_heads * D, 0x7FFF);
  res.lse.assign(std::size_t(pb.step.view.num_tokens) * pb.num_q_heads, 12.5f);
  msa::AttentionArgs a = pb.args(res.out.data(), res.lse.data());
  c.spoil(pb, a);
  try {
    msa::cpu::attend(pb.step.view, a);
    ADD_FAILURE() << "no error; expected one containing '" << c.message << "'";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << c.message;
  }
  for (std::uint16_t x : res.out) ASSERT_EQ(x, 0x7FFF) << "output written by a failed call";
  for (float l : res.lse) ASSERT_EQ(l, 12.5f) << "lse written by a failed call";
}

TEST(AttentionChecks, ValidProblemPasses) {
  Problem pb = small_problem(DType::bf16, ScaleMode::none);
  EXPECT_NO_THROW(run(pb));
  std::vector<std::uint16_t> out(std::size_t(pb.step.view.num_tokens) * pb.num_q_heads * D);
  msa::AttentionArgs a = pb.args(out.data(), nullptr);
  EXPECT_NO_THROW(msa::check::attention_shape(pb.step.view, a));
}

TEST(AttentionChecks, DtypesAndScales) {
  using A = msa::AttentionArgs;
  const std::vector<Case> cases = {
      {"q f32", [](Problem&, A& a) { a.q_dtype = DType::f32; }, "q_dtype = f32"},
      {"q e5m2", [](Problem&, A& a) { a.q_dtype = DType::fp8_e5m2; }, "q_dtype = fp8_e5m2"},
      {"out fp8", [](Problem&, A& a) { a.out_dtype = DType::fp8_e4m3; }, "out_dtype = fp8_e4m3"},
      {"out != q", [](Problem&, A& a) { a.out_dtype = DType::fp16; }, "out_dtype = fp16 but q_dtype = bf16"},
      {"fp8 q scale 0", [](Problem&, A& a) { a.q_dtype = DType::fp8_e4m3; a.q_scale = 0.0f; }, "q_scale = 0"},
      {"fp8 q scale nan", [](Problem&, A& a) { a.q_dtype = DType::fp8_e4m3; a.q_scale = NAN; }, "q_scale = nan"},
      {"softmax scale inf", [](Problem&, A& a) { a.softmax_scale = INFINITY; }, "softmax_scale = inf"},
      {"cache f32", [](Problem&, A& a) { a.cache.dtype = DType::f32; }, "cache.dtype = f32"},
      {"bf16 with scales", [](Problem&, A& a) { a.cache.scale_mode = ScaleMode::per_tensor; }, "cache.scale_mode = per_tensor"},
  };
  for (const Case& c : cases) {
    Problem pb = small_problem(DType::bf16, ScaleMode::none);
    expect_rejected(pb, c);
  }
  const std::vector<Case> fp8_cases = {
      {"fp8 without scales", [](Problem&, A& a) { a.cache.scale_mode = ScaleMode::none; }, "cache.scale_mode = none"},
      {"k_scales null", [](Problem&, A& a) { a.cache.k_scales = nullptr; }, "cache.k_scales is null"},
      {"v_scales null", [](Problem&, A& a) { a.cache.v_scales = nullptr; }, "cache.v_scales is null"},
  };
  for (const Case& c : fp8_cases) {
    Problem pb = small_problem(DType::fp8_e4m3, ScaleMode::per_token_head);
    expect_rejected(pb, c);
  }
  const std::vector<Case> tensor_cases = {
      {"k_scale 0", [](Problem&, A& a) { a.cache.k_scale = 0.0f; }, "cache.k_scale = 0"},
      {"v_scale inf", [](Problem&, A& a) { a.cache.v_scale = INFINITY; }, "cache.v_scale = inf"},
  };
  for (const Case& c : tensor_cases) {
    Problem pb = small_problem(DType::fp8_e5m2, ScaleMode::per_tensor);
    expect_rejected(pb, c);
  }
  Problem nv = small_problem(DType::nvfp4, ScaleMode::per_tensor);
  expect_rejected(nv, {"nvfp4 per token", [](Problem&, A& a) { a.cache.scale_mode = ScaleMode::per_token_head; },
                       "cache.scale_mode = per_token_head"});
  expect_rejected(nv, {"nvfp4 global 0", [](Problem&, A& a) { a.cache.k_scale = -1.0f; }, "cache.k_scale = -1"});
}

TEST(AttentionChecks, HeadsAndTopk) {
  using A = msa::AttentionArgs;
  const std::vector<Case> cases = {
      {"kv heads 0", [](Problem&, A& a) { a.cache.num_kv_heads = 0; }, "cache.num_kv_heads = 0"},
      {"q heads 0", [](Problem&, A& a) { a.num_q_heads = 0; }, "num_q_heads = 0"},
      {"q heads 3", [](Problem&, A& a) { a.num_q_heads = 3; }, "num_q_heads = 3 is not divisible by num_kv_heads = 2"},
      {"group 17", [](Problem&, A& a) { a.num_q_heads = 34; }, "= 17 query heads per KV head"},
      {"topk 0", [](Problem&, A& a) { a.topk.topk = 0; }, "topk.topk = 0"},
      {"topk 65", [](Problem&, A& a) { a.topk.topk = 65; }, "topk.topk = 65"},
  };
  for (const Case& c : cases) {
    Problem pb = small_problem(DType::bf16, ScaleMode::none);
    expect_rejected(pb, c);
  }
}

TEST(AttentionChecks, NullPointersAndTable) {
  using A = msa::AttentionArgs;
  const std::vector<Case> cases = {
      {"q null", [](Problem&, A& a) { a.q = nullptr; }, "q is null"},
      {"out null", [](Problem&, A& a) { a.out = nullptr; }, "out is null"},
      {"topk null", [](Problem&, A& a) { a.topk.data = nullptr; }, "topk.data is null"},
      {"k null", [](Problem&, A& a) { a.cache.k = nullptr; }, "cache.k is null"},
      {"v null", [](Problem&, A& a) { a.cache.v = nullptr; }, "cache.v is null"},
      {"table null", [](Problem&, A& a) { a.block_table.data = nullptr; }, "block_table.data is null"},
      {"table rows", [](Problem&, A& a) { a.block_table.num_rows = 1; }, "block_table.num_rows = 1"},
      {"pages negative", [](Problem&, A& a) { a.cache.num_pages = -2; }, "num_pages = -2"},
  };
  for (const Case& c : cases) {
    Problem pb = small_problem(DType::bf16, ScaleMode::none);
    expect_rejected(pb, c);
  }
}

// The data checks (engineer C's) run before anything is written.
TEST(AttentionChecks, DataChecksRunFirst) {
  using A = msa::AttentionArgs;
  const std::vector<Case> cases = {
      {"topk beyond request", [](Problem& pb, A&) { pb.topk[1 * 16 + 2] = 3; }, "topk[t=0, h=1, k=2] = 3"},
      {"topk beyond position", [](Problem& pb, A&) { pb.topk[(1 * 2 + 0) * 16 + 0] = 1; }, "topk[t=1, h=0, k=0] = 1"},
      {"duplicate topk", [](Problem& pb, A&) { pb.topk[2 * 2 * 16 + 1] = pb.topk[2 * 2 * 16]; }, "repeats"},
      {"table beyond cache", [](Problem& pb, A&) { pb.cache.table[1] = 999; }, "999"},
      {"seq below query", [](Problem& pb, A&) { pb.step.seq_lens[1] = 3; }, "seq_lens[1] = 3"},
  };
  for (const Case& c : cases) {
    Problem pb = small_problem(DType::bf16, ScaleMode::none);
    expect_rejected(pb, c);
  }
}

}  // namespace
}  // namespace attn_test
