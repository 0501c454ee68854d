// tagma_append_runs_batch: the appends of one scheduler step in one crossing of the C ABI.
//
// tagma.h is included first under default visibility (as in c_api.cpp) so that the ABI function is exported.
#pragma GCC visibility push(default)
#include "tagma.h"
#pragma GCC visibility pop

#include <algorithm>
#include <cstdint>
#include <limits>

#include "abi.h"
#include "engine.h"
#include "error.h"

namespace tagma {

namespace {

// Writes the runs of the request's logical blocks [first, end) as (start, count) pairs; returns their number.
// Consecutive ranges are never physically adjacent (request.h), so each range's part is one maximal run.
int64_t write_runs(const Request& request, int64_t first, int32_t* out) {
  const std::vector<Range>& ranges = request.ranges();
  int64_t written = 0;
  for (size_t k = request.range_index(first); k < ranges.size(); ++k) {
    const Range& range = ranges[k];
    const int32_t skip = first > range.first_logical ? static_cast<int32_t>(first - range.first_logical) : 0;
    out[2 * written] = range.start + skip;
    out[2 * written + 1] = range.count - skip;
    ++written;
  }
  return written;
}

// Resets the growth hint however the append ends.
struct HintScope {
  explicit HintScope(int64_t& hint, int64_t value) : hint_(hint) { hint_ = value; }
  ~HintScope() { hint_ = 0; }
  HintScope(const HintScope&) = delete;
  HintScope& operator=(const HintScope&) = delete;
  int64_t& hint_;
};

}  // namespace

void Engine::append_runs_batch(const tagma_append_batch& batch) {
  const int64_t n = batch.num_requests;
  if (n < 0) fail(TAGMA_E_INVALID_ARG, "num_requests ", n, " must be >= 0");
  require_non_null(batch.run_offsets, "run_offsets");
  if (n == 0) {
    batch.run_offsets[0] = 0;
    return;
  }
  require_non_null(batch.requests, "requests");
  require_non_null(batch.counts, "counts");
  require_non_null(batch.runs_out, "runs_out");

  // Validate every entry before anything changes.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total = 0;  // saturates at kMax
  for (int64_t i = 0; i < n; ++i) {
    const int64_t count = batch.counts[i];
    if (count <= 0) fail(TAGMA_E_INVALID_ARG, "entry ", i, ": count ", count, " must be > 0");
    if (count % geometry_.align != 0) {
      fail(TAGMA_E_MISALIGNED, "entry ", i, ": count ", count, " is not a multiple of align ", geometry_.align);
    }
    if (batch.hints != nullptr && batch.hints[i] < 0) {
      fail(TAGMA_E_INVALID_ARG, "entry ", i, ": hint ", batch.hints[i], " must be >= 0");
    }
    const uint64_t id = batch.requests[i];
    const auto found = id != 0 ? requests_.find(id) : requests_.end();
    if (id != 0 && found == requests_.end()) {
      fail(TAGMA_E_NOT_FOUND, "entry ", i, ": request ", id, " is unknown or released");
    }
    if (admission_percent_ > 0 && batch.hints != nullptr && batch.hints[i] > 0 &&
        (id == 0 || found->second.num_blocks() == 0)) {
      fail(TAGMA_E_STATE, "entry ", i, ": a hinted first append under RESERVE admission may be declined: ",
           "use tagma_request_append_runs");
    }
    total = count > kMax - total ? kMax : total + count;
  }
  if (batch.runs_capacity < total) {
    fail(TAGMA_E_INVALID_ARG, "runs_capacity ", batch.runs_capacity, " must be >= the sum of counts ", total);
  }
  const int64_t free_blocks = free_list_.free_blocks();
  if (prefix_) {  // with the prefix index the batch evicts as tagma_request_append does (align is 1)
    if (total > free_blocks + lru_.size()) {
      fail(TAGMA_E_NO_SPACE, "the counts' sum ", total, " exceeds the ", free_blocks, " free + ", lru_.size(),
           " cache-only blocks");
    }
  } else if (total > free_blocks) {
    if (lru_.size() > 0) {
      fail(TAGMA_E_STATE, "the counts' sum ", total, " would evict cache-only blocks (", free_blocks,
           " free): use tagma_request_append, which reports evictions");
    }
    fail(TAGMA_E_NO_SPACE, "the counts' sum ", total, " exceeds the ", free_blocks, " free blocks");
  }
  // Each append of c blocks takes exactly c blocks of aligned capacity (ranges start and end at multiples of
  // align), so the whole batch fits when its sum does.
  if (!prefix_ && total > free_list_.total_capacity()) {
    fail(TAGMA_E_NO_SPACE, "the counts' sum ", total, ": enough blocks are free but too few at multiples of align ",
         geometry_.align);
  }

  // Apply in order, as the same tagma_request_append_runs calls would.
  int64_t runs = 0;
  batch.run_offsets[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t id = batch.requests[i];
    if (id == 0) {
      id = create_request();
      batch.requests[i] = id;
    }
    Request& request = find_request(id);
    const int64_t first = request.num_blocks();
    {
      const int64_t hint = batch.hints != nullptr ? clamp_hint(batch.hints[i]) : 0;
      // As tagma_request_append_runs: a hint is also the request's expected size from here (RESERVE). The
      // counts were checked against the free blocks and the hint is clamped: the sum cannot overflow.
      if (hint > 0) request.set_expected_blocks(first + std::max(hint, batch.counts[i]));
      const HintScope scope(growth_hint_, hint);
      allocate(id, request, batch.counts[i], nullptr);
    }
    runs += write_runs(request, first, batch.runs_out + 2 * runs);
    batch.run_offsets[i + 1] = runs;
  }
}

}  // namespace tagma

using tagma::Engine;

extern "C" {

tagma_status tagma_append_runs_batch(const tagma_append_batch* batch) {
  constexpr const char* kName = "tagma_append_runs_batch";
  if (batch == nullptr) {
    return tagma::run_guarded(
        kName, [](void*) { tagma::fail(TAGMA_E_INVALID_ARG, "batch must not be null"); }, nullptr);
  }
  return tagma::run_with_engine(
      kName, batch->engine,
      [](Engine& engine, void* context) {
        engine.append_runs_batch(*static_cast<const tagma_append_batch*>(context));
      },
      const_cast<tagma_append_batch*>(batch));
}

}  // extern "C"
