// The report of `msa run`: a short text a person can read, and the same facts
// as JSON for machines.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "index_agreement.hpp"
#include "oracle_check.hpp"
#include "pre_attention_check.hpp"
#include "step_stats.hpp"
#include "workload.hpp"

namespace msa::tool {

struct StageTime {
  std::string name;  // setup, insert, index, attend, check
  double seconds = 0.0;
  std::string work;  // what the stage did, in words
};

struct RunReport {
  const Workload* workload = nullptr;
  int tp = 0;
  std::string backend;
  int threads = 0;
  int draft_tokens = 0;
  StepStats stats;
  std::vector<StageTime> stages;
  CheckResult check;
  IndexAgreement agreement;  // fp8 / nvfp4 index against the bf16 index (measured = false for bf16)
  std::optional<PreAttentionCheck> pre_attention;  // when the step started from the qkv rows
  double total_seconds = 0.0;

  bool passed() const { return check.passed() && (!pre_attention || pre_attention->passed()); }
};

// "1,234,567"
std::string with_commas(long long n);
// "52.1 M", "3.4 K", "17"
std::string format_count(double n);
// "812 ms", "2.41 s", "35 us"
std::string format_seconds(double s);

void print_report(const RunReport& r, std::FILE* out);
nlohmann::json report_json(const RunReport& r);

}  // namespace msa::tool
