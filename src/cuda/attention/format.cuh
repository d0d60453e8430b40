// Each KV format as one type, naming the part each kernel family runs for it
// (its sizes and occupancy are its row of kv_format.hpp). The parts live with
// their family, next to the layouts they use; a kernel takes Format<kKind>'s
// part instead of branching on the kind. A new format is a KvKind with its
// table row, a Format specialization here, and each part it names written in
// its family (docs/DESIGN.md, "where to change what").
#pragma once

#include "cuda/attention/kv_format.hpp"

namespace msa::cuda::attention {

// mma_sync/stage_{half,fp8,fp4}.cuh: the mma.sync kernels' copies of a block
// into shared memory, and its widening to the MMA type where a tile is read.
struct HalfStaging;
struct Fp8Staging;
struct Fp4Staging;
// mma_sync/mainloop.cuh: the row (decode) kernel's multiply of one staged block.
struct HalfRowBlock;
struct Fp8RowBlock;
struct Fp4RowBlock;
// prefill/load.cuh, prefill/produce_{fp8,fp4}.cuh: the wgmma token tiles'
// producer of one tile's blocks.
struct HalfTileProducer;
struct Fp8TileProducer;
struct Fp4TileProducer;
// widen/widen.cu: the widen-ahead kernel's work on one (page, KV head).
struct Fp8WidenAhead;
struct Fp4WidenAhead;

// A format's parts.
template <class StagingT, class RowBlockT, class TileProducerT, class WidenAheadT>
struct FormatParts {
  using Staging = StagingT;
  using RowBlock = RowBlockT;
  using TileProducer = TileProducerT;
  using WidenAhead = WidenAheadT;  // void: read as stored, never widened ahead
};

template <KvKind K>
struct Format;
template <>
struct Format<KvKind::half> : FormatParts<HalfStaging, HalfRowBlock, HalfTileProducer, void> {};
// e4m3 and e5m2 share their parts; the conversion tells them apart.
template <>
struct Format<KvKind::e4m3> : FormatParts<Fp8Staging, Fp8RowBlock, Fp8TileProducer, Fp8WidenAhead> {};
template <>
struct Format<KvKind::e5m2> : FormatParts<Fp8Staging, Fp8RowBlock, Fp8TileProducer, Fp8WidenAhead> {};
template <>
struct Format<KvKind::nvfp4> : FormatParts<Fp4Staging, Fp4RowBlock, Fp4TileProducer, Fp4WidenAhead> {};

}  // namespace msa::cuda::attention
