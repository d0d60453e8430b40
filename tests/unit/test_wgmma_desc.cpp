// The wgmma descriptor words of src/cuda/attention/wgmma_desc.hpp against the
// PTX ISA's field layout: stepping a descriptor by one add must give exactly
// the descriptor of the moved address, for every 16-byte-aligned address and
// step inside the 256 KiB the address field spans.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/common/wgmma_desc.hpp"

namespace {

namespace sm90 = msa::cuda::sm90;

// The PTX ISA's shared-memory matrix descriptor, built field by field.
std::uint64_t ptx_descriptor(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  const std::uint64_t start = (addr >> 4) & 0x3FFFu;  // bits 0-13
  const std::uint64_t lead = (lbo >> 4) & 0x3FFFu;    // bits 16-29
  const std::uint64_t stride = (sbo >> 4) & 0x3FFFu;  // bits 32-45
  const std::uint64_t swizzle_128b = 1;               // bits 62-63
  return start | (lead << 16) | (stride << 32) | (swizzle_128b << 62);
}

constexpr std::uint32_t kSpan = 1u << 18;  // what the 14-bit address field (>> 4) covers

TEST(WgmmaDesc, FieldsOfTheKernelsOperands) {
  // K-major Q / K tiles (lbo 16, sbo 1024) and the MN-major V tile (lbo 16 KiB, sbo 1024).
  EXPECT_EQ(sm90::sw128_desc(0x8000, 16, 1024).at(0), ptx_descriptor(0x8000, 16, 1024));
  EXPECT_EQ(sm90::sw128_desc(0x20400, 16384, 1024).at(0), ptx_descriptor(0x20400, 16384, 1024));
  const std::uint64_t v = sm90::sw128_desc(0x20400, 16384, 1024).at(0);
  EXPECT_EQ(v & 0x3FFFu, 0x20400u >> 4);
  EXPECT_EQ((v >> 16) & 0x3FFFu, 16384u >> 4);
  EXPECT_EQ((v >> 32) & 0x3FFFu, 1024u >> 4);
  EXPECT_EQ(v >> 62, 1u);
  EXPECT_EQ((v >> 49) & 7u, 0u);  // base offset: the tiles are 1 KiB aligned
}

TEST(WgmmaDesc, OneAddStepsEqualTheMovedAddressEverywhere) {
  for (const std::uint32_t lbo : {16u, 16384u}) {
    long mismatches = 0;
    for (std::uint32_t base = 0; base < kSpan; base += 16) {
      const sm90::Sw128Desc d = sm90::sw128_desc(base, lbo, 1024);
      for (std::uint32_t step = 0; base + step < kSpan; step += 16)
        mismatches += d.at(step) != ptx_descriptor(base + step, lbo, 1024);
    }
    EXPECT_EQ(mismatches, 0) << "lbo " << lbo;
  }
}

TEST(WgmmaDesc, AStepPastTheSpanWouldCarry) {
  // Why the steps must stay inside shared memory: past 256 KiB the add runs
  // into the leading-offset field instead of wrapping the address.
  const sm90::Sw128Desc d = sm90::sw128_desc(kSpan - 16, 16, 1024);
  EXPECT_NE(d.at(16), ptx_descriptor(kSpan, 16, 1024));
}

}  // namespace
