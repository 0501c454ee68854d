#include "free_list.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "error.h"

namespace tagma {

Policy parse_policy(int32_t policy) {
  switch (policy) {
    case TAGMA_POLICY_FIRST_FIT:
    case TAGMA_POLICY_BEST_FIT:
    case TAGMA_POLICY_HEADROOM:
    case TAGMA_POLICY_RESERVE:
      return static_cast<Policy>(policy);
    default:
      fail(TAGMA_E_INVALID_ARG, "policy ", policy, " is unknown (0 first fit, 1 best fit, 2 headroom, 3 reserve)");
  }
}

FreeList::FreeList(int32_t first, int32_t end, int32_t align)
    : first_(first), end_(end), align_(align), capacity_at_(end) {
  insert_range(first, end - first);
}

int32_t FreeList::capacity(int32_t start, int32_t count) const {
  const int64_t aligned = align_down(int64_t{start} + count, align_) - align_up(start, align_);
  return static_cast<int32_t>(std::max<int64_t>(aligned, 0));
}

void FreeList::add(int32_t start, int32_t count) {
  const int64_t end = int64_t{start} + count;
  if (count <= 0 || start < first_ || end > end_) {
    fail(TAGMA_E_INTERNAL, "free list: cannot add [", start, ", ", end, ") outside [", first_, ", ", end_, ")");
  }
  auto next = by_start_.lower_bound(start);
  const bool overlaps_next = next != by_start_.end() && next->first < end;
  const auto prev = next == by_start_.begin() ? by_start_.end() : std::prev(next);
  const bool overlaps_prev = prev != by_start_.end() && int64_t{prev->first} + prev->second > start;
  if (overlaps_next || overlaps_prev) fail(TAGMA_E_INTERNAL, "free list: [", start, ", ", end, ") is already free");

  if (prev != by_start_.end() && prev->first + prev->second == start) {
    start = prev->first;
    count += prev->second;
    erase_range(prev);
  }
  if (next != by_start_.end() && next->first == end) {
    count += next->second;
    erase_range(next);
  }
  insert_range(start, count);
}

void FreeList::take(int32_t start, int32_t count) {
  const int64_t end = int64_t{start} + count;
  auto range = by_start_.upper_bound(start);
  const bool inside = count > 0 && range != by_start_.begin() &&
                      end <= int64_t{std::prev(range)->first} + std::prev(range)->second;
  if (!inside) fail(TAGMA_E_INTERNAL, "free list: [", start, ", ", end, ") is not free");

  --range;
  const int32_t range_start = range->first;
  const int32_t range_end = range->first + range->second;
  erase_range(range);
  if (range_start < start) insert_range(range_start, start - range_start);
  if (end < range_end) insert_range(static_cast<int32_t>(end), static_cast<int32_t>(range_end - end));
}

int32_t FreeList::run_at(int32_t start) const {
  const auto range = by_start_.find(start);
  return range == by_start_.end() ? 0 : range->second;
}

FreeRange FreeList::range_holding(int32_t block) const {
  auto range = by_start_.upper_bound(block);
  if (range == by_start_.begin()) return FreeRange{block, 0};
  --range;
  if (int64_t{range->first} + range->second <= block) return FreeRange{block, 0};
  return FreeRange{range->first, range->second};
}

std::optional<int32_t> FreeList::place(Policy policy, int32_t count) const {
  switch (policy) {
    case Policy::kFirstFit: {
      const int32_t start = capacity_at_.leftmost_at_least(count);
      if (start < 0) return std::nullopt;
      return aligned_start(start);
    }
    case Policy::kBestFit:
    case Policy::kReserve: {  // the engine places by reservations first; without them, best fit
      const auto best = by_capacity_.lower_bound({count, std::numeric_limits<int32_t>::min()});
      if (best == by_capacity_.end()) return std::nullopt;
      return aligned_start(best->second);
    }
    case Policy::kHeadroom: {
      if (by_capacity_.empty() || by_capacity_.rbegin()->first < count) return std::nullopt;
      return headroom_start(largest_by_capacity(), count);
    }
  }
  fail(TAGMA_E_INTERNAL, "free list: unknown policy ", static_cast<int32_t>(policy));
}

std::optional<int32_t> FreeList::place_for_growth(int32_t count, int32_t want) const {
  if (want < count) want = count;
  const auto best = by_capacity_.lower_bound({want, std::numeric_limits<int32_t>::min()});
  if (best == by_capacity_.end()) return std::nullopt;
  return headroom_start(FreeRange{best->second, by_start_.at(best->second)}, want);
}

std::optional<int32_t> FreeList::place_in_largest(int32_t count, int32_t want) const {
  if (want < count) want = count;
  if (by_capacity_.empty() || by_capacity_.rbegin()->first < want) return std::nullopt;
  return headroom_start(largest_by_capacity(), want);
}

FreeRange FreeList::largest_by_capacity() const {
  if (by_capacity_.empty()) fail(TAGMA_E_INTERNAL, "free list: no free range has aligned capacity");
  return lowest_with_capacity(by_capacity_.rbegin()->first);
}

FreeRange FreeList::lowest_with_capacity(int32_t capacity) const {
  const auto entry = by_capacity_.lower_bound({capacity, std::numeric_limits<int32_t>::min()});
  return FreeRange{entry->second, by_start_.at(entry->second)};
}

// HEADROOM: at the start of the free range when it begins the usable space (nothing to its left can grow),
// otherwise in its middle (rounded down to alignment) so that both neighbours keep room to grow.
int32_t FreeList::headroom_start(FreeRange range, int32_t count) const {
  const int32_t first_aligned = aligned_start(range.start);
  if (range.start == first_) return first_aligned;
  const int64_t middle = align_down(int64_t{range.start} + (range.count - count) / 2, align_);
  return static_cast<int32_t>(std::max<int64_t>(first_aligned, middle));
}

void FreeList::insert_range(int32_t start, int32_t count) {
  const int32_t cap = capacity(start, count);
  by_start_.emplace(start, count);
  by_length_.emplace(count, start);
  if (cap > 0) by_capacity_.emplace(cap, start);
  capacity_at_.set(start, cap);
  free_blocks_ += count;
  total_capacity_ += cap;
}

void FreeList::erase_range(std::map<int32_t, int32_t>::iterator range) {
  const int32_t start = range->first;
  const int32_t count = range->second;
  const int32_t cap = capacity(start, count);
  by_length_.erase({count, start});
  if (cap > 0) by_capacity_.erase({cap, start});
  capacity_at_.set(start, 0);
  by_start_.erase(range);
  free_blocks_ -= count;
  total_capacity_ -= cap;
}

void FreeRunBuilder::add(int32_t block) {
  if (count_ > 0 && block == start_ - 1) {
    --start_;
    ++count_;
  } else if (count_ > 0 && block == start_ + count_) {
    ++count_;
  } else {
    flush();
    start_ = block;
    count_ = 1;
  }
}

void FreeRunBuilder::flush() {
  if (count_ > 0) free_list_.add(start_, count_);
  count_ = 0;
}

}  // namespace tagma
