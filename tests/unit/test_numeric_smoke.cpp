#include <gtest/gtest.h>

#include "msa/numeric.hpp"

TEST(NumericSmoke, Bf16RoundTrip) {
  EXPECT_EQ(msa::num::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(msa::num::bf16_to_float(0x3F80), 1.0f);
}
