#include "reference_model.h"

#include <algorithm>

namespace test {

ReferenceModel::ReferenceModel(int32_t num_blocks, int32_t align, int32_t policy)
    : num_blocks_(num_blocks),
      align_(align),
      end_usable_(num_blocks / align * align),
      policy_(policy),
      req_(static_cast<size_t>(num_blocks), 0),
      cache_(static_cast<size_t>(num_blocks), 0) {}

uint64_t ReferenceModel::create_request() {
  requests_[next_request_] = {};
  return next_request_++;
}

Pairs ReferenceModel::free_ranges() const {
  Pairs ranges;
  for (int32_t b = align_; b < end_usable_; ++b) {
    if (!is_free(b)) continue;
    if (!ranges.empty() && ranges.back().first + ranges.back().second == b) {
      ++ranges.back().second;
    } else {
      ranges.emplace_back(b, 1);
    }
  }
  return ranges;
}

int64_t ReferenceModel::capacity(int32_t start, int32_t count) const {
  return std::max<int64_t>(0, align_down(int64_t{start} + count) - align_up(start));
}

int32_t ReferenceModel::placement(int32_t count) const {
  const Pairs free = free_ranges();
  int chosen = -1;
  for (int i = 0; i < static_cast<int>(free.size()); ++i) {
    const int64_t cap = capacity(free[i].first, free[i].second);
    if (cap < count) continue;
    if (chosen < 0) {
      chosen = i;
      if (policy_ == TAGMA_POLICY_FIRST_FIT) break;
      continue;
    }
    const int64_t chosen_cap = capacity(free[chosen].first, free[chosen].second);
    if (policy_ == TAGMA_POLICY_BEST_FIT && cap < chosen_cap) chosen = i;
    if (policy_ == TAGMA_POLICY_HEADROOM && cap > chosen_cap) chosen = i;
  }
  if (chosen < 0) return -1;
  const auto [start, length] = free[chosen];
  if (policy_ != TAGMA_POLICY_HEADROOM || start == align_) return align_up(start);
  return std::max(align_up(start), align_down(start + (length - count) / 2));
}

void ReferenceModel::evict_front() {
  const int32_t block = lru_.front();
  lru_.erase(lru_.begin());
  cache_[block] = 0;
}

void ReferenceModel::take(uint64_t request, int32_t start, int32_t count, std::vector<int32_t>* new_blocks) {
  std::vector<RangeTriple>& ranges = requests_[request];
  int32_t logical = ranges.empty() ? 0 : ranges.back().first_logical + ranges.back().count;
  for (int32_t b = start; b < start + count; ++b) {
    req_[b] = 1;
    new_blocks->push_back(b);
  }
  if (!ranges.empty() && ranges.back().start + ranges.back().count == start) {
    ranges.back().count += count;
  } else {
    ranges.push_back(RangeTriple{start, count, logical});
  }
}

tagma_status ReferenceModel::append(uint64_t request, int64_t count, std::vector<int32_t>* new_blocks,
                                    std::vector<int32_t>* evicted) {
  new_blocks->clear();
  evicted->clear();
  if (requests_.count(request) == 0) return TAGMA_E_NOT_FOUND;
  if (count <= 0) return TAGMA_E_INVALID_ARG;
  if (count % align_ != 0) return TAGMA_E_MISALIGNED;
  int64_t free_blocks = 0;
  for (const auto& range : free_ranges()) free_blocks += range.second;
  if (free_blocks + static_cast<int64_t>(lru_.size()) < count) return TAGMA_E_NO_SPACE;

  const ReferenceModel before = *this;
  for (int64_t i = free_blocks; i < count; ++i) {
    evicted->push_back(lru_.front());
    evict_front();
  }
  auto rest = static_cast<int32_t>(count);
  std::vector<RangeTriple>& ranges = requests_[request];
  if (!ranges.empty()) {
    const int32_t end = ranges.back().start + ranges.back().count;
    int32_t run = 0;
    while (usable(end + run) && is_free(end + run)) ++run;
    const int32_t grow = align_down(std::min<int64_t>(run, count));
    if (grow > 0) {
      take(request, end, grow, new_blocks);
      ++in_place_growths_;
      rest -= grow;
    }
  }
  if (rest > 0) {
    const int32_t start = placement(rest);
    if (start >= 0) {
      const size_t ranges_before = requests_[request].size();
      take(request, start, rest, new_blocks);
      (requests_[request].size() > ranges_before ? new_ranges_ : merges_) += 1;
      rest = 0;
    }
  }
  while (rest > 0) {  // largest capacity first, lowest address on ties
    const Pairs free = free_ranges();
    int32_t best_start = -1;
    int64_t best_cap = 0;
    for (const auto& [start, length] : free) {
      if (capacity(start, length) > best_cap) {
        best_cap = capacity(start, length);
        best_start = start;
      }
    }
    if (best_start < 0) {  // aligned pieces cannot satisfy the request: undo everything
      *this = before;
      new_blocks->clear();
      evicted->clear();
      return TAGMA_E_NO_SPACE;
    }
    const auto piece = static_cast<int32_t>(std::min<int64_t>(best_cap, rest));
    const size_t ranges_before = requests_[request].size();
    take(request, align_up(best_start), piece, new_blocks);
    (requests_[request].size() > ranges_before ? new_ranges_ : merges_) += 1;
    rest -= piece;
  }
  evictions_ += static_cast<int64_t>(evicted->size());
  appended_blocks_ += count;
  return TAGMA_OK;
}

tagma_status ReferenceModel::attach(uint64_t request, const std::vector<int32_t>& blocks) {
  if (requests_.count(request) == 0) return TAGMA_E_NOT_FOUND;
  if (blocks.empty()) return TAGMA_E_INVALID_ARG;
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_) return TAGMA_E_OUT_OF_RANGE;
    if (b == 0 || is_free(b)) return TAGMA_E_STATE;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (blocks[i] == blocks[j]) return TAGMA_E_STATE;
    }
  }
  std::vector<RangeTriple>& ranges = requests_[request];
  for (const RangeTriple& range : ranges) {
    for (const int32_t b : blocks) {
      if (b >= range.start && b < range.start + range.count) return TAGMA_E_STATE;
    }
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = blocks[i];
    if (req_[b] == 0) lru_.erase(std::find(lru_.begin(), lru_.end(), b));
    ++req_[b];
    int32_t logical = ranges.empty() ? 0 : ranges.back().first_logical + ranges.back().count;
    const bool adjacent = !ranges.empty() && ranges.back().start + ranges.back().count == b;
    // Only the first block of an attach can merge into a range the request had before.
    if (adjacent && i == 0) ++merges_;
    if (adjacent) {
      ++ranges.back().count;
    } else {
      ranges.push_back(RangeTriple{b, 1, logical});
    }
  }
  return TAGMA_OK;
}

