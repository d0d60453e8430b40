// Unsigned division by a divisor fixed for a whole launch, as a multiply-high
// and a shift (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994): the kernel splits its item number into (token,
// head) without the long integer-division sequence. Exact for every
// dividend below 2^31 and divisor in [1, 2^31).
#pragma once

#include <cstdint>

#include "msa/common.hpp"

namespace msa::cuda {

struct FastDivisor {
  std::uint32_t d = 1;
  std::uint32_t m = 1;  // floor(2^32 (2^l - d) / d) + 1
  std::uint32_t l = 0;  // ceil(log2 d)

  FastDivisor() = default;
  explicit FastDivisor(std::uint32_t divisor) : d(divisor) {
    while ((std::uint64_t(1) << l) < d) ++l;
    m = std::uint32_t(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << l) - d)) / d + 1);
  }

  // n / d for n < 2^31 (t <= n, so t + n does not overflow).
  MSA_HD std::uint32_t divide(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(n, m);
#else
    const auto t = std::uint32_t((std::uint64_t(n) * m) >> 32);
#endif
    return (t + n) >> l;
  }
};

}  // namespace msa::cuda
