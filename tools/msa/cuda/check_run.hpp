// One case of `msa check`: insert, index and attend on the GPU, each compared
// with the CPU engine on the same inputs (check_run.cpp).
#pragma once

#include <string>
#include <vector>

#include "check_cases.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

struct CheckRow {
  std::string what;   // insert.kv, insert.index, index.scores, index.topk, attend.out, attend.lse,
                      // pre.q, pre.index_q, pre.kv, pre.index_k, device_check
  double error = 0.0;
  double bound = 0.0;
  bool pass = false;
  std::string note;   // the worst element or the error message
};

struct CaseResult {
  std::vector<CheckRow> rows;
  double seconds = 0.0;
  std::string fatal;  // a sticky CUDA error: later cases cannot run
};

CaseResult run_check_case(const CheckCase& c, cuda::Stream stream);

}  // namespace msa::tool