tagma_status ReferenceModel::release(uint64_t request) {
  const auto found = requests_.find(request);
  if (found == requests_.end()) return TAGMA_E_NOT_FOUND;
  std::vector<int32_t> blocks;
  for (const RangeTriple& range : found->second) {
    for (int32_t b = range.start; b < range.start + range.count; ++b) blocks.push_back(b);
  }
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (--req_[*b] == 0 && cache_[*b] > 0) lru_.push_back(*b);
  }
  requests_.erase(found);
  return TAGMA_OK;
}

tagma_status ReferenceModel::mark(const std::vector<int32_t>& blocks) {
  if (blocks.empty()) return TAGMA_E_INVALID_ARG;
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_) return TAGMA_E_OUT_OF_RANGE;
    if (b == 0 || is_free(b)) return TAGMA_E_STATE;
  }
  for (const int32_t b : blocks) ++cache_[b];
  return TAGMA_OK;
}

tagma_status ReferenceModel::unmark(const std::vector<int32_t>& blocks) {
  if (blocks.empty()) return TAGMA_E_INVALID_ARG;
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_) return TAGMA_E_OUT_OF_RANGE;
  }
  std::vector<int32_t> cache = cache_;
  for (const int32_t b : blocks) {
    if (cache[b] == 0) return TAGMA_E_STATE;
    --cache[b];
  }
  cache_ = cache;
  lru_.erase(std::remove_if(lru_.begin(), lru_.end(), [&](int32_t b) { return cache_[b] == 0; }), lru_.end());
  return TAGMA_OK;
}

tagma_status ReferenceModel::evict(int64_t max_blocks, std::vector<int32_t>* evicted) {
  evicted->clear();
  if (max_blocks <= 0) return TAGMA_E_INVALID_ARG;
  while (!lru_.empty() && static_cast<int64_t>(evicted->size()) < max_blocks) {
    evicted->push_back(lru_.front());
    evict_front();
  }
  evictions_ += static_cast<int64_t>(evicted->size());
  return TAGMA_OK;
}

int64_t ReferenceModel::clear() {
  int64_t dropped = 0;
  for (int32_t& refs : cache_) {
    dropped += refs > 0 ? 1 : 0;
    refs = 0;
  }
  lru_.clear();
  return dropped;
}

}  // namespace test
