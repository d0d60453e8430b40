// `msa check`'s pre-attention stage: the GPU and the CPU engine on the same
// synthetic qkv rows (tests/support/pre_attention_inputs.hpp), byte for byte.
#include "check_pre_attention.hpp"

#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>

#include "check_compare.hpp"
#include "device_memory.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "pre_attention_inputs.hpp"
#include "rng.hpp"

namespace msa::tool {

namespace {

test::PreAttentionCase case_of(const CheckCase& c) {
  Rng rng(c.seed ^ 0x9E3A77E4ull);
  static constexpr DType kTables[] = {DType::f32, DType::bf16, DType::fp16};
  test::PreAttentionCase p;
  p.src = c.src_dtype;
  p.kv = c.kv_dtype;
  p.scales = c.scale_mode;
  p.layout = c.layout;
  p.page_pad = c.padded_stride ? (c.kv_dtype == DType::nvfp4 ? 2 * nvfp4::kSlotBytes : 8 * 256) : 0;
  p.index = c.index_dtype;
  p.q = c.q_dtype;
  p.iq = c.index_dtype == DType::fp8_e4m3 && rng.chance(0.5) ? DType::fp8_e4m3 : c.src_dtype;
  p.weight = kTables[rng.between(0, 2)];
  p.table = kTables[rng.between(0, 2)];
  p.nq = c.num_q_heads();
  p.nkv = c.num_kv_heads;
  p.niq = c.num_kv_heads;
  p.tokens = c.num_tokens();
  p.row_pad = rng.chance(0.25) ? 8 : 0;
  p.own_index_slots = c.own_index_table;
  p.seed = c.seed ^ 0x51A7E5ull;
  return p;
}

CheckRow bytes_row(const std::string& what, const std::vector<std::uint8_t>& got,
                   const std::vector<std::uint8_t>& want, std::size_t n, const std::string& extra = "") {
  const Diff d = byte_mismatch(got.data(), want.data(), n);
  CheckRow r;
  r.what = what;
  r.error = d.error;
  r.bound = 0;
  r.pass = d.count == 0;
  if (!r.pass) {
    std::ostringstream s;
    s << d.count << " bytes differ; first: byte " << d.worst << " gpu 0x" << std::hex << int(d.got) << " cpu 0x"
      << int(d.want) << std::dec << extra;
    r.note = s.str();
  }
  return r;
}

// Largest distance in ulps between the 16-bit codes of two outputs.
std::string ulps(DType dtype, const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  if (dtype == DType::fp8_e4m3) return "";
  int worst = 0;
  for (std::size_t i = 0; i + 1 < want.size(); i += 2) {
    std::uint16_t g, w;
    std::memcpy(&g, &got[i], 2);
    std::memcpy(&w, &want[i], 2);
    const int d = ((g ^ w) & 0x8000) ? 1 << 16 : (g > w ? g - w : w - g);
    worst = d > worst ? d : worst;
  }
  return "; largest distance " + std::to_string(worst) + " ulp";
}

CheckRow failed(const std::string& what, const std::string& why) {
  CheckRow r;
  r.what = what;
  r.error = kInf;
  r.bound = 0;
  r.pass = false;
  r.note = why;
  return r;
}

}  // namespace

void pre_attention_stage(const CheckCase& c, cuda::Stream stream, const cuda::DeviceCheck& check,
                         std::vector<CheckRow>& rows, std::vector<std::string>& recorded) {
  static const char* kRows[] = {"pre.q", "pre.index_q", "pre.kv", "pre.index_k"};
  test::PreAttentionInputs in = test::make_pre_attention_inputs(case_of(c));
  test::PreAttentionInputs cpu = in;
  try {
    cpu::pre_attention(cpu.view(cpu.cache.data(), cpu.k_scales.data(), cpu.v_scales.data()),
                       cpu.index_view(cpu.index_cache.data()), cpu.args());
  } catch (const std::exception& e) {
    for (const char* w : kRows) rows.push_back(failed(w, std::string("CPU reference: ") + e.what()));
    return;
  }

  const DeviceBuffer qkv = to_device(in.qkv), cos_sin = to_device(in.cos_sin);
  const DeviceBuffer positions = to_device(in.positions), slots = to_device(in.slots);
  const DeviceBuffer index_slots = to_device(in.index_slots);
  const DeviceBuffer w0 = to_device(in.weights[0]), w1 = to_device(in.weights[1]);
  const DeviceBuffer w2 = to_device(in.weights[2]), w3 = to_device(in.weights[3]);
  DeviceBuffer cache = to_device(in.cache), index_cache = to_device(in.index_cache);
  DeviceBuffer k_scales = to_device(in.k_scales), v_scales = to_device(in.v_scales);
  DeviceBuffer q = to_device(in.q), iq = to_device(in.iq);
  PreAttentionArgs a = in.args();
  a.qkv = qkv.get();
  a.positions = positions.as<std::int64_t>();
  a.q_weight = w0.get();
  a.k_weight = w1.get();
  a.index_q_weight = w2.get();
  a.index_k_weight = w3.get();
  a.cos_sin = cos_sin.get();
  a.q = q.get();
  a.index_q = iq.get();
  a.slots = slots.as<std::int64_t>();
  a.index_slots = in.c.own_index_slots ? index_slots.as<std::int64_t>() : nullptr;
  try {
    cuda::reset_check(check, stream);
    cuda::pre_attention(in.view(cache.get(), k_scales.as<float>(), v_scales.as<float>()),
                        in.index_view(index_cache.get()), a, stream, check);
    sync_stream(stream);
  } catch (const std::exception& e) {
    for (const char* w : kRows) rows.push_back(failed(w, std::string("GPU: ") + e.what()));
    return;
  }
  try {
    cuda::read_check(check, stream);
  } catch (const std::exception& e) {
    recorded.push_back(std::string("pre-attention: ") + e.what());
  }

  const auto g_q = to_host<std::uint8_t>(q, in.q.size()), g_iq = to_host<std::uint8_t>(iq, in.iq.size());
  rows.push_back(bytes_row("pre.q", g_q, cpu.q, cpu.q.size(), ulps(in.c.q, g_q, cpu.q)));
  rows.push_back(bytes_row("pre.index_q", g_iq, cpu.iq, cpu.iq.size(), ulps(in.c.iq, g_iq, cpu.iq)));
  std::vector<std::uint8_t> g_cache = to_host<std::uint8_t>(cache, in.cache.size());
  std::vector<std::uint8_t> want = cpu.cache;  // the scales after the cache bytes
  for (const auto* v : {&k_scales, &v_scales}) {
    const auto s = to_host<std::uint8_t>(*v, v->bytes());
    g_cache.insert(g_cache.end(), s.begin(), s.end());
  }
  for (const auto* s : {&cpu.k_scales, &cpu.v_scales}) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(s->data());
    want.insert(want.end(), b, b + 4 * s->size());
  }
  rows.push_back(bytes_row("pre.kv", g_cache, want, want.size()));
  const auto g_index = to_host<std::uint8_t>(index_cache, in.index_cache.size());
  rows.push_back(bytes_row("pre.index_k", g_index, cpu.index_cache, cpu.index_cache.size()));
}

}  // namespace msa::tool
