// Counter-based random numbers of the bench's device fills: a splitmix64 hash
// of (seed, index) and a normal draw from one hash.
#pragma once

#include <cstdint>

namespace msa::tool {

__device__ __forceinline__ std::uint64_t hash64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// N(0, 1) from one 64-bit hash (Box-Muller on its two halves).
__device__ __forceinline__ float normal_from(std::uint64_t h) {
  const float u1 = (float(std::uint32_t(h >> 40)) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = float(std::uint32_t(h) & 0xFFFFFFu) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

}  // namespace msa::tool
