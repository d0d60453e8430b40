#include "core/view_span.hpp"

#include <cstdint>
#include <limits>

#include "msa/error.hpp"

namespace msa::check {

namespace {

constexpr std::int64_t kMaxSize = std::int64_t(1) << 62;

const void* address(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

}  // namespace

std::int64_t size_of(const char* what, std::int64_t a, std::int64_t b, std::int64_t c) {
  const __int128 v = static_cast<__int128>(a) * b + c;
  MSA_CHECK(v >= 0 && v <= kMaxSize, what, " spans ", a, " x ", b, " + ", c,
            " units, outside [0, 2^62]");
  return static_cast<std::int64_t>(v);
}

Span span_at(const char* what, const void* base, std::int64_t bytes) {
  Span s;
  s.what = what;
  s.begin = reinterpret_cast<std::uintptr_t>(base);
  s.bytes = bytes > 0 ? std::uint64_t(bytes) : 0;
  MSA_CHECK(s.bytes <= std::numeric_limits<std::uintptr_t>::max() - s.begin, what, " at ", base,
            " with ", bytes, " bytes wraps around the address space");
  return s;
}

void aligned(const char* what, const void* ptr, std::int64_t align, const char* why) {
  if (align <= 1) return;
  MSA_CHECK(reinterpret_cast<std::uintptr_t>(ptr) % std::uint64_t(align) == 0, what, " = ", ptr,
            " is not ", align, "-byte aligned (", why, ")");
}

void no_overlap(const Span& written, const Span& other) {
  if (written.bytes == 0 || other.bytes == 0) return;
  const bool apart = written.begin + written.bytes <= other.begin ||
                     other.begin + other.bytes <= written.begin;
  MSA_CHECK(apart, written.what, " (", written.bytes, " bytes at ", address(written.begin),
            ") overlaps ", other.what, " (", other.bytes, " bytes at ", address(other.begin),
            "): an operation's output must not share memory with its inputs");
}

}  // namespace msa::check
