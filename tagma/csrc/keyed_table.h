// The keyed side blocks' table: (chained content key, group) -> block, for KV cache groups that no
// full-attention group keys (a model whose every layer slides: Mistral-style).
//
// A block's key is a 128-bit hash chained over its request's blocks (chain_key: the previous block's key and
// this block's tokens; the first block's previous key comes from the request's namespace), so equal keys
// mean equal prefixes with overwhelming probability; the caller also compares the block's own tokens on a
// hit. One entry per cached block: the table is sized when built (at most one entry per block, at most half
// full), an eviction drops that entry and nothing else. Open addressing with linear probing and
// backward-shift deletion, so adding or removing an entry never allocates.
#ifndef TAGMA_KEYED_TABLE_H
#define TAGMA_KEYED_TABLE_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tagma {

struct ChainKey {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const ChainKey& other) const { return lo == other.lo && hi == other.hi; }
};

// The key of namespace `ns`'s empty prefix: the first block's previous key.
ChainKey namespace_key(uint64_t ns);
// The key of a block holding tokens[0, block_size) after a block whose key is `prev`.
ChainKey chain_key(const ChainKey& prev, const int32_t* tokens, int32_t block_size);

class KeyedTable {
 public:
  static constexpr int32_t kNone = -1;

  KeyedTable() = default;
  // Sized for num_blocks entries (may throw bad_alloc; the caller builds it before changing anything).
  explicit KeyedTable(int32_t num_blocks);

  bool built() const { return !slots_.empty(); }
  int64_t size() const { return size_; }
  // The block cached under (key, group), or kNone. The caller compares tokens.
  int32_t find(const ChainKey& key, int32_t group) const;
  // Caches `block` under (key, group), which has no block (the caller checked with find).
  void add(const ChainKey& key, int32_t group, int32_t block);
  // Drops `block`'s entry (it must have one).
  void remove(int32_t block);
  void clear();

 private:
  struct Slot {
    uint64_t lo;
    uint64_t hi;
    int32_t block;  // kNone: empty
  };
  static ChainKey with_group(const ChainKey& key, int32_t group);
  size_t home(uint64_t lo) const { return static_cast<size_t>((lo * 0x9E3779B97F4A7C15ULL) >> shift_); }
  size_t find_slot(const ChainKey& grouped) const;

  int shift_ = 64;
  size_t mask_ = 0;
  int64_t size_ = 0;
  std::vector<Slot> slots_;
  std::vector<ChainKey> key_of_;  // per block: its grouped key while it has an entry
};

}  // namespace tagma

#endif  // TAGMA_KEYED_TABLE_H
