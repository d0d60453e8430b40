// build_metadata on any lengths: it throws msa::Error or returns metadata that
// passes the step checks and follows the contract's formulas.
#include <cstdint>

#include "core/checks.hpp"
#include "fuzz_input.hpp"

using namespace msa;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  BatchSpec spec;
  spec.decode_threshold = std::int32_t(fuzz::sometimes(in, in.ConsumeIntegralInRange(0, 4), -3, 40));
  const int n = in.ConsumeIntegralInRange(0, 40);
  std::int64_t tokens = 0;
  for (int r = 0; r < n; ++r) {
    const auto q = std::int32_t(fuzz::sometimes(in, in.ConsumeIntegralInRange(0, 20), -5, 1 << 30));
    const auto s = std::int32_t(fuzz::sometimes(in, q + in.ConsumeIntegralInRange(0, 3000), -5, 1 << 30));
    spec.query_lens.push_back(q);
    spec.seq_lens.push_back(s);
    if (q > 0) tokens += q;
  }
  if (in.ConsumeIntegralInRange(0, 31) == 0 && n > 0) spec.seq_lens.pop_back();  // sizes that differ
  // Steps of a million tokens or more but within int32 are valid and only slow.
  if (tokens > (1 << 20) && tokens <= std::numeric_limits<std::int32_t>::max()) return 0;
  BatchMetadata m;
  try {
    m = build_metadata(spec);
  } catch (const Error&) {
    return 0;
  }
  check::step_data(m.view());
  FUZZ_ASSERT(m.num_requests == n && m.num_tokens == tokens);
  FUZZ_ASSERT(m.num_decodes + m.num_prefills == n);
  std::int32_t prefill_keys = 0;
  for (std::int32_t r = 0; r < n; ++r) {
    const std::int32_t q = spec.query_lens[r], s = spec.seq_lens[r];
    const bool decode = r < m.num_decodes;
    FUZZ_ASSERT(decode == (q > 0 && q <= spec.decode_threshold));
    FUZZ_ASSERT(!decode || q == m.decode_query_len);
    FUZZ_ASSERT(m.query_start[r + 1] - m.query_start[r] == q);
    FUZZ_ASSERT(m.context_lens[r] == (s == 0 ? 0 : s - q));
    for (std::int32_t i = 0; i < q; ++i) {
      const std::int32_t t = m.query_start[r] + i;
      FUZZ_ASSERT(m.token_request[t] == r);
      FUZZ_ASSERT(m.token_position[t] == (s == 0 ? -1 : s - q + i));
      FUZZ_ASSERT(m.view().position(t) == m.token_position[t]);
    }
    if (!decode) {
      prefill_keys += s;
      FUZZ_ASSERT(m.cu_seqlens_k[r - m.num_decodes + 1] == prefill_keys);
    }
  }
  return 0;
}
