// The pre-attention stage of one `msa check` case (check_pre_attention.cpp).
#pragma once

#include <string>
#include <vector>

#include "check_cases.hpp"
#include "check_run.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

// A synthetic qkv step of the case's shape (its tokens; nq = its query heads,
// nkv = niq = its KV heads, qkv in its source dtype, q in its query dtype)
// through cuda::pre_attention and cpu::pre_attention into fresh caches of its
// KV flavor, layout, page stride and index dtype. Rows pre.q, pre.index_q,
// pre.kv (cache bytes and per-token scales) and pre.index_k count the bytes
// that differ (bound 0: the kernel is bit-identical to the CPU engine); what
// the DeviceCheck recorded is appended to `recorded`.
void pre_attention_stage(const CheckCase& c, cuda::Stream stream, const cuda::DeviceCheck& check,
                         std::vector<CheckRow>& rows, std::vector<std::string>& recorded);

}  // namespace msa::tool
