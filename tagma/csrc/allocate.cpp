// append: eviction, in-place growth, policy placement and the multi-range fallback.
#include <algorithm>
#include <functional>
#include <vector>

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
    allocate(id, request, count, new_blocks_out);
    const auto evicted = static_cast<int64_t>(prefix_evicted_.size());
    const int64_t listed = std::min(count, evicted);
    for (int64_t i = 0; evicted_out != nullptr && i < listed; ++i) evicted_out[i] = prefix_evicted_[static_cast<size_t>(i)];
    if (num_evicted != nullptr) *num_evicted = evicted;
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

  allocate(id, request, count, new_blocks_out);
}

int64_t Engine::append_runs(uint64_t id, int64_t count, int64_t hint, int32_t* runs_out, int64_t capacity) {
  Request& request = find_request(id);
  require_positive(count, "count");
  if (hint < 0) fail(TAGMA_E_INVALID_ARG, "hint ", hint, " must be >= 0");
  require_non_null(runs_out, "runs_out");
  if (capacity < count) fail(TAGMA_E_INVALID_ARG, "capacity ", capacity, " must be >= count ", count);
  if (free_list_.free_blocks() < count && lru_.size() > 0 && !prefix_) {  // the prefix index may evict
    fail(TAGMA_E_STATE, "count ", count, " would evict cache-only blocks (", free_list_.free_blocks(),
         " free): use tagma_request_append, which reports evictions");
  }
  // Before anything is sized by it: from here count < 2^31 (append() would refuse it the same way).
  if (free_list_.free_blocks() + lru_.size() < count) {
    fail(TAGMA_E_NO_SPACE, "count ", count, " exceeds ", free_list_.free_blocks(), " free + ", lru_.size(),
         " cache-only blocks");
  }
  hint = clamp_hint(hint);
  append_scratch_.resize(static_cast<size_t>(count));  // may throw bad_alloc: nothing changed yet
  // The hint is also remembered as the request's expected size: RESERVE keeps its remaining blocks free
  // for it while later appends (with or without a hint) grow it. At most 2^31 + kMaxHint: no overflow.
  const int64_t expected_before = request.expected_blocks();
  if (hint > 0) request.set_expected_blocks(request.num_blocks() + std::max(hint, count));
  growth_hint_ = hint;
  if (hint > 0 && request.num_blocks() == 0 && admission_percent_ > 0 && !admissible(id, request, count)) {
    const int64_t expected = request.expected_blocks();
    growth_hint_ = 0;
    request.set_expected_blocks(expected_before);
    fail(TAGMA_E_NO_SPACE, "count ", count, ": the ", admission_pieces_, " largest free parts clear of other",
         " requests' expected growth do not hold ", admission_percent_, "% of the request's expected ", expected,
         " blocks");
  }
  try {
    append(id, count, append_scratch_.data(), nullptr, nullptr);
  } catch (...) {
    growth_hint_ = 0;
    request.set_expected_blocks(expected_before);
    throw;
  }
  growth_hint_ = 0;
  return runs_from_scratch(runs_out);
}

