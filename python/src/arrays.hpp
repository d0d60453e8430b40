// Arrays from Python (numpy arrays, torch tensors, anything with __dlpack__),
// taken as they are: never copied or converted. The helpers here check an
// array's dtype, shape, strides and device, naming the argument in the
// msa::Error they throw, and hand out the raw pointers msa's views take.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "msa/dtype.hpp"

namespace msa::py {

namespace nb = nanobind;

// Any dtype, shape, strides and device. Strides are in elements. What a call
// reads may be read-only (a numpy array with writeable False, a read-only
// memory map); what it writes is an OutArray, which nanobind refuses read-only
// (the Python layer first raises msa.Error naming it: msa/_arrays.py).
using Array = nb::ndarray<nb::ro>;
using OptArray = std::optional<Array>;
using OutArray = nb::ndarray<>;
using OptOutArray = std::optional<OutArray>;
// A written array as the checks and views take it.
inline Array as_array(const OutArray& a) { return Array(a); }
inline OptArray as_array(const OptOutArray& a) { return a ? OptArray(Array(*a)) : std::nullopt; }
using OptString = std::optional<std::string>;

// Where an array lives: host memory (CPU engine) or one CUDA device.
struct Place {
  bool cuda = false;
  int device = 0;  // CUDA device ordinal
};

// The dtype an array holds. `name` (e.g. "bf16", "fp8_e4m3", "nvfp4") says
// what the elements are when the array's own dtype cannot (uint16 bf16 in
// numpy, uint8 fp8 / nvfp4 codes); it must match the element size, and the
// array's dtype when that is a float type. Without a name, uint8 / uint16
// arrays are refused with a message that asks for one.
DType element_dtype(const Array& a, const OptString& name, const char* arg);
// Whether the array's own dtype names one of msa's (bf16, fp16, f32, i32, float8).
bool has_own_dtype(const Array& a);
// The array's DLPack dtype in words ("bfloat16", "uint8", "int64", ...).
std::string dlpack_dtype_name(const Array& a);

// Whether the array has no element (its strides then mean nothing: DLPack
// exporters may report 0 for them).
bool no_elements(const Array& a);

// Checks; each throws msa::Error naming `arg`.
void expect_ndim(const Array& a, std::size_t ndim, const char* arg, const char* dims);
// shape[i] == want[i] for every want[i] >= 0.
void expect_shape(const Array& a, std::initializer_list<std::int64_t> want, const char* arg,
                  const char* dims);
// Row-major dense (dimensions of extent 1 may have any stride).
void expect_contiguous(const Array& a, const char* arg);
// Elements of the innermost dimension adjacent (stride 1, or extent <= 1).
void expect_inner_contiguous(const Array& a, const char* arg);
void expect_dtype(const Array& a, DType want, const char* arg);
void expect_int64(const Array& a, const char* arg);

std::int64_t dim(const Array& a, std::size_t i);
// The array's first element (nanobind 2.x returns it const from a const array).
inline void* data_of(const Array& a) { return const_cast<void*>(static_cast<const void*>(a.data())); }
template <typename T = void>
T* ptr(const Array& a) {
  return static_cast<T*>(data_of(a));
}

// The place every array of one call shares; add() checks each one against the
// first ("all arrays of one call must be on one device").
class Placement {
 public:
  void add(const Array& a, const char* arg);
  void add(const OptArray& a, const char* arg) {
    if (a) add(*a, arg);
  }
  bool cuda() const { return place_.cuda; }
  int device() const { return place_.device; }

 private:
  bool set_ = false;
  Place place_;
  std::string first_;
};

// The CUDA stream the caller passed (a cudaStream_t as an integer, 0 the
// default stream) as msa::cuda::Stream.
inline void* stream_ptr(std::uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// Throws msa::Error when this build has no CUDA backend.
void require_cuda_build(const char* what);

}  // namespace msa::py
