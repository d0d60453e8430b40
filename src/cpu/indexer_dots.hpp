// The inner loop of the CPU indexer: one block of 128 index keys against many
// index-query rows, reduced to one "max" block score per row.
//
// Arithmetic order (the same in every kernel, so scores are bit-identical on
// every CPU): each dot product is a chain of fp32 fused multiply-adds over
// d = 0..127 in order, starting from +0:
//     acc = 0; for d in 0..127: acc = fma(q[d], k[d], acc)
// The block score is the maximum of the visible dots with NaN counting as the
// lowest value: NaN dots are ignored, and the score is NaN only when every
// visible dot is NaN (contract 5, "NaN counts as the lowest score").
#pragma once

#include <cstdint>

#include "msa/cache.hpp"
#include "msa/common.hpp"

namespace msa::cpu::indexer {

// One block of the index cache as fp32, transposed: v[d * 128 + j] is element d
// of key j (token j of the page). [128 d][128 keys], 64-byte aligned.
struct alignas(64) KeyBlock {
  float v[kHeadDim * kBlockSize];
};

// Decodes page `page` of the index cache into `out`: bf16 and fp8 e4m3 values
// exactly; nvfp4 values as e2m1(code) * group scale * global_scale, multiplied
// left to right in fp32 (the first product is exact, so each key is the real
// dequantized value rounded once).
void load_key_block(const IndexCacheView& cache, std::int64_t page, KeyBlock& out);

// For every row r < num_rows:
//   out[r * out_stride] = NaN-lowest max over keys j < visible[r] of dot(q[r], key j)
// with all 128 keys visible when `visible` is null (visible[r] = 0 gives NaN).
//   q:       [num_rows, 128] fp32, rows contiguous
//   visible: [num_rows] in [0, 128], or null
//   out:     num_rows scores, out_stride floats apart
using MaxDotsFn = void (*)(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                           const std::int32_t* visible, float* out, std::int64_t out_stride);

enum class Isa : std::uint8_t { generic, avx2, avx512 };
const char* isa_name(Isa isa);
// Whether this build and this CPU can run the kernel of `isa`.
bool isa_supported(Isa isa);
// The kernel of one instruction set (tests compare them); throws msa::Error when
// it is not supported here.
MaxDotsFn max_dots_kernel(Isa isa);
// The fastest supported kernel.
Isa best_isa();

// The kernels behind max_dots_kernel(). The x86 ones exist only where
// MSA_INDEXER_X86 is defined (GCC or Clang targeting x86-64).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MSA_INDEXER_X86 1
void max_dots_avx2(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                   const std::int32_t* visible, float* out, std::int64_t out_stride);
void max_dots_avx512(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                     const std::int32_t* visible, float* out, std::int64_t out_stride);
#endif
void max_dots_generic(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                      const std::int32_t* visible, float* out, std::int64_t out_stride);

// NaN-lowest maximum of two scores: b when a is NaN or b > a, else a.
inline float max_nan_lowest(float a, float b) { return (b > a || a != a) ? b : a; }

}  // namespace msa::cpu::indexer
