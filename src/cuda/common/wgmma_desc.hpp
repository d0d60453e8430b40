// The shared-memory matrix descriptor of wgmma for the 128-byte-swizzled
// tiles of the token-tile kernel (wgmma.cuh), as two 32-bit words so that
// stepping along a tile is one add. Host and device, so that a CPU test
// (tests/unit/test_wgmma_desc.cpp) checks the stepping against the fields of
// the PTX ISA's descriptor: start address >> 4 in bits 0-13, leading byte
// offset >> 4 in bits 16-29, stride byte offset >> 4 in bits 32-45, base
// offset 0 in bits 49-51, swizzle mode in bits 62-63 (1 = 128 bytes).
#pragma once

#include <cstdint>

#include "msa/common.hpp"

namespace msa::cuda::sm90 {

// addr: shared address of the first element; lbo / sbo: leading / stride byte
// offsets (K-major: sbo = the stride of 8-row groups, lbo unused; MN-major:
// lbo = the stride of 64-element groups along M/N, sbo = the stride of 8-row
// groups along K). lo holds the start address and lbo, hi sbo and the mode.
// The operand `bytes` further on (a multiple of 16, still inside shared
// memory, so that the 14-bit address field does not carry) is lo + bytes / 16.
struct Sw128Desc {
  std::uint32_t lo, hi;
  MSA_HD std::uint64_t at(std::uint32_t bytes) const {
    return (std::uint64_t(hi) << 32) | std::uint64_t(lo + (bytes >> 4));
  }
};
MSA_HD Sw128Desc sw128_desc(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return {((addr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16), (sbo >> 4) | (1u << 30)};
}

}  // namespace msa::cuda::sm90
