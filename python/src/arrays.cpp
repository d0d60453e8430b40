#include "arrays.hpp"

#include <sstream>

#include "msa/error.hpp"

namespace msa::py {

namespace {

using Code = nb::dlpack::dtype_code;

// DLPack device types (dlpack.h): kDLCPU, kDLCUDA, kDLCUDAHost (pinned host memory).
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;
// DLPack 1.0 float8 type codes (kDLFloat8_e4m3fn, kDLFloat8_e5m2), spelled as numbers so that
// nanobind versions without them in dtype_code build too.
constexpr int kDLFloat8E4M3FN = 10, kDLFloat8E5M2 = 12;

std::string shape_string(const Array& a) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  if (a.ndim() == 1) os << ',';
  os << ')';
  return os.str();
}

std::string device_string(const Place& p) {
  return p.cuda ? "cuda:" + std::to_string(p.device) : std::string("cpu");
}

// The dtype an array's DLPack code names by itself, if it names one of msa's.
std::optional<DType> own_dtype(const Array& a) {
  const auto d = a.dtype();
  if (d.lanes != 1) return std::nullopt;
  if (d.code == kDLFloat8E4M3FN && d.bits == 8) return DType::fp8_e4m3;
  if (d.code == kDLFloat8E5M2 && d.bits == 8) return DType::fp8_e5m2;
  switch (Code(d.code)) {
    case Code::Bfloat: return d.bits == 16 ? std::optional(DType::bf16) : std::nullopt;
    case Code::Float:
      if (d.bits == 16) return DType::fp16;
      if (d.bits == 32) return DType::f32;
      return std::nullopt;
    case Code::Int: return d.bits == 32 ? std::optional(DType::i32) : std::nullopt;
    default: return std::nullopt;
  }
}

// Bits of one stored element of a dtype (nvfp4: one byte holds two codes).
int storage_bits(DType t) {
  if (t == DType::nvfp4) return 8;
  return int(dtype_bytes(t)) * 8;
}

}  // namespace

bool has_own_dtype(const Array& a) { return own_dtype(a).has_value(); }

std::string dlpack_dtype_name(const Array& a) {
  const auto d = a.dtype();
  if (d.code == kDLFloat8E4M3FN) return "float8_e4m3fn";
  if (d.code == kDLFloat8E5M2) return "float8_e5m2";
  std::string base;
  switch (Code(d.code)) {
    case Code::Int: base = "int"; break;
    case Code::UInt: base = "uint"; break;
    case Code::Float: base = "float"; break;
    case Code::Bfloat: base = "bfloat"; break;
    case Code::Bool: return "bool";
    default: base = "dlpack_code" + std::to_string(int(d.code)) + "_"; break;
  }
  std::string name = base + std::to_string(int(d.bits));
  if (d.lanes != 1) name += "x" + std::to_string(int(d.lanes));
  return name;
}

DType element_dtype(const Array& a, const OptString& name, const char* arg) {
  const std::optional<DType> own = own_dtype(a);
  if (!name) {
    MSA_CHECK(own.has_value(), arg, ": an array of dtype ", dlpack_dtype_name(a),
              " needs its element type named (e.g. bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4)");
    return *own;
  }
  const DType named = parse_dtype(*name, arg);
  const auto d = a.dtype();
  MSA_CHECK(d.lanes == 1 && int(d.bits) == storage_bits(named), arg, ": dtype = '", *name,
            "' stores ", storage_bits(named), "-bit elements but the array holds ",
            dlpack_dtype_name(a));
  const bool raw = Code(d.code) == Code::UInt || Code(d.code) == Code::Int;
  MSA_CHECK(raw || (own && *own == named), arg, ": dtype = '", *name, "' but the array holds ",
            dlpack_dtype_name(a));
  return named;
}

std::int64_t dim(const Array& a, std::size_t i) { return std::int64_t(a.shape(i)); }

void expect_ndim(const Array& a, std::size_t ndim, const char* arg, const char* dims) {
  MSA_CHECK(a.ndim() == ndim, arg, ": shape ", shape_string(a), " has ", a.ndim(),
            " dimensions but must be ", dims);
}

void expect_shape(const Array& a, std::initializer_list<std::int64_t> want, const char* arg,
                  const char* dims) {
  expect_ndim(a, want.size(), arg, dims);
  std::size_t i = 0;
  for (const std::int64_t w : want) {
    MSA_CHECK(w < 0 || dim(a, i) == w, arg, ": shape ", shape_string(a), " but must be ", dims,
              " (dimension ", i, " must be ", w, ")");
    ++i;
  }
}

bool no_elements(const Array& a) {
  for (std::size_t i = 0; i < a.ndim(); ++i)
    if (dim(a, i) == 0) return true;
  return false;
}

void expect_contiguous(const Array& a, const char* arg) {
  if (no_elements(a)) return;
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (dim(a, i) != 1) {
      MSA_CHECK(a.stride(i) == expected, arg, ": must be contiguous (row-major) but dimension ", i,
                " of shape ", shape_string(a), " has stride ", a.stride(i), " (expected ", expected,
                ")");
    }
    expected *= dim(a, i);
  }
}

void expect_inner_contiguous(const Array& a, const char* arg) {
  if (a.ndim() == 0 || no_elements(a)) return;
  const std::size_t last = a.ndim() - 1;
  MSA_CHECK(dim(a, last) <= 1 || a.stride(last) == 1, arg, ": the last dimension must be contiguous",
            " but has stride ", a.stride(last), " (shape ", shape_string(a), ")");
}

void expect_dtype(const Array& a, DType want, const char* arg) {
  const std::optional<DType> own = own_dtype(a);
  MSA_CHECK(own && *own == want, arg, ": dtype ", dlpack_dtype_name(a), " but must be ",
            dtype_name(want));
}

void expect_int64(const Array& a, const char* arg) {
  const auto d = a.dtype();
  MSA_CHECK(Code(d.code) == Code::Int && d.bits == 64 && d.lanes == 1, arg, ": dtype ",
            dlpack_dtype_name(a), " but must be int64");
}

void Placement::add(const Array& a, const char* arg) {
  Place p;
  const int type = a.device_type();
  MSA_CHECK(type == kDLCPU || type == kDLCUDA || type == kDLCUDAHost, arg,
            ": arrays must be in host memory or on a CUDA device (DLPack device type ", type, ")");
  p.cuda = type == kDLCUDA;
  p.device = p.cuda ? a.device_id() : 0;
  if (!set_) {
    set_ = true;
    place_ = p;
    first_ = arg;
    return;
  }
  MSA_CHECK(p.cuda == place_.cuda && p.device == place_.device, arg, " is on ", device_string(p),
            " but ", first_, " is on ", device_string(place_),
            ": the arrays of one call must be on one device");
}

void require_cuda_build(const char* what) {
#if MSA_HAVE_CUDA
  (void)what;
#else
  fail(what, ": the arrays are on a CUDA device but this msa was built without the CUDA backend "
       "(rebuild with -DMSA_CUDA=ON, e.g. pip install . -Ccmake.define.MSA_CUDA=ON)");
#endif
}

}  // namespace msa::py
