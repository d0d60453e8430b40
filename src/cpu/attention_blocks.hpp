// KV blocks of the CPU attention, dequantized to fp32 once and reused: a block
// is converted for one (page, KV head) and then serves every query head of the
// group and every neighbouring query token that selected it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "msa/cache.hpp"
#include "msa/common.hpp"

namespace msa::cpu::attn {

// One page of one KV head in fp32. Tokens [rows, 128) are zero.
struct Block {
  alignas(64) float kt[kHeadDim][kBlockSize];  // [128 d][128 tokens] K, transposed
  alignas(64) float v[kBlockSize][kHeadDim];   // [128 tokens][128 d]
  std::int64_t page = -1;
  std::int32_t head = -1;
  std::int32_t rows = 0;                       // tokens converted
  std::uint64_t last_use = 0;
};

// Dequantizes tokens [0, rows) of (page, head) of any cache dtype: bf16, fp16,
// fp8 e4m3 / e5m2 (stored * scale, per tensor or per (token, head)), nvfp4.
void load_block(const KVCacheView& cache, std::int64_t page, std::int32_t head, std::int32_t rows,
                Block& out);

// A few converted blocks, least recently used first out. One thread at a time.
class BlockCache {
 public:
  BlockCache(const KVCacheView& cache, int capacity)
      : cache_(cache), capacity_(capacity < 1 ? 1 : capacity) {}
  // The block (page, head) with at least `rows` tokens converted.
  const Block& get(std::int64_t page, std::int32_t head, std::int32_t rows);

 private:
  const KVCacheView& cache_;
  int capacity_;
  std::uint64_t clock_ = 0;
  std::vector<std::unique_ptr<Block>> blocks_;
};

// Caches handed to the chunks of a parallel_for, so that a thread's next chunk
// (usually the next tokens) finds the blocks its previous chunk converted.
class BlockCachePool {
 public:
  BlockCachePool(const KVCacheView& cache, int capacity) : cache_(cache), capacity_(capacity) {}
  std::unique_ptr<BlockCache> acquire();
  void release(std::unique_ptr<BlockCache> c);

 private:
  const KVCacheView& cache_;
  int capacity_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<BlockCache>> free_;
};

}  // namespace msa::cpu::attn
