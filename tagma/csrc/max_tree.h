// Max segment tree over indices [0, size): point update, and "leftmost index whose value is >= x".
#ifndef TAGMA_MAX_TREE_H
#define TAGMA_MAX_TREE_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tagma {

class MaxTree {
 public:
  explicit MaxTree(int32_t size) : leaves_(1) {
    while (leaves_ < size) leaves_ *= 2;
    node_.assign(2 * static_cast<size_t>(leaves_), 0);
  }

  // O(log size).
  void set(int32_t index, int32_t value) {
    size_t i = static_cast<size_t>(leaves_) + static_cast<size_t>(index);
    node_[i] = value;
    for (i /= 2; i >= 1; i /= 2) {
      const int32_t larger = node_[2 * i] > node_[2 * i + 1] ? node_[2 * i] : node_[2 * i + 1];
      if (node_[i] == larger) break;  // ancestors are unchanged too
      node_[i] = larger;
    }
  }

  // Lowest index whose value is >= value, or -1. O(log size).
  int32_t leftmost_at_least(int32_t value) const {
    if (node_[1] < value) return -1;
    size_t i = 1;
    while (i < static_cast<size_t>(leaves_)) i = node_[2 * i] >= value ? 2 * i : 2 * i + 1;
    return static_cast<int32_t>(i - static_cast<size_t>(leaves_));
  }

 private:
  int64_t leaves_;             // a power of two >= size
  std::vector<int32_t> node_;  // node_[1] is the root; leaves are node_[leaves_ + index]
};

}  // namespace tagma

#endif  // TAGMA_MAX_TREE_H
