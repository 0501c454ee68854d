#include "request.h"

#include <algorithm>

#include "error.h"

namespace tagma {

size_t Request::range_index(int64_t logical) const {
  const auto after = std::upper_bound(ranges_.begin(), ranges_.end(), logical,
                                      [](int64_t value, const Range& range) { return value < range.first_logical; });
  return static_cast<size_t>(after - ranges_.begin()) - 1;
}

int32_t Request::physical(int64_t logical) const {
  const Range& range = ranges_[range_index(logical)];
  return static_cast<int32_t>(range.start + (logical - range.first_logical));
}

bool Request::append_range(int32_t start, int32_t count) {
  const bool merges = !ranges_.empty() && ranges_.back().end() == start;
  if (merges) {
    ranges_.back().count += count;
  } else {
    ranges_.push_back(Range{start, count, num_blocks_});
  }
  num_blocks_ += count;
  return merges;
}

void RangeCountStats::add(int64_t ranges) {
  ++requests_by_ranges_[ranges];
  total_ranges_ += ranges;
}

void RangeCountStats::remove(int64_t ranges) {
  const auto bucket = requests_by_ranges_.find(ranges);
  if (bucket == requests_by_ranges_.end()) fail(TAGMA_E_INTERNAL, "no request is counted with ", ranges, " ranges");
  if (--bucket->second == 0) requests_by_ranges_.erase(bucket);
  total_ranges_ -= ranges;
}

void RangeCountStats::change(int64_t before, int64_t after) {
  if (before == after) return;
  remove(before);
  add(after);
}

}  // namespace tagma
