// The cos/sin table of partial NeoX RoPE (msa/pre_attention.hpp).
#include <cmath>
#include <cstdint>

#include "msa/error.hpp"
#include "msa/pre_attention.hpp"

namespace msa {

void make_rope_table(double theta, std::int64_t max_position, float* out) {
  MSA_CHECK(std::isfinite(theta) && theta > 1.0, "rope theta = ", theta, " must be finite and > 1");
  MSA_CHECK(max_position >= 0, "max_position = ", max_position, " must be >= 0");
  if (max_position > 0) MSA_CHECK(out != nullptr, "make_rope_table: out is null");
  constexpr int half = kRopeDims / 2;
  double inv_freq[half];
  for (int j = 0; j < half; ++j) inv_freq[j] = std::pow(theta, -double(j) / half);
  for (std::int64_t p = 0; p < max_position; ++p) {
    float* row = out + p * kRopeDims;
    for (int j = 0; j < half; ++j) {
      const double angle = double(p) * inv_freq[j];
      row[j] = float(std::cos(angle));
      row[half + j] = float(std::sin(angle));
    }
  }
}

}  // namespace msa
