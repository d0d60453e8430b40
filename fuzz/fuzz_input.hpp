// Shared by the fuzz targets: turning fuzzer bytes into small steps and
// sometimes-wrong numbers. An all-zero input gives a small valid case, so the
// seed corpus (fuzz/corpus/<target>/) starts from inputs that reach the
// operations, and the fuzzer's mutations break one thing at a time.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "msa/batch.hpp"
#include "msa/error.hpp"

namespace msa::fuzz {

// Stops the run on a broken property: libFuzzer reports the input.
#define FUZZ_ASSERT(cond)          \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

// Mostly `usual`, sometimes a value from `lo..hi`, sometimes an extreme.
inline std::int64_t sometimes(FuzzedDataProvider& in, std::int64_t usual, std::int64_t lo, std::int64_t hi) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 13: return in.ConsumeIntegralInRange(lo, hi);
    case 14: return in.PickValueInArray<std::int64_t>({-1, 0, 1, std::int64_t(1) << 31, std::int64_t(1) << 40,
                                                         std::numeric_limits<std::int64_t>::max(),
                                                         std::numeric_limits<std::int64_t>::min()});
    case 15: return usual + in.ConsumeIntegralInRange<std::int64_t>(-3, 3);
    default: return usual;
  }
}

// A valid step of up to 4 requests (decodes of a shared query length first),
// contexts below 400 tokens, at most 46 tokens.
inline BatchMetadata small_step(FuzzedDataProvider& in) {
  BatchSpec spec;
  const int decodes = in.ConsumeIntegralInRange(0, 3);
  const int prefills = in.ConsumeIntegralInRange(decodes == 0 ? 1 : 0, 2);
  const int qlen = 1 + in.ConsumeIntegralInRange(0, 3);
  spec.decode_threshold = qlen;
  for (int r = 0; r < decodes + prefills; ++r) {
    const bool decode = r < decodes;
    const std::int32_t q = decode ? qlen : qlen + 1 + in.ConsumeIntegralInRange(0, 12);
    const std::int32_t context = in.ConsumeIntegralInRange(0, 399);
    const bool padding = in.ConsumeIntegralInRange(0, 9) == 9;
    spec.query_lens.push_back(q);
    spec.seq_lens.push_back(padding ? 0 : q + context);
  }
  return build_metadata(spec);
}

inline std::int32_t blocks_of(std::int64_t seq_len) { return std::int32_t((seq_len + 127) / 128); }

}  // namespace msa::fuzz
