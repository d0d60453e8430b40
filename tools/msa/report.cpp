#include "report.hpp"

#include <cinttypes>
#include <cmath>

#include "msa/error.hpp"

namespace msa::tool {

namespace {

constexpr std::size_t kMaxRequestRows = 16;  // rows of the request table in the text report

const char* scale_name(const Workload& w) {
  const DType kv = w.spec().kv_dtype;
  if (kv == DType::nvfp4) return "e4m3 group scales, global scale";
  if (!is_fp8(kv)) return "no scale";
  return w.spec().fp8_scales == ScaleMode::per_token_head ? "per-(token, head) scales"
                                                          : "per-tensor scale";
}

// "bf16", "fp8_e4m3 (e4m3 index query)", "nvfp4 (global scale 0.00390625)"
std::string index_name(const Workload& w) {
  const WorkloadSpec& spec = w.spec();
  std::string s = dtype_name(spec.index_dtype);
  if (spec.fp8_index_query) s += " (e4m3 index query)";
  if (spec.index_dtype == DType::nvfp4) s += detail::concat(" (global scale ", w.index_scale, ")");
  return s;
}

std::string mib(double bytes) {
  return detail::concat(std::round(bytes / 1048576.0 * 10.0) / 10.0, " MiB");
}

// "1 decode", "8 decodes", "1,536 tokens"
std::string count(long long n, const char* noun) {
  return with_commas(n) + " " + noun + (n == 1 ? "" : "s");
}

const char* verdict(bool ok) { return ok ? "ok" : "FAIL"; }

}  // namespace

std::string with_commas(long long n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f G", n * 1e-9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f M", n * 1e-6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f K", n * 1e-3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 1.0)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  return buf;
}

void print_report(const RunReport& r, std::FILE* out) {
  const Workload& w = *r.workload;
  const WorkloadSpec& spec = w.spec();
  const ModelConfig& m = w.model();
  const BatchMetadata& meta = w.meta();
  std::fprintf(out, "msa run: MiniMax-M3 sparse layer, TP%d rank: %s\n", r.tp,
               m.describe().c_str());
  std::fprintf(out, "engine  %s, %d threads, seed %" PRIu64 "\n", r.backend.c_str(), r.threads,
               spec.seed);
  std::fprintf(out, "caches  KV %s %s (%s), index %s, query %s; physical pages shuffled\n",
               dtype_name(spec.kv_dtype),
               spec.kv_dtype == DType::nvfp4 ? "head-slot" : layout_name(spec.layout),
               scale_name(w), index_name(w).c_str(), dtype_name(spec.q_dtype));
  std::fprintf(out, "        main %s pages (%s), index %s pages (%s)\n",
               with_commas(w.num_pages).c_str(), mib(double(w.kv_bytes.size())).c_str(),
               with_commas(w.index_num_pages).c_str(), mib(double(w.index_bytes.size())).c_str());
  std::fprintf(out, "step    %s, %s: %s x %d tokens (%d draft), %s with %s\n\n",
               count(meta.num_requests, "request").c_str(), count(meta.num_tokens, "token").c_str(),
               count(meta.num_decodes, "decode").c_str(), meta.decode_query_len, r.draft_tokens,
               count(meta.num_prefills, "prefill").c_str(),
               count(meta.num_prefill_tokens, "token").c_str());

  std::fprintf(out,
               "  req  kind       new    context    seq_len  blocks  selected/row  distinct\n");
  for (std::size_t i = 0; i < r.stats.requests.size(); ++i) {
    if (i == kMaxRequestRows) {
      std::fprintf(out, "  ... %zu more requests (see --json)\n", r.stats.requests.size() - i);
      break;
    }
    const RequestStats& q = r.stats.requests[i];
    std::fprintf(out, "  %3d  %-7s %6s %10s %10s %7d %13.1f %9.0f\n", q.request,
                 q.decode ? "decode" : "prefill", with_commas(q.query_len).c_str(),
                 with_commas(q.context_len).c_str(), with_commas(q.seq_len).c_str(), q.blocks,
                 q.selected_per_row, q.distinct_blocks);
  }
  std::fprintf(
      out,
      "  (selected/row: top-k entries per token and KV head; distinct: blocks chosen by any of\n"
      "   the request's tokens, per KV head)\n\n");

  std::fprintf(out, "  stage    time       work\n");
  for (const StageTime& s : r.stages) {
    std::fprintf(out, "  %-8s %-10s %s\n", s.name.c_str(), format_seconds(s.seconds).c_str(),
                 s.work.c_str());
  }

  const CheckResult& c = r.check;
  std::int64_t decode_rows = 0;
  for (std::int32_t t : c.rows) decode_rows += t < meta.num_decode_tokens;
  std::fprintf(out,
               "\ncheck against the float64 oracle on %zu sampled rows (%" PRId64
               " decode, %" PRId64 " prefill), all query heads:\n",
               c.rows.size(), decode_rows, std::int64_t(c.rows.size()) - decode_rows);
  std::fprintf(out, "  out    max relative Frobenius error %.2e (row %d)   bound %.0e   %s\n",
               c.max_out_rel, c.worst_out_row, c.tol.out_rel, verdict(c.out_ok()));
  std::fprintf(out, "  lse    max absolute error           %.2e (row %d)   bound %.0e   %s\n",
               c.max_lse_abs, c.worst_lse_row, c.tol.lse_abs, verdict(c.lse_ok()));
  std::fprintf(out,
               "  index  %" PRId64
               " (token, KV head) selections against float64 block scores: %" PRId64
               " wrong   %s\n",
               c.index_rows, c.index_bad_rows, verdict(c.index_ok()));
  if (c.nonfinite_mismatches) {
    std::fprintf(
        out, "  %" PRId64 " non-finite values where the oracle has finite ones (or the reverse)\n",
        c.nonfinite_mismatches);
  }
  if (r.pre_attention) {
    const PreAttentionCheck& p = *r.pre_attention;
    const PreAttentionCheck::Output* worst = p.worst();
    std::int64_t differ = 0, values = 0;
    for (const PreAttentionCheck::Output& o : p.outputs) differ += o.differ, values += o.values;
    std::fprintf(out,
                 "  pre    q, index q, K, V, index keys of %s tokens against float64 norm + RoPE: max relative\n"
                 "         Frobenius error %.2e (%s), %s of %s values differ   bound %.0e   %s\n",
                 with_commas(p.tokens).c_str(), worst ? worst->rel : 0.0, worst ? worst->name.c_str() : "-",
                 with_commas(differ).c_str(), with_commas(values).c_str(), p.bound, verdict(p.passed()));
  }
  for (const std::string* p : {&c.out_problem, &c.lse_problem, &c.index_problem}) {
    if (!p->empty()) std::fprintf(out, "  first problem: %s\n", p->c_str());
  }
  if (r.pre_attention && !r.pre_attention->problem.empty())
    std::fprintf(out, "  first problem: %s\n", r.pre_attention->problem.c_str());
  const IndexAgreement& a = r.agreement;
  if (a.measured) {
    std::fprintf(out,
                 "\nindex %s against a bf16 index of the same keys (same engine): %.2f%% of the %s\n"
                 "  non-forced blocks the bf16 index selects are kept; %s of %s (token, KV head)\n"
                 "  rows with a choice select the same blocks\n",
                 dtype_name(spec.index_dtype), 100.0 * a.fraction(), with_commas(a.reference_blocks).c_str(),
                 with_commas(a.identical_rows).c_str(), with_commas(a.rows).c_str());
  }
  std::fprintf(out, "%s (total %s)\n", r.passed() ? "PASS" : "FAIL",
               format_seconds(r.total_seconds).c_str());
}

nlohmann::json report_json(const RunReport& r) {
  using nlohmann::json;
  const Workload& w = *r.workload;
  const WorkloadSpec& spec = w.spec();
  const ModelConfig& m = w.model();
  const BatchMetadata& meta = w.meta();
  json j;
  j["command"] = "run";
  j["model"] = {{"tp", r.tp},
                {"num_q_heads", m.num_q_heads},
                {"num_kv_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"block_size", m.block_size},
                {"topk", m.topk},
                {"init_blocks", m.init_blocks},
                {"local_blocks", m.local_blocks},
                {"softmax_scale", m.softmax_scale}};
  j["backend"] = r.backend;
  j["threads"] = r.threads;
  j["seed"] = spec.seed;
  j["kv_dtype"] = dtype_name(spec.kv_dtype);
  j["layout"] = spec.kv_dtype == DType::nvfp4 ? "head-slot" : layout_name(spec.layout);
  j["kv_scales"] = scale_name(w);
  j["index_dtype"] = dtype_name(spec.index_dtype);
  j["index_query_dtype"] = dtype_name(spec.fp8_index_query ? DType::fp8_e4m3 : w.src_dtype());
  if (spec.index_dtype == DType::nvfp4) j["index_global_scale"] = w.index_scale;
  j["q_dtype"] = dtype_name(spec.q_dtype);
  j["pages"] = {{"main", w.num_pages},
                {"index", w.index_num_pages},
                {"main_bytes", w.kv_bytes.size()},
                {"index_bytes", w.index_bytes.size()}};
  j["step"] = {
      {"num_requests", meta.num_requests},      {"num_tokens", meta.num_tokens},
      {"num_decodes", meta.num_decodes},        {"decode_query_len", meta.decode_query_len},
      {"num_prefills", meta.num_prefills},      {"num_prefill_tokens", meta.num_prefill_tokens},
      {"keys_attended", r.stats.keys_attended}, {"index_keys_scored", r.stats.index_keys_scored}};
  json reqs = json::array();
  for (const RequestStats& q : r.stats.requests) {
    reqs.push_back({{"request", q.request},
                    {"kind", q.decode ? "decode" : "prefill"},
                    {"query_len", q.query_len},
                    {"context_len", q.context_len},
                    {"seq_len", q.seq_len},
                    {"blocks", q.blocks},
                    {"selected_per_row", q.selected_per_row},
                    {"distinct_blocks", q.distinct_blocks},
                    {"keys_attended", q.keys_attended}});
  }
  j["requests"] = reqs;
  json stages = json::object();
  for (const StageTime& s : r.stages) stages[s.name] = {{"seconds", s.seconds}, {"work", s.work}};
  j["stages"] = stages;
  const CheckResult& c = r.check;
  json problems = json::array();
  for (const std::string* p : {&c.out_problem, &c.lse_problem, &c.index_problem}) {
    if (!p->empty()) problems.push_back(*p);
  }
  j["check"] = {{"rows", c.rows},
                {"out_max_rel_frobenius", c.max_out_rel},
                {"out_worst_row", c.worst_out_row},
                {"out_bound", c.tol.out_rel},
                {"lse_max_abs", c.max_lse_abs},
                {"lse_worst_row", c.worst_lse_row},
                {"lse_bound", c.tol.lse_abs},
                {"nonfinite_mismatches", c.nonfinite_mismatches},
                {"index_rows", c.index_rows},
                {"index_bad_rows", c.index_bad_rows},
                {"index_worst_gap", c.index_worst_gap},
                {"index_gap_bound", {{"abs", c.tol.index_gap_abs}, {"rel", c.tol.index_gap_rel}}},
                {"problems", problems},
                {"passed", c.passed()}};
  if (r.agreement.measured) {
    const IndexAgreement& a = r.agreement;
    j["index_agreement"] = {{"reference", "bf16 index cache of the same keys, same engine"},
                            {"counted", "non-forced blocks of rows with more eligible blocks than topk"},
                            {"fraction_kept", a.fraction()},
                            {"reference_blocks", a.reference_blocks},
                            {"kept_blocks", a.kept},
                            {"rows", a.rows},
                            {"identical_rows", a.identical_rows}};
  } else {
    j["index_agreement"] = nullptr;
  }
  if (r.pre_attention) {
    json outputs = json::array();
    for (const PreAttentionCheck::Output& o : r.pre_attention->outputs)
      outputs.push_back({{"name", o.name}, {"values", o.values}, {"differ", o.differ}, {"rel_frobenius", o.rel}});
    j["pre_attention"] = {{"tokens", r.pre_attention->tokens},
                          {"bound", r.pre_attention->bound},
                          {"outputs", outputs},
                          {"problem", r.pre_attention->problem},
                          {"passed", r.pre_attention->passed()}};
  }
  j["total_seconds"] = r.total_seconds;
  j["passed"] = r.passed();
  return j;
}

}  // namespace msa::tool
