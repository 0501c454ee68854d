// Reference counting: attach and release of request references, and cache references.
#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "engine.h"
#include "error.h"
#include "prefix_index.h"

namespace tagma {

namespace {

constexpr int32_t kMaxRefs = std::numeric_limits<int32_t>::max();

}  // namespace

void Engine::attach(uint64_t id, const int32_t* block_ids, int64_t count) {
  Request& request = find_request(id);
  require_positive(count, "count");
  require_non_null(block_ids, "block_ids");
  check_attachable(request, block_ids, count);

  attach_blocks(id, request, block_ids, count);
}

// Request references taken (cache-only blocks leave the LRU), each run of consecutive ids one range.
void Engine::attach_blocks(uint64_t id, Request& request, const int32_t* block_ids, int64_t count) {
  const int64_t ranges_before = request.num_ranges();
  const int32_t end_before = request.ranges().empty() ? -1 : request.ranges().back().end();
  take_unused_blocks(block_ids, count);
  for (int64_t i = 0; i < count; ++i) {
    const auto block = static_cast<size_t>(block_ids[i]);
    if (req_refs_[block] == 0) {  // cache-only: it is in use from now on
      lru_.remove(block_ids[i]);
      ++used_blocks_;
    }
    ++req_refs_[block];
  }
  for (int64_t run_start = 0; run_start < count;) {
    int64_t run_end = run_start + 1;
    while (run_end < count && block_ids[run_end] == block_ids[run_end - 1] + 1) ++run_end;
    if (request.append_range(block_ids[run_start], static_cast<int32_t>(run_end - run_start))) ++counters_.merges;
    run_start = run_end;
  }
  range_counts_.change(ranges_before, request.num_ranges());
  update_frontier(id, request, end_before);
}

// Every id must be a block in use or cache-only, listed once, not held by the request already.
// O(count log count + ranges log count).
void Engine::check_attachable(const Request& request, const int32_t* block_ids, int64_t count) const {
  for (int64_t i = 0; i < count; ++i) {
    check_block_id(block_ids[i], i);
    check_not_free(block_ids[i], i);
    if (req_refs_[static_cast<size_t>(block_ids[i])] == kMaxRefs) {
      fail(TAGMA_E_OVERFLOW, "block ", block_ids[i], " at index ", i, " has the maximum number of request references");
    }
  }
  std::vector<int32_t> sorted(block_ids, block_ids + count);
  std::sort(sorted.begin(), sorted.end());
  const auto duplicate = std::adjacent_find(sorted.begin(), sorted.end());
  if (duplicate != sorted.end()) fail(TAGMA_E_STATE, "block ", *duplicate, " is listed more than once");
  for (const Range& range : request.ranges()) {
    const auto held = std::lower_bound(sorted.begin(), sorted.end(), range.start);
    if (held != sorted.end() && *held < range.end()) {
      fail(TAGMA_E_STATE, "block ", *held, " is already held by the request");
    }
  }
}

void Engine::release_request(uint64_t id) {
  const Request& request = find_request(id);
  if (prefix_) prefix_forget(id);  // the request's place in the prefix index
  FreeRunBuilder freed(free_list_);
  std::optional<FreeRunBuilder> unused;
  if (unused_) unused.emplace(*unused_);
  FreeRunBuilder* const unused_blocks = unused ? &*unused : nullptr;
  const std::vector<Range>& ranges = request.ranges();
  for (auto range = ranges.rbegin(); range != ranges.rend(); ++range) {
    for (int32_t block = range->end() - 1; block >= range->start; --block) drop_request_ref(block, freed, unused_blocks);
  }
  freed.flush();
  if (unused) unused->flush();
  range_counts_.remove(request.num_ranges());
  if (tracks_frontiers() && !ranges.empty()) {
    const auto frontier = frontiers_.find(ranges.back().end());
    if (frontier != frontiers_.end() && frontier->second == id) frontiers_.erase(frontier);
  }
  requests_.erase(id);
}

void Engine::free_front(uint64_t id, int64_t count) {
  Request& request = find_request(id);
  if (count < 0 || count > request.num_blocks()) {
    fail(TAGMA_E_INVALID_ARG, "count ", count, " is outside [0, ", request.num_blocks(), "] (the request's blocks)");
  }
  if (count % geometry_.align != 0) {
    fail(TAGMA_E_MISALIGNED, "count ", count, " is not a multiple of align ", geometry_.align);
  }
  if (prefix_ && prefix_->cursors.count(id) != 0) {
    fail(TAGMA_E_STATE, "free_front of request ", id, ", which is in the prefix index (it keys its blocks from logical 0)");
  }
  if (count == 0) return;
  const int64_t ranges_before = request.num_ranges();
  const int32_t end_before = request.ranges().back().end();
  FreeRunBuilder freed(free_list_);
  std::optional<FreeRunBuilder> unused;
  if (unused_) unused.emplace(*unused_);
  FreeRunBuilder* const unused_blocks = unused ? &*unused : nullptr;
  request.drop_front(static_cast<int32_t>(count), [&](int32_t block) { drop_request_ref(block, freed, unused_blocks); });
  freed.flush();
  if (unused) unused->flush();
  range_counts_.change(ranges_before, request.num_ranges());
  update_frontier(id, request, end_before);
}

// A block left without request references goes to the LRU tail when cached, else to the free list (and,
// with the prefix index, to the unused runs either way).
void Engine::drop_request_ref(int32_t block, FreeRunBuilder& freed, FreeRunBuilder* unused) {
  const auto index = static_cast<size_t>(block);
  if (--req_refs_[index] > 0) return;
  --used_blocks_;
  if (unused != nullptr) unused->add(block);
  if (cache_refs_[index] > 0) {
    lru_.push_back(block);
  } else {
    freed.add(block);
  }
}

void Engine::take_unused_blocks(const int32_t* blocks, int64_t count) {
  if (!unused_) return;
  int32_t start = 0;
  int32_t length = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t block = blocks[i];
    if (req_refs_[static_cast<size_t>(block)] != 0) continue;
    if (length > 0 && block == start + length) {
      ++length;
      continue;
    }
    if (length > 0) unused_->take(start, length);
    start = block;
    length = 1;
  }
  if (length > 0) unused_->take(start, length);
}

