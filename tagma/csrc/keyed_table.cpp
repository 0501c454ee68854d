// The keyed side blocks' table and the chained content key (keyed_table.h).
#include "keyed_table.h"

#include <algorithm>

namespace tagma {

namespace {

// A full-avalanche 64-bit mix (the splitmix64 finalizer's constants).
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

}  // namespace

ChainKey namespace_key(uint64_t ns) {
  return ChainKey{mix64(ns ^ 0x243F6A8885A308D3ULL), mix64(ns + 0x13198A2E03707344ULL)};
}

ChainKey chain_key(const ChainKey& prev, const int32_t* tokens, int32_t block_size) {
  // Two lanes, each a chain of full mixes over the block's tokens read two at a time, entering each lane
  // differently; the block size is fixed per index, so a block's tokens need no length.
  uint64_t a = prev.lo;
  uint64_t b = prev.hi;
  int32_t i = 0;
  for (; i + 1 < block_size; i += 2) {
    const uint64_t word = static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    a = mix64(a ^ word);
    b = mix64(b + word * 0xC2B2AE3D27D4EB4FULL);
  }
  if (i < block_size) {
    const uint64_t word = static_cast<uint32_t>(tokens[i]);
    a = mix64(a ^ word);
    b = mix64(b + word * 0xC2B2AE3D27D4EB4FULL);
  }
  return ChainKey{mix64(a + rotl(b, 29)), mix64(b ^ rotl(a, 41) ^ 0xA4093822299F31D0ULL)};
}

KeyedTable::KeyedTable(int32_t num_blocks) {
  size_t capacity = 16;
  int bits = 4;
  while (capacity < 2 * static_cast<size_t>(num_blocks)) {
    capacity *= 2;
    ++bits;
  }
  slots_.assign(capacity, Slot{0, 0, kNone});
  key_of_.assign(static_cast<size_t>(num_blocks), ChainKey{});
  shift_ = 64 - bits;
  mask_ = capacity - 1;
}

ChainKey KeyedTable::with_group(const ChainKey& key, int32_t group) {
  return ChainKey{key.lo + (static_cast<uint64_t>(group) + 1) * 0xD6E8FEB86659FD93ULL, key.hi};
}

size_t KeyedTable::find_slot(const ChainKey& grouped) const {
  size_t i = home(grouped.lo);
  while (slots_[i].block != kNone && (slots_[i].lo != grouped.lo || slots_[i].hi != grouped.hi)) {
    i = (i + 1) & mask_;
  }
  return i;
}

int32_t KeyedTable::find(const ChainKey& key, int32_t group) const {
  if (slots_.empty()) return kNone;  // not built: nothing is keyed
  return slots_[find_slot(with_group(key, group))].block;
}

void KeyedTable::add(const ChainKey& key, int32_t group, int32_t block) {
  const ChainKey grouped = with_group(key, group);
  slots_[find_slot(grouped)] = Slot{grouped.lo, grouped.hi, block};
  key_of_[static_cast<size_t>(block)] = grouped;
  ++size_;
}

void KeyedTable::remove(int32_t block) {
  size_t hole = find_slot(key_of_[static_cast<size_t>(block)]);
  // Backward shift: an entry after the hole moves into it unless its home lies cyclically in (hole, j].
  for (size_t j = (hole + 1) & mask_; slots_[j].block != kNone; j = (j + 1) & mask_) {
    const size_t h = home(slots_[j].lo);
    const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].block = kNone;
  --size_;
}

void KeyedTable::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, kNone});
  size_ = 0;
}

}  // namespace tagma
