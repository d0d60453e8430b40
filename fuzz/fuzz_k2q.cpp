// build_k2q on small steps with top-k buffers of any strides and entries
// (valid lists, then some entries broken): it throws msa::Error or returns
// the exact inversion of the lists, and never reads outside the buffer
// (allocated to the view's exact extent).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuzz_input.hpp"
#include "msa/k2q.hpp"

using namespace msa;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  BatchMetadata meta;
  try {
    meta = fuzz::small_step(in);
  } catch (const Error&) {
    return 0;
  }
  const StepView step = meta.view();
  const std::int64_t T = meta.num_tokens;
  const int H = int(fuzz::sometimes(in, 1 + in.ConsumeIntegralInRange(0, 2), -1, 4));
  const int K = int(fuzz::sometimes(in, 1 + in.ConsumeIntegralInRange(0, 7), -1, 70));
  const std::int64_t rows = std::max<std::int64_t>(H, 0), width = std::max(K, 0);
  // Token-major, head-major, padded, or strides from the input.
  std::int64_t ts = rows * width, hs = width;
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 1: ts = width, hs = T * width; break;
    case 2: ts = rows * (width + 3), hs = width + 3; break;
    case 3:
      ts = in.ConsumeIntegralInRange<std::int64_t>(-20, 200);
      hs = in.ConsumeIntegralInRange<std::int64_t>(-20, 200);
      break;
    default: break;
  }
  // The buffer holds exactly the entries the view addresses (with the strides
  // in use not negative; otherwise T x H x K entries, and the view must be refused).
  const std::int64_t used_ts = T > 1 ? ts : 0, used_hs = rows > 1 ? hs : 0;
  std::int64_t entries = T * rows * width;
  if (used_ts >= 0 && used_hs >= 0 && T > 0 && rows > 0) entries = (T - 1) * used_ts + (rows - 1) * used_hs + width;
  std::vector<std::int32_t> buf(std::size_t(std::max<std::int64_t>(entries, 1)), -1);
  const TopkView view{buf.data(), K, ts, hs};
  // Valid lists where the buffer holds them, then a few entries overwritten.
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t p = meta.token_position[t];
    for (std::int64_t h = 0; h < rows; ++h) {
      const std::int64_t at = t * ts + h * hs;
      if (at < 0 || at + width > std::int64_t(buf.size())) continue;
      for (std::int32_t k = 0; k < K && p >= 0 && k <= p / 128; ++k) buf[at + k] = p / 128 - k;
    }
  }
  for (int i = in.ConsumeIntegralInRange(0, 3); i > 0 && !buf.empty(); --i) {
    buf[in.ConsumeIntegralInRange<std::size_t>(0, buf.size() - 1)] = std::int32_t(fuzz::sometimes(in, 0, -3, 9));
  }
  std::int32_t begin = 0, end = -1;
  if (in.ConsumeIntegralInRange(0, 7) == 7) {
    begin = in.ConsumeIntegralInRange<std::int32_t>(-2, std::int32_t(T) + 2);
    end = in.ConsumeIntegralInRange<std::int32_t>(-2, std::int32_t(T) + 2);
  }
  K2QPlan plan;
  try {
    plan = build_k2q(step, view, H, begin, end);
  } catch (const Error&) {
    return 0;
  }
  if (end < 0) end = std::int32_t(T);
  // Every valid entry of the range is one edge of its row, rows ascending.
  std::int64_t edges = 0;
  for (std::int64_t t = begin; t < end; ++t) {
    const std::int32_t r = meta.token_request[t];
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int32_t* ids = view.row(t, h);
      std::int32_t valid = 0;
      while (valid < K && ids[valid] >= 0) ++valid;
      FUZZ_ASSERT(plan.counts[t * H + h] == valid);
      for (std::int32_t k = 0; k < valid; ++k) {
        const std::int64_t row = h * plan.num_rows + plan.row_start[r] + ids[k];
        bool found = false;
        for (std::int64_t e = plan.offsets[row]; e < plan.offsets[row + 1]; ++e)
          found |= plan.tokens[e] == t && plan.slots[e] == k;
        FUZZ_ASSERT(found);
        ++edges;
      }
    }
  }
  FUZZ_ASSERT(std::int64_t(plan.tokens.size()) == edges);
  for (std::int64_t row = 0; row < plan.num_rows * H; ++row)
    for (std::int64_t e = plan.offsets[row] + 1; e < plan.offsets[row + 1]; ++e)
      FUZZ_ASSERT(plan.tokens[e - 1] <= plan.tokens[e]);
  return 0;
}
