// The fp8 e4m3 index query (contract 3): a plain saturating cast, the one the
// fp8 index cache applies to the keys.
#include <cstdint>

#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

void cast_index_query_e4m3(const void* src, DType src_dtype, std::int64_t n, void* dst, const Options& opt) {
  check_options(opt);
  MSA_CHECK(is_half(src_dtype), "cast_index_query_e4m3: src_dtype = ", dtype_name(src_dtype),
            " but the index query must be bf16 or fp16");
  MSA_CHECK(n >= 0, "cast_index_query_e4m3: n = ", n, " must be >= 0");
  if (n == 0) return;
  MSA_CHECK(src != nullptr, "cast_index_query_e4m3: src is null with n = ", n);
  MSA_CHECK(dst != nullptr, "cast_index_query_e4m3: dst is null with n = ", n);
  const auto* in = static_cast<const std::uint16_t*>(src);
  auto* out = static_cast<std::uint8_t*>(dst);
  const bool bf16 = src_dtype == DType::bf16;
  parallel_for(n, opt.num_threads, std::int64_t(1) << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float x = bf16 ? num::bf16_to_float(in[i]) : num::fp16_to_float(in[i]);
      out[i] = num::float_to_e4m3(x);
    }
  });
}

}  // namespace msa::cpu
