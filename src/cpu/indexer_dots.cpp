// Key-block decoding, the portable max-dot kernel and the choice of kernel.
#include "cpu/indexer_dots.hpp"

#include <array>
#include <cmath>
#include <cstdint>

#include "msa/dtype.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu::indexer {

namespace {

constexpr int kTile = 16;  // transpose tile: 16 keys x 16 features

// Decodes with `decode` and transposes [128 keys][128 d] -> [128 d][128 keys],
// tile by tile so both sides stay in a few cache lines.
template <typename T, typename Decode>
void transpose_block(const T* src, float* dst, Decode decode) {
  for (int j0 = 0; j0 < kBlockSize; j0 += kTile) {
    for (int d0 = 0; d0 < kHeadDim; d0 += kTile) {
      for (int j = j0; j < j0 + kTile; ++j) {
        const T* row = src + std::int64_t(j) * kHeadDim;
        for (int d = d0; d < d0 + kTile; ++d) dst[d * kBlockSize + j] = decode(row[d]);
      }
    }
  }
}

// e4m3 code -> float, built once from the bit-exact scalar decoder.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = num::e4m3_to_float(std::uint8_t(c));
    return t;
  }();
  return table;
}

}  // namespace

void load_key_block(const IndexCacheView& cache, std::int64_t page, KeyBlock& out) {
  const std::int64_t first = cache.offset(page, 0, 0);
  if (cache.dtype == DType::bf16) {
    const auto* src = static_cast<const std::uint16_t*>(cache.base) + first;
    transpose_block(src, out.v, [](std::uint16_t h) { return num::bf16_to_float(h); });
  } else if (cache.dtype == DType::fp8_e4m3) {
    const auto* src = static_cast<const std::uint8_t*>(cache.base) + first;
    const float* table = e4m3_table().data();
    transpose_block(src, out.v, [table](std::uint8_t c) { return table[c]; });
  } else if (cache.dtype == DType::nvfp4) {
    const float* table = e4m3_table().data();
    for (int j = 0; j < kBlockSize; ++j) {
      const auto* row = static_cast<const std::uint8_t*>(cache.base) + index_nvfp4::row_offset(cache, page, j);
      for (int d = 0; d < kHeadDim; ++d) {
        const std::uint8_t code = (row[d / 2] >> (4 * (d % 2))) & 0xF;
        out.v[d * kBlockSize + j] =
            num::e2m1_to_float(code) * table[row[index_nvfp4::kDataBytes + d / 16]] * cache.global_scale;
      }
    }
  } else {
    fail("index cache dtype = ", dtype_name(cache.dtype), " but the indexer reads bf16, fp8_e4m3 or nvfp4");
  }
}

void max_dots_generic(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                      const std::int32_t* visible, float* out, std::int64_t out_stride) {
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const float* qr = q + r * kHeadDim;
    float acc[kBlockSize] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      const float qd = qr[d];
      const float* kd = keys.v + d * kBlockSize;
      for (int j = 0; j < kBlockSize; ++j) acc[j] = std::fma(qd, kd[j], acc[j]);
    }
    const int n = visible ? visible[r] : kBlockSize;
    float best = NAN;
    for (int j = 0; j < n; ++j) best = max_nan_lowest(best, acc[j]);
    out[r * out_stride] = best;
  }
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::generic: return true;
#if defined(MSA_INDEXER_X86)
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512: return __builtin_cpu_supports("avx512f");
#else
    case Isa::avx2:
    case Isa::avx512: return false;
#endif
  }
  return false;
}

MaxDotsFn max_dots_kernel(Isa isa) {
  MSA_CHECK(isa_supported(isa), "indexer kernel isa = ", isa_name(isa),
            " is not supported by this build or CPU");
  switch (isa) {
#if defined(MSA_INDEXER_X86)
    case Isa::avx2: return &max_dots_avx2;
    case Isa::avx512: return &max_dots_avx512;
#endif
    default: return &max_dots_generic;
  }
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::avx512) ? Isa::avx512
                          : isa_supported(Isa::avx2) ? Isa::avx2
                                                     : Isa::generic;
  return best;
}

}  // namespace msa::cpu::indexer
