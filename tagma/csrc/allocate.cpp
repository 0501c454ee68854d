// append: eviction, in-place growth, policy placement and the multi-range fallback.
#include <algorithm>

#include "engine.h"
#include "error.h"

namespace tagma {

void Engine::append(uint64_t id, int64_t count, int32_t* new_blocks_out, int32_t* evicted_out,
                    int64_t* num_evicted) {
  Request& request = find_request(id);
  require_positive(count, "count");
  if (count % geometry_.align != 0) {
    fail(TAGMA_E_MISALIGNED, "count ", count, " is not a multiple of align ", geometry_.align);
  }
  const int64_t free_blocks = free_list_.free_blocks();
  if (free_blocks + lru_.size() < count) {
    fail(TAGMA_E_NO_SPACE, "count ", count, " exceeds ", free_blocks, " free + ", lru_.size(),
         " cache-only blocks");
  }

  if (prefix_) {  // the prefix index picks the victims by its eviction mode (align is 1: no undo needed)
    const int64_t evicted = prefix_make_room(request, count);
    counters_.evictions += evicted;
    const int64_t listed = std::min<int64_t>(count, static_cast<int64_t>(prefix_evicted_.size()));
    for (int64_t i = 0; evicted_out != nullptr && i < listed; ++i) evicted_out[i] = prefix_evicted_[static_cast<size_t>(i)];
    if (num_evicted != nullptr) *num_evicted = evicted;
    allocate(request, count, new_blocks_out);
    return;
  }
  const std::vector<Eviction> evicted = evict(std::max<int64_t>(count - free_blocks, 0));
  if (!can_allocate(request, count)) {
    undo_eviction(evicted);
    fail(TAGMA_E_NO_SPACE, "count ", count, ": enough blocks would be free but too few at multiples of align ",
         geometry_.align);
  }
  counters_.evictions += static_cast<int64_t>(evicted.size());
  for (size_t i = 0; evicted_out != nullptr && i < evicted.size(); ++i) evicted_out[i] = evicted[i].block;
  if (num_evicted != nullptr) *num_evicted = static_cast<int64_t>(evicted.size());

  allocate(request, count, new_blocks_out);
}

int64_t Engine::append_runs(uint64_t id, int64_t count, int64_t hint, int32_t* runs_out, int64_t capacity) {
  find_request(id);
  require_positive(count, "count");
  if (hint < 0) fail(TAGMA_E_INVALID_ARG, "hint ", hint, " must be >= 0");
  require_non_null(runs_out, "runs_out");
  if (capacity < count) fail(TAGMA_E_INVALID_ARG, "capacity ", capacity, " must be >= count ", count);
  if (free_list_.free_blocks() < count && lru_.size() > 0 && !prefix_) {  // the prefix index may evict
    fail(TAGMA_E_STATE, "count ", count, " would evict cache-only blocks (", free_list_.free_blocks(),
         " free): use tagma_request_append, which reports evictions");
  }
  append_scratch_.resize(static_cast<size_t>(count));  // may throw bad_alloc: nothing changed yet
  growth_hint_ = hint;
  try {
    append(id, count, append_scratch_.data(), nullptr, nullptr);
  } catch (...) {
    growth_hint_ = 0;
    throw;
  }
  growth_hint_ = 0;
  int64_t runs = 0;
  int32_t start = append_scratch_[0];
  int32_t length = 1;
  for (size_t i = 1; i < append_scratch_.size(); ++i) {
    const int32_t block = append_scratch_[i];
    if (block == start + length) {
      ++length;
      continue;
    }
    runs_out[2 * runs] = start;
    runs_out[2 * runs + 1] = length;
    ++runs;
    start = block;
    length = 1;
  }
  runs_out[2 * runs] = start;
  runs_out[2 * runs + 1] = length;
  return runs + 1;
}

// Blocks by which the last range can grow in place: the free run right after it, at most `count`, rounded
// down to the alignment so that whatever remains to allocate is still a multiple of it.
int32_t Engine::growth_room(const Request& request, int64_t count) const {
  if (request.ranges().empty()) return 0;
  const int64_t run = free_list_.run_at(request.ranges().back().end());
  return static_cast<int32_t>(align_down(std::min(run, count), geometry_.align));
}

// Whether allocate(request, count) would succeed, without changing anything: after in-place growth, the
// rest must fit in the aligned capacity of the free list (always true with align 1 and enough free blocks).
bool Engine::can_allocate(const Request& request, int64_t count) const {
  const int32_t grown = growth_room(request, count);
  const int64_t rest = count - grown;
  if (rest == 0) return true;
  int64_t capacity = free_list_.total_capacity();
  if (grown > 0) {
    const int32_t run_start = request.ranges().back().end();
    const int32_t run = free_list_.run_at(run_start);
    capacity += free_list_.capacity(run_start + grown, run - grown) - free_list_.capacity(run_start, run);
  }
  return capacity >= rest;
}

// Requires can_allocate(request, count).
void Engine::allocate(Request& request, int64_t count, int32_t* new_blocks_out) {
  const int64_t ranges_before = request.num_ranges();
  auto rest = static_cast<int32_t>(count);

  const int32_t grown = growth_room(request, count);
  if (grown > 0) {
    take_blocks(request, request.ranges().back().end(), grown, new_blocks_out);
    ++counters_.in_place_growths;
    rest -= grown;
  }
  if (rest > 0) {
    std::optional<int32_t> start;
    const int64_t want = align_up(std::min<int64_t>(growth_hint_ - grown, geometry_.num_blocks), geometry_.align);
    if (want > rest) start = free_list_.place_for_growth(rest, static_cast<int32_t>(want));
    if (!start) start = free_list_.place(policy_, rest);
    if (start) {
      add_new_range(request, *start, rest, new_blocks_out);
    } else {
      // No free range fits: aligned pieces of the free ranges, largest capacity first.
      while (rest > 0) {
        const FreeRange largest = free_list_.largest_by_capacity();
        const int32_t piece = std::min(rest, free_list_.capacity(largest.start, largest.count));
        add_new_range(request, free_list_.aligned_start(largest.start), piece, new_blocks_out);
        rest -= piece;
      }
    }
  }
  counters_.appended_blocks += count;
  range_counts_.change(ranges_before, request.num_ranges());
}

void Engine::add_new_range(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out) {
  if (take_blocks(request, start, count, new_blocks_out)) {
    ++counters_.merges;
  } else {
    ++counters_.new_ranges;
  }
}

// Takes free blocks [start, start + count) with one request reference each and appends them at the
// request's logical end. Returns whether they merged into its last range.
bool Engine::take_blocks(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out) {
  free_list_.take(start, count);
  for (int32_t block = start; block < start + count; ++block) {
    req_refs_[static_cast<size_t>(block)] = 1;
    if (new_blocks_out != nullptr) *new_blocks_out++ = block;
  }
  used_blocks_ += count;
  return request.append_range(start, count);
}

// Evicts the first `count` blocks of the LRU (count <= its size): their cache references drop to zero and
// they join the free list.
std::vector<Engine::Eviction> Engine::evict(int64_t count) {
  if (count > lru_.size()) fail(TAGMA_E_INTERNAL, "cannot evict ", count, " of ", lru_.size(), " cache-only blocks");
  std::vector<Eviction> evicted;
  evicted.reserve(static_cast<size_t>(count));
  FreeRunBuilder freed(free_list_);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t block = lru_.front();
    lru_.remove(block);
    evicted.push_back(Eviction{block, cache_refs_[static_cast<size_t>(block)]});
    cache_refs_[static_cast<size_t>(block)] = 0;
    freed.add(block);
  }
  freed.flush();
  return evicted;
}

// Restores blocks evicted by evict() to their cache references and LRU positions.
void Engine::undo_eviction(const std::vector<Eviction>& evicted) {
  for (auto eviction = evicted.rbegin(); eviction != evicted.rend(); ++eviction) {
    free_list_.take(eviction->block, 1);
    cache_refs_[static_cast<size_t>(eviction->block)] = eviction->cache_refs;
    lru_.push_front(eviction->block);
  }
}

}  // namespace tagma
