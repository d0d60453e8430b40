// The communication of a context-parallel layer: two in-place NCCL
// all-gathers per layer step, and run_layer, which puts the six steps in order.
//
// Each rank writes its own slice of the gathered buffer (propose, attend_owned)
// and the all-gather fills in the others' slices, so nothing is copied twice.
// The buffers are sent as bytes: an all-gather does no arithmetic. NVLink
// multicast (NVLS) is never requested here; whoever creates the communicator
// decides (the tests set NCCL_NVLS_ENABLE=0 before ncclCommInitAll).
//
// Built without NCCL (MSA_HAVE_NCCL unset: the build found no nccl.h or
// libnccl), a one-rank group without a communicator still runs, and any
// exchange between ranks throws.
#include <cstddef>
#include <cstdint>

#include "msa/common.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"

#if defined(MSA_HAVE_NCCL)
#include <nccl.h>

#define MSA_NCCL_CHECK(call, comm)                                                           \
  do {                                                                                       \
    const ncclResult_t msa_nccl_ = (call);                                                   \
    if (msa_nccl_ != ncclSuccess)                                                            \
      ::msa::fail("NCCL error ", ncclGetErrorString(msa_nccl_), " (", ncclGetLastError(comm), \
                  ") in ", #call, " at ", __FILE__, ":", __LINE__);                          \
  } while (0)
#endif

namespace msa::cuda::cp {

#if defined(MSA_HAVE_NCCL)
namespace {

// Whether there is anything to exchange; checks the communicator against the
// plan's group (host queries only: nothing is enqueued or synchronized). One
// rank has nothing to exchange: its slices are already the gathered buffers
// (and its weighted rows the sum), so no collective is launched for it.
bool exchange_needed(const char* fn, const LayerPlan& plan) {
  const Group& g = plan.group;
  if (g.sharding.num_ranks == 1 && g.comm == nullptr) return false;
  MSA_CHECK(g.comm != nullptr, fn, ": group.comm is null but sharding.num_ranks = ",
            g.sharding.num_ranks);
  auto* comm = static_cast<ncclComm_t>(g.comm);
  int count = 0, rank = 0;
  MSA_NCCL_CHECK(ncclCommCount(comm, &count), comm);
  MSA_NCCL_CHECK(ncclCommUserRank(comm, &rank), comm);
  MSA_CHECK(count == g.sharding.num_ranks && rank == g.rank, fn, ": the communicator is rank ", rank,
            " of ", count, " but the plan is for rank ", g.rank, " of ", g.sharding.num_ranks);
  return plan.num_tokens > 0 && g.sharding.num_ranks > 1;
}

// In-place all-gather of `bytes_per_rank` bytes: rank r's slice starts at
// buffer + r * bytes_per_rank.
void all_gather_in_place(void* buffer, std::size_t bytes_per_rank, const Group& g, Stream stream) {
  auto* comm = static_cast<ncclComm_t>(g.comm);
  auto* base = static_cast<std::uint8_t*>(buffer);
  MSA_NCCL_CHECK(ncclAllGather(base + std::size_t(g.rank) * bytes_per_rank, base, bytes_per_rank,
                               ncclUint8, comm, static_cast<cudaStream_t>(stream)),
                 comm);
}

}  // namespace

void exchange_candidates(const LayerPlan& plan, Stream stream) {
  if (!exchange_needed("cp::exchange_candidates", plan)) return;
  all_gather_in_place(plan.candidates, plan.candidate_bytes(), plan.group, stream);
}

void exchange_partials(const LayerPlan& plan, Stream stream) {
  if (plan.merge == PartialMerge::reduce) {
    // One rank without a communicator: its weighted rows are already the sum.
    const bool exchange = exchange_needed("cp::exchange_partials", plan);
    if (exchange) all_gather_in_place(plan.partial_lse, std::size_t(plan.partial_rows()) * sizeof(float), plan.group, stream);
    weigh_own(plan, stream);
    if (!exchange) return;
    auto* comm = static_cast<ncclComm_t>(plan.group.comm);
    const std::size_t count = std::size_t(plan.partial_rows()) * kHeadDim;
    MSA_NCCL_CHECK(ncclAllReduce(plan.weighted, plan.weighted, count, ncclFloat32, ncclSum, comm,
                                 static_cast<cudaStream_t>(stream)),
                   comm);
    return;
  }
  if (!exchange_needed("cp::exchange_partials", plan)) return;
  const std::size_t rows = std::size_t(plan.partial_rows());
  auto* comm = static_cast<ncclComm_t>(plan.group.comm);
  // One group: both transfers are posted together and progress side by side.
  MSA_NCCL_CHECK(ncclGroupStart(), comm);
  try {
    all_gather_in_place(plan.partial_out, rows * kHeadDim * dtype_bytes(plan.out_dtype), plan.group,
                        stream);
    all_gather_in_place(plan.partial_lse, rows * sizeof(float), plan.group, stream);
  } catch (...) {
    (void)ncclGroupEnd();  // close the group before reporting
    throw;
  }
  MSA_NCCL_CHECK(ncclGroupEnd(), comm);
}

#else  // no NCCL

void exchange_candidates(const LayerPlan& plan, Stream) {
  MSA_CHECK(plan.group.sharding.num_ranks == 1 && plan.group.comm == nullptr,
            "cp::exchange_candidates: this build has no NCCL, so only one rank without a "
            "communicator can run (sharding.num_ranks = ", plan.group.sharding.num_ranks, ")");
}

void exchange_partials(const LayerPlan& plan, Stream stream) {
  MSA_CHECK(plan.group.sharding.num_ranks == 1 && plan.group.comm == nullptr,
            "cp::exchange_partials: this build has no NCCL, so only one rank without a "
            "communicator can run (sharding.num_ranks = ", plan.group.sharding.num_ranks, ")");
  if (plan.merge == PartialMerge::reduce) weigh_own(plan, stream);
}

#endif  // MSA_HAVE_NCCL

namespace {

// Steps 2 to 6, once this rank's candidates are in place.
void finish_layer(const LayerPlan& plan, const StepView& step, const AttentionArgs& args, Stream stream,
                  const DeviceCheck& check) {
  exchange_candidates(plan, stream);
  merge_topk(plan, step, stream);
  attend_owned(plan, step, args, stream, check);
  exchange_partials(plan, stream);
  combine(plan, args.out, args.lse, stream);
}

}  // namespace

void run_layer(const LayerPlan& plan, const StepView& step, const float* scores,
               const AttentionArgs& args, Stream stream, const DeviceCheck& check) {
  propose(plan, step, scores, stream);
  finish_layer(plan, step, args, stream, check);
}

void run_layer(const LayerPlan& plan, const StepView& step, const float* scores, const TopkView& own_topk,
               const AttentionArgs& args, Stream stream, const DeviceCheck& check) {
  propose(plan, step, scores, own_topk, stream);
  finish_layer(plan, step, args, stream, check);
}

}  // namespace msa::cuda::cp