void Engine::cache_mark(const int32_t* block_ids, int64_t count) {
  if (prefix_) fail(TAGMA_E_STATE, "the prefix index owns the cache references");
  require_positive(count, "count");
  require_non_null(block_ids, "block_ids");
  for (int64_t i = 0; i < count; ++i) {
    check_block_id(block_ids[i], i);
    check_not_free(block_ids[i], i);
  }
  // A block may be listed more than once, so overflow shows only while counting; undo on failure.
  for (int64_t i = 0; i < count; ++i) {
    int32_t& refs = cache_refs_[static_cast<size_t>(block_ids[i])];
    if (refs == kMaxRefs) {
      for (int64_t j = 0; j < i; ++j) --cache_refs_[static_cast<size_t>(block_ids[j])];
      fail(TAGMA_E_OVERFLOW, "block ", block_ids[i], " at index ", i, " has the maximum number of cache references");
    }
    ++refs;
  }
}

void Engine::cache_unmark(const int32_t* block_ids, int64_t count) {
  if (prefix_) fail(TAGMA_E_STATE, "the prefix index owns the cache references");
  require_positive(count, "count");
  require_non_null(block_ids, "block_ids");
  for (int64_t i = 0; i < count; ++i) check_block_id(block_ids[i], i);
  // A block may be listed more than once, so a missing reference shows only while counting; undo on failure.
  for (int64_t i = 0; i < count; ++i) {
    int32_t& refs = cache_refs_[static_cast<size_t>(block_ids[i])];
    if (refs == 0) {
      for (int64_t j = 0; j < i; ++j) ++cache_refs_[static_cast<size_t>(block_ids[j])];
      fail(TAGMA_E_STATE, "block ", block_ids[i], " at index ", i, " has no cache reference");
    }
    --refs;
  }
  FreeRunBuilder freed(free_list_);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t block = block_ids[i];
    const bool unreferenced = cache_refs_[static_cast<size_t>(block)] == 0 && req_refs_[static_cast<size_t>(block)] == 0;
    if (unreferenced && lru_.contains(block)) {  // contains(): a block listed twice is freed once
      lru_.remove(block);
      freed.add(block);
    }
  }
  freed.flush();
}

int64_t Engine::cache_evict(int64_t max_blocks, int32_t* out) {
  if (prefix_) fail(TAGMA_E_STATE, "the prefix index owns the cache references (it evicts inside appends)");
  require_positive(max_blocks, "max_blocks");
  const std::vector<Eviction> evicted = evict(std::min(max_blocks, lru_.size()));
  counters_.evictions += static_cast<int64_t>(evicted.size());
  for (size_t i = 0; out != nullptr && i < evicted.size(); ++i) out[i] = evicted[i].block;
  return static_cast<int64_t>(evicted.size());
}

int64_t Engine::cache_clear() {
  if (prefix_) return prefix_clear();
  int64_t dropped = 0;
  FreeRunBuilder freed(free_list_);
  for (int32_t block = 0; block < geometry_.num_blocks; ++block) {
    const auto index = static_cast<size_t>(block);
    if (cache_refs_[index] == 0) continue;
    ++dropped;
    cache_refs_[index] = 0;
    if (req_refs_[index] == 0) {
      lru_.remove(block);
      freed.add(block);
    }
  }
  freed.flush();
  return dropped;
}

}  // namespace tagma
