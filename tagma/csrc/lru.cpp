#include "lru.h"

#include "error.h"

namespace tagma {

Lru::Lru(int32_t num_blocks)
    : prev_(static_cast<size_t>(num_blocks) + 1, kNotListed),
      next_(static_cast<size_t>(num_blocks) + 1, kNotListed),
      stamp_(static_cast<size_t>(num_blocks) + 1, 0) {
  const auto sentinel_id = static_cast<int32_t>(sentinel());
  prev_[sentinel()] = sentinel_id;
  next_[sentinel()] = sentinel_id;
}

int32_t Lru::next(int32_t block) const {
  const int32_t after = next_[static_cast<size_t>(block)];
  return after == static_cast<int32_t>(sentinel()) ? -1 : after;
}

void Lru::push_back(int32_t block) {
  link(block, prev_[sentinel()], static_cast<int32_t>(sentinel()));
  stamp_[static_cast<size_t>(block)] = clock_++;
}

void Lru::push_front(int32_t block) {
  const int64_t stamp = size_ > 0 ? stamp_[static_cast<size_t>(front())] - 1 : clock_++;
  link(block, static_cast<int32_t>(sentinel()), next_[sentinel()]);
  stamp_[static_cast<size_t>(block)] = stamp;
}

void Lru::link(int32_t block, int32_t before, int32_t after) {
  if (contains(block)) fail(TAGMA_E_INTERNAL, "lru: block ", block, " is already listed");
  prev_[static_cast<size_t>(block)] = before;
  next_[static_cast<size_t>(block)] = after;
  next_[static_cast<size_t>(before)] = block;
  prev_[static_cast<size_t>(after)] = block;
  ++size_;
}

void Lru::remove(int32_t block) {
  if (!contains(block)) fail(TAGMA_E_INTERNAL, "lru: block ", block, " is not listed");
  const auto index = static_cast<size_t>(block);
  next_[static_cast<size_t>(prev_[index])] = next_[index];
  prev_[static_cast<size_t>(next_[index])] = prev_[index];
  prev_[index] = kNotListed;
  next_[index] = kNotListed;
  --size_;
}

}  // namespace tagma
