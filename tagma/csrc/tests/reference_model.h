// A deliberately naive re-implementation of the engine's documented semantics (linear scans over per-block
// state, copy-and-restore for failures) to cross-check the real engine on random operation sequences.
#ifndef TAGMA_REFERENCE_MODEL_H
#define TAGMA_REFERENCE_MODEL_H

#include <cstdint>
#include <map>
#include <vector>

#include "helpers.h"
#include "tagma.h"

namespace test {

class ReferenceModel {
 public:
  ReferenceModel(int32_t num_blocks, int32_t align, int32_t policy);

  void set_policy(int32_t policy) { policy_ = policy; }
  uint64_t create_request();
  tagma_status append(uint64_t request, int64_t count, std::vector<int32_t>* new_blocks, std::vector<int32_t>* evicted);
  tagma_status attach(uint64_t request, const std::vector<int32_t>& blocks);
  tagma_status release(uint64_t request);
  tagma_status mark(const std::vector<int32_t>& blocks);
  tagma_status unmark(const std::vector<int32_t>& blocks);
  tagma_status evict(int64_t max_blocks, std::vector<int32_t>* evicted);
  int64_t clear();

  Pairs free_ranges() const;
  const std::vector<int32_t>& req_refs() const { return req_; }
  const std::vector<int32_t>& cache_refs() const { return cache_; }
  const std::vector<int32_t>& lru() const { return lru_; }
  const std::map<uint64_t, std::vector<RangeTriple>>& requests() const { return requests_; }
  std::vector<int64_t> counters() const {
    return {in_place_growths_, new_ranges_, merges_, evictions_, appended_blocks_};
  }

 private:
  bool usable(int32_t block) const { return block >= align_ && block < end_usable_; }
  bool is_free(int32_t block) const { return req_[block] == 0 && cache_[block] == 0; }
  int64_t capacity(int32_t start, int32_t count) const;
  int32_t align_up(int64_t value) const { return static_cast<int32_t>((value + align_ - 1) / align_ * align_); }
  int32_t align_down(int64_t value) const { return static_cast<int32_t>(value / align_ * align_); }
  int32_t placement(int32_t count) const;  // -1 when no free range has the capacity
  void evict_front();
  void take(uint64_t request, int32_t start, int32_t count, std::vector<int32_t>* new_blocks);

  int32_t num_blocks_;
  int32_t align_;
  int32_t end_usable_;
  int32_t policy_;
  std::vector<int32_t> req_;
  std::vector<int32_t> cache_;
  std::vector<int32_t> lru_;  // front is evicted first
  std::map<uint64_t, std::vector<RangeTriple>> requests_;
  uint64_t next_request_ = 1;
  int64_t in_place_growths_ = 0;
  int64_t new_ranges_ = 0;
  int64_t merges_ = 0;
  int64_t evictions_ = 0;
  int64_t appended_blocks_ = 0;
};

}  // namespace test

#endif  // TAGMA_REFERENCE_MODEL_H
