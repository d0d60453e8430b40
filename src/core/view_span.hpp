// The memory a view may touch, by address only (host and device pointers
// alike), for the view checks: sizes computed without overflow, and the test
// that what an operation writes shares no byte with what it reads.
#pragma once

#include <cstdint>

namespace msa::check {

// Bytes [begin, begin + bytes) of one argument; bytes 0 touches nothing.
struct Span {
  const char* what = "";
  std::uintptr_t begin = 0;
  std::uint64_t bytes = 0;
};

// a * b + c for view sizes: throws msa::Error naming `what` when the result
// leaves [0, 2^62] (no view of a real machine is that large), so that later
// offset arithmetic in int64 cannot overflow.
std::int64_t size_of(const char* what, std::int64_t a, std::int64_t b, std::int64_t c = 0);

// The span of `bytes` bytes at `base`; throws when it wraps the address space.
Span span_at(const char* what, const void* base, std::int64_t bytes);

// Throws when `ptr` is not a multiple of `align` bytes (align 1: always fine).
void aligned(const char* what, const void* ptr, std::int64_t align, const char* why);

// Throws when the written span shares a byte with `other`.
void no_overlap(const Span& written, const Span& other);

}  // namespace msa::check
