// A small deterministic random generator (splitmix64) for the GPU subcommands.
// The same seed gives the same cases and data on every compiler and machine,
// which std::uniform_int_distribution and friends do not promise.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace msa::tool {

// splitmix64 finalizer: a well-mixed 64-bit hash of x.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(mix64(seed)) {}

  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, 1).
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [lo, hi] (inclusive); lo when hi < lo.
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return lo;
    const auto span = std::uint64_t(hi - lo) + 1u;
    return lo + std::int64_t(next() % span);
  }
  bool chance(double p) { return uniform() < p; }
  // Standard normal (Box-Muller).
  float normal() {
    const double u1 = (double(next() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[std::size_t(between(0, std::int64_t(v.size()) - 1))];
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[std::size_t(between(0, std::int64_t(i) - 1))]);
  }

 private:
  std::uint64_t state_;
};

// `count` distinct integers from [0, n) in random order (Floyd's sampling);
// all of [0, n) when count >= n.
inline std::vector<std::int32_t> sample_distinct(Rng& rng, std::int32_t n, std::int32_t count) {
  std::vector<std::int32_t> out;
  if (count >= n) {
    for (std::int32_t i = 0; i < n; ++i) out.push_back(i);
    rng.shuffle(out);
    return out;
  }
  for (std::int32_t j = n - count; j < n; ++j) {
    const auto t = std::int32_t(rng.between(0, j));
    bool seen = false;
    for (const std::int32_t x : out) seen = seen || x == t;
    out.push_back(seen ? j : t);
  }
  return out;
}

}  // namespace msa::tool
