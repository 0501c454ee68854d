// The coalesced free list of the range allocator.
#ifndef TAGMA_FREE_LIST_H
#define TAGMA_FREE_LIST_H

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "max_tree.h"
#include "tagma.h"

namespace tagma {

enum class Policy : int32_t {
  kFirstFit = TAGMA_POLICY_FIRST_FIT,
  kBestFit = TAGMA_POLICY_BEST_FIT,
  kHeadroom = TAGMA_POLICY_HEADROOM,
  kReserve = TAGMA_POLICY_RESERVE,
};

// Throws TAGMA_E_INVALID_ARG for an unknown policy value.
Policy parse_policy(int32_t policy);

inline int64_t align_down(int64_t value, int64_t align) { return value / align * align; }
inline int64_t align_up(int64_t value, int64_t align) { return align_down(value + align - 1, align); }

struct FreeRange {
  int32_t start;
  int32_t count;
};

// Free blocks of the usable space [first, end), kept as maximal (always coalesced) ranges.
//
// A range's "capacity" is how many blocks it offers at aligned positions: the length of its largest
// sub-range whose start and end are multiples of align (equal to its length when align == 1). New ranges
// are placed by capacity, so unaligned fragments left by single-block eviction are handled exactly.
//
// Indexes, all updated together in O(log F) (F = number of free ranges; the tree is O(log num_blocks)):
//   by_start_     start -> count: address order, coalescing, "which range holds block b".
//   by_length_    (count, start): the largest range, for statistics.
//   by_capacity_  (capacity, start) for ranges with capacity > 0: best fit and largest-capacity queries.
//   capacity_at_  max tree over start addresses holding each range's capacity: first fit.
class FreeList {
 public:
  // All of [first, end) starts free. first and end are multiples of align; first >= 1.
  FreeList(int32_t first, int32_t end, int32_t align);

  // Returns [start, start + count) to the free list, merging with free neighbours.
  void add(int32_t start, int32_t count);
  // Removes [start, start + count), which must lie inside one free range.
  void take(int32_t start, int32_t count);

  // Length of the free range that starts exactly at `start`, or 0.
  int32_t run_at(int32_t start) const;
  // The free range that holds `block`, or {block, 0} when the block is not free.
  FreeRange range_holding(int32_t block) const;
  // Start of a new aligned range of `count` blocks (a multiple of align) chosen by the policy among free
  // ranges with capacity >= count, or nullopt when none has it.
  std::optional<int32_t> place(Policy policy, int32_t count) const;
  // Start of a new range of `count` blocks for a request that expects `want` >= count blocks in total from
  // here: inside the smallest free range with capacity >= want, in the middle of its slack (capacity -
  // want), so the request can grow in place to `want` and both neighbours keep room. nullopt when no free
  // range holds `want`.
  std::optional<int32_t> place_for_growth(int32_t count, int32_t want) const;
  // Start of a new range of `count` blocks for a request that expects `want` >= count blocks from here:
  // inside the largest free range when its capacity holds `want`, in the middle of its slack (capacity -
  // want; at its start when it begins the usable space). nullopt when the largest does not hold `want`.
  std::optional<int32_t> place_in_largest(int32_t count, int32_t want) const;
  // The lowest-addressed free range of largest capacity; requires total_capacity() > 0.
  FreeRange largest_by_capacity() const;
  int32_t capacity(int32_t start, int32_t count) const;
  int32_t aligned_start(int32_t start) const { return static_cast<int32_t>(align_up(start, align_)); }

  int64_t free_blocks() const { return free_blocks_; }
  int64_t total_capacity() const { return total_capacity_; }
  int64_t num_ranges() const { return static_cast<int64_t>(by_start_.size()); }
  int32_t largest_range() const { return by_length_.empty() ? 0 : by_length_.rbegin()->first; }
  const std::map<int32_t, int32_t>& ranges() const { return by_start_; }

 private:
  void insert_range(int32_t start, int32_t count);
  void erase_range(std::map<int32_t, int32_t>::iterator range);
  FreeRange lowest_with_capacity(int32_t capacity) const;
  int32_t headroom_start(FreeRange range, int32_t count) const;

  int32_t first_;
  int32_t end_;
  int32_t align_;
  int64_t free_blocks_ = 0;
  int64_t total_capacity_ = 0;
  std::map<int32_t, int32_t> by_start_;
  std::set<std::pair<int32_t, int32_t>> by_length_;
  std::set<std::pair<int32_t, int32_t>> by_capacity_;
  MaxTree capacity_at_;
};

// Gathers blocks freed one at a time into runs of consecutive ids (ascending or descending), so that the
// free list gets one add() per run. Call flush() when done.
class FreeRunBuilder {
 public:
  explicit FreeRunBuilder(FreeList& free_list) : free_list_(free_list) {}
  void add(int32_t block);
  void flush();

 private:
  FreeList& free_list_;
  int32_t start_ = 0;
  int32_t count_ = 0;
};

}  // namespace tagma

#endif  // TAGMA_FREE_LIST_H
