// A CUDA attention plan travels through Python as the bytes of the struct in a
// host uint8 array ("plan blob"), so that the plan is a plain tensor argument
// for torch.library ops and lives as long as the caller keeps it.
#pragma once

#if MSA_HAVE_CUDA
#include <cstring>
#include <type_traits>

#include "arrays.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::py {

// If the plan ever holds owning members, pass it as a handle instead.
static_assert(std::is_trivially_copyable_v<cuda::AttentionPlan>,
              "the plan blob copies msa::cuda::AttentionPlan as bytes");
inline constexpr std::size_t kPlanBytes = sizeof(cuda::AttentionPlan);

inline void expect_plan_blob(const Array& blob) {
  MSA_CHECK(blob.device_type() == 1 && blob.ndim() == 1 && blob.dtype().bits == 8 && blob.shape(0) == kPlanBytes &&
                (blob.shape(0) <= 1 || blob.stride(0) == 1),
            "plan: must be a host uint8 array of attention_plan_bytes = ", kPlanBytes,
            " bytes made by plan_attention");
}

inline cuda::AttentionPlan read_plan(const Array& blob) {
  expect_plan_blob(blob);
  cuda::AttentionPlan plan;
  std::memcpy(&plan, data_of(blob), kPlanBytes);
  return plan;
}

inline void write_plan(const cuda::AttentionPlan& plan, const Array& blob) {
  expect_plan_blob(blob);
  std::memcpy(data_of(blob), &plan, kPlanBytes);
}

}  // namespace msa::py
#endif
