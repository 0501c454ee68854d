// A request's logical-to-physical block map as a list of contiguous physical ranges.
#ifndef TAGMA_REQUEST_H
#define TAGMA_REQUEST_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace tagma {

struct Range {
  int32_t start;          // first physical block
  int32_t count;          // number of blocks
  int32_t first_logical;  // logical index of `start` within the request
  int32_t end() const { return start + count; }
};

// Ranges are ordered by logical block and contiguous in logical space from 0. Consecutive ranges are
// never physically adjacent: such a range is merged into its predecessor.
class Request {
 public:
  const std::vector<Range>& ranges() const { return ranges_; }
  int64_t num_ranges() const { return static_cast<int64_t>(ranges_.size()); }
  int32_t num_blocks() const { return num_blocks_; }
  // Blocks the request expects to hold in all (the append_runs hint plus what it held), 0 when unknown.
  int64_t expected_blocks() const { return expected_blocks_; }
  void set_expected_blocks(int64_t blocks) { expected_blocks_ = blocks; }
  // Expected blocks not yet appended: what the request's growth may still need.
  int64_t remaining_expected() const { return std::max<int64_t>(expected_blocks_ - num_blocks_, 0); }

  // The LRU clock when CONTIGUOUS placement put the last range (and so chose its room to grow); the
  // lowest int64 when another path put it.
  int64_t placed_at() const { return placed_at_; }
  void set_placed_at(int64_t clock) { placed_at_ = clock; }

  // Physical block of logical block `logical`, which must be in [0, num_blocks()). O(log ranges).
  int32_t physical(int64_t logical) const;
  // Index of the range holding logical block `logical` in [0, num_blocks()). O(log ranges).
  size_t range_index(int64_t logical) const;

  // Appends physical blocks [start, start + count) at the logical end, merging into the last range when it
  // ends at `start`. Returns whether it merged.
  bool append_range(int32_t start, int32_t count);
  // Removes the first `count` (in [0, num_blocks()]) logical blocks, calling visit(block) on each in reverse
  // logical order; the rest are renumbered from logical 0. O(ranges).
  template <typename Visit>
  void drop_front(int32_t count, Visit&& visit);

 private:
  std::vector<Range> ranges_;
  int32_t num_blocks_ = 0;
  int64_t expected_blocks_ = 0;
  int64_t placed_at_ = std::numeric_limits<int64_t>::min();
};

template <typename Visit>
void Request::drop_front(int32_t count, Visit&& visit) {
  size_t whole = 0;  // ranges wholly dropped
  int32_t left = count;
  while (whole < ranges_.size() && ranges_[whole].count <= left) left -= ranges_[whole++].count;
  if (whole < ranges_.size() && left > 0) {
    Range& cut = ranges_[whole];
    for (int32_t block = cut.start + left - 1; block >= cut.start; --block) visit(block);
    cut.start += left;
    cut.count -= left;
    cut.first_logical += left;
  }
  for (size_t i = whole; i-- > 0;) {
    for (int32_t block = ranges_[i].end() - 1; block >= ranges_[i].start; --block) visit(block);
  }
  ranges_.erase(ranges_.begin(), ranges_.begin() + static_cast<std::ptrdiff_t>(whole));
  for (Range& range : ranges_) range.first_logical -= count;
  num_blocks_ -= count;
  expected_blocks_ = std::max<int64_t>(expected_blocks_ - count, 0);
}

// How many live requests have each number of ranges: gives max_request_ranges and the histogram.
class RangeCountStats {
 public:
  void add(int64_t ranges);
  void remove(int64_t ranges);
  void change(int64_t before, int64_t after);

  int64_t total_ranges() const { return total_ranges_; }
  int64_t max_ranges() const { return requests_by_ranges_.empty() ? 0 : requests_by_ranges_.rbegin()->first; }
  const std::map<int64_t, int64_t>& requests_by_ranges() const { return requests_by_ranges_; }

 private:
  std::map<int64_t, int64_t> requests_by_ranges_;  // number of ranges -> number of requests (> 0)
  int64_t total_ranges_ = 0;
};

}  // namespace tagma

#endif  // TAGMA_REQUEST_H
