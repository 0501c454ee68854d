// Evictable (cache-only) blocks in LRU order: an intrusive doubly linked list over block ids, like vLLM's
// FreeKVCacheBlockQueue. Every operation is O(1).
#ifndef TAGMA_LRU_H
#define TAGMA_LRU_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tagma {

class Lru {
 public:
  explicit Lru(int32_t num_blocks);

  bool contains(int32_t block) const { return next_[static_cast<size_t>(block)] != kNotListed; }
  int64_t size() const { return size_; }
  // The next block to evict; requires size() > 0.
  int32_t front() const { return next_[sentinel()]; }
  // The block after `block` in eviction order, or -1 after the last one.
  int32_t next(int32_t block) const;

  void push_back(int32_t block);   // becomes the last to evict
  void push_front(int32_t block);  // becomes the next to evict
  void remove(int32_t block);

  // The stamp the next push_back gets: every block listed before now has a smaller one.
  int64_t clock() const { return clock_; }
  // When a listed block entered the list (push_front: just before the front).
  int64_t stamp(int32_t block) const { return stamp_[static_cast<size_t>(block)]; }

  // Whether a listed block entered the list in the older half of the time span of the blocks listed now
  // (each entry is stamped with a clock; the front's stamp is the oldest, the back's the newest). O(1).
  bool older_half(int32_t block) const {
    const int64_t oldest = stamp_[static_cast<size_t>(front())];
    const int64_t newest = stamp_[static_cast<size_t>(prev_[sentinel()])];
    return stamp_[static_cast<size_t>(block)] - oldest <= (newest - oldest) / 2;
  }

 private:
  static constexpr int32_t kNotListed = -1;
  size_t sentinel() const { return prev_.size() - 1; }
  void link(int32_t block, int32_t before, int32_t after);

  // Index num_blocks is the sentinel of the circular list.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<int64_t> stamp_;  // per block: the clock when it was listed (push_front: before the front)
  int64_t clock_ = 0;
  int64_t size_ = 0;
};

}  // namespace tagma

#endif  // TAGMA_LRU_H