// The blocks of the last append (append_scratch_) as maximal runs of consecutive ids, in logical order.
int64_t Engine::runs_from_scratch(int32_t* runs_out) const {
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

void Engine::allocate(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out) {
  if (prefix_) {
    prefix_allocate(id, request, count, new_blocks_out);
  } else {
    allocate_free(id, request, count, new_blocks_out);
  }
}

// Requires can_allocate(request, count).
void Engine::allocate_free(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out) {
  const int64_t ranges_before = request.num_ranges();
  const int32_t end_before = request.ranges().empty() ? -1 : request.ranges().back().end();
  auto rest = static_cast<int32_t>(count);

  const int32_t grown = growth_room(request, count);
  if (grown > 0) {
    take_blocks(request, request.ranges().back().end(), grown, new_blocks_out);
    ++counters_.in_place_growths;
    rest -= grown;
  }
  if (rest > 0) {
    std::optional<int32_t> start;
    if (policy_ == Policy::kReserve) {
      start = place_reserving(id, rest, std::max<int64_t>(rest, request.remaining_expected()));
    } else {
      const int64_t want =
          align_up(std::min<int64_t>(growth_hint_ - grown, geometry_.num_blocks), geometry_.align);
      if (want > rest) start = free_list_.place_for_growth(rest, static_cast<int32_t>(want));
      if (!start) start = free_list_.place(policy_, rest);
    }
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
  update_frontier(id, request, end_before);
}

// RESERVE admission: whether a request that holds no block yet finds room clear of other requests' expected
// growth for admission_percent_ % of its expected blocks (at most the usable space, so that an empty pool
// always admits): in one free range's open part (past its left neighbour's reservation) when
// admission_pieces_ is 1, else in its admission_pieces_ largest open parts together, the largest holding
// `count`. O(free ranges).
bool Engine::admissible(uint64_t id, const Request& request, int64_t count) const {
  if (policy_ != Policy::kReserve) return true;
  const int64_t usable = geometry_.end_usable - geometry_.first_usable;
  // expected_blocks() <= 2^31 + kMaxHint (clamped hints), so the product is far inside int64; saturate anyway
  // rather than trust every caller of set_expected_blocks.
  int64_t product = 0;
  const int64_t share = __builtin_mul_overflow(request.expected_blocks(), int64_t{admission_percent_}, &product)
                            ? usable
                            : product / 100 + (product % 100 != 0 ? 1 : 0);
  const int64_t want = std::min(std::max(share, count), usable);
  if (admission_pieces_ <= 1) {
    int tier = 0;
    place_reserving(id, static_cast<int32_t>(count), want, &tier);
    return tier == 1;
  }
  // The admission_pieces_ largest open parts must hold `want` together, the largest one `count`.
  std::vector<int64_t> open;
  for (const auto& [start, size] : free_list_.ranges()) {
    const int64_t reserved = std::min<int64_t>(reserved_at(start, id), size);
    const int32_t part =
        free_list_.capacity(static_cast<int32_t>(start + reserved), static_cast<int32_t>(size - reserved));
    if (part > 0) open.push_back(part);
  }
  const auto k = std::min<size_t>(open.size(), static_cast<size_t>(admission_pieces_));
  std::partial_sort(open.begin(), open.begin() + static_cast<std::ptrdiff_t>(k), open.end(), std::greater<>());
  int64_t total = 0;
  for (size_t i = 0; i < k; ++i) total += open[i];
  return k > 0 && open[0] >= count && total >= want;
}

void Engine::update_frontier(uint64_t id, const Request& request, int32_t old_end) {
  if (!tracks_frontiers()) return;  // kept only where placement reads it; rebuilt when it starts to be
  const int32_t new_end = request.ranges().empty() ? -1 : request.ranges().back().end();
  if (new_end == old_end) return;
  if (old_end >= 0) {
    const auto entry = frontiers_.find(old_end);
    if (entry != frontiers_.end() && entry->second == id) frontiers_.erase(entry);
  }
  if (new_end >= 0) frontiers_[new_end] = id;
}

int64_t Engine::reserved_at(int32_t block, uint64_t self) const {
  const auto entry = frontiers_.find(block);
  if (entry == frontiers_.end() || entry->second == self) return 0;
  const auto owner = requests_.find(entry->second);
  return owner == requests_.end() ? 0 : owner->second.remaining_expected();
}

// RESERVE: each free range is read as [reserved | unreserved]: its first blocks are kept for the request
// whose last range ends where it starts (that request's remaining expected blocks), the rest is open.
//   1. the open part that best fits `want` (smallest open capacity >= want): the new range starts right
//      after the reserved part, so both this request and its left neighbour can grow to their expected
//      sizes in place;
//   2. else the largest open part that holds `count`: as much room to grow as there is;
//   3. else the free range where starting `count` blocks cuts the fewest blocks from a neighbour's
//      reservation (ties: the larger range), placed as far right as `count` allows;
//   4. else nullopt (the caller splits into pieces, largest first).
// O(free ranges): it runs only when the request cannot grow in place.
std::optional<int32_t> Engine::place_reserving(uint64_t id, int32_t count, int64_t want, int* tier) const {
  constexpr int64_t kNone = -1;
  int64_t fit_start = kNone, fit_open = 0;    // tier 1
  int64_t room_start = kNone, room_open = 0;  // tier 2
  int64_t cut_start = kNone, cut_cost = 0, cut_size = 0;  // tier 3
  for (const auto& [start, size] : free_list_.ranges()) {
    const int32_t capacity = free_list_.capacity(start, size);
    if (capacity < count) continue;
    const int64_t reserved = std::min<int64_t>(reserved_at(start, id), size);
    const auto open_begin = static_cast<int32_t>(start + reserved);
    const int32_t open = free_list_.capacity(open_begin, static_cast<int32_t>(size - reserved));
    if (open >= want) {
      if (fit_start == kNone || open < fit_open) {
        fit_start = free_list_.aligned_start(open_begin);
        fit_open = open;
        if (open == want) break;
      }
    } else if (open >= count) {
      if (open > room_open) {
        room_start = free_list_.aligned_start(open_begin);
        room_open = open;
      }
    } else if (fit_start == kNone && room_start == kNone) {
      // The latest aligned start that still holds `count`: the neighbour keeps what lies before it.
      const auto last = static_cast<int32_t>(align_down(int64_t{start} + size - count, geometry_.align));
      const int64_t cost = std::max<int64_t>(int64_t{start} + reserved - last, 0);
      if (cut_start == kNone || cost < cut_cost || (cost == cut_cost && size > cut_size)) {
        cut_start = last;
        cut_cost = cost;
        cut_size = size;
      }
    }
  }
  if (tier != nullptr) *tier = fit_start != kNone ? 1 : room_start != kNone ? 2 : cut_start != kNone ? 3 : 4;
  if (fit_start != kNone) return static_cast<int32_t>(fit_start);
  if (room_start != kNone) return static_cast<int32_t>(room_start);
  if (cut_start != kNone) return static_cast<int32_t>(cut_start);
  return std::nullopt;
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
  take_unused(start, count);
  for (int32_t block = start; block < start + count; ++block) {
    req_refs_[static_cast<size_t>(block)] = 1;
    if (!used_ever_.empty() && used_ever_[static_cast<size_t>(block)] == 0) {
      used_ever_[static_cast<size_t>(block)] = 1;
      --never_used_;
    }
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
