// The prefix index: a trie of full blocks keyed by token ids, one trie per namespace.
//
// Node ids [0, num_blocks) are physical blocks (a block is indexed at most once, so the block id names its
// node); ids from num_blocks on are namespace roots. A node stores its block's block_size token ids. A
// node's first child is compared directly (most nodes have one child: a prompt's chain); its later children
// are found through one open-addressing table keyed by (parent, first token), whose value heads a chain of
// the children sharing that first token, walked comparing whole blocks. New children go after the first in
// the child list, so every child is either its parent's first child or in the table.
// Every table is sized when the index is built (a node per block at most), so adding a node never
// allocates. This class knows nothing of reference counts: the engine (engine_prefix.cpp) keeps them.
//
// Side groups (prefix_side.cpp): the blocks of other KV cache groups (a sliding window's) that hold the
// same tokens as a node, cached *at* that node: side(node, g) is group g's block for the node's logical
// position, or kNone. A side block is no node (it has no children and no key of its own); it is dropped on
// its own (an eviction of the block) or with its node. A window's hit needs a run of recent side blocks
// along the path of the full group's nodes, whose earlier side blocks may be long gone: keyed this way,
// evicting one side block never takes another with it.
// Keyed side blocks (prefix_keyed.cpp): where no full-attention group keys the others (every layer slides),
// a group's cached block is found by its chained content key instead (keyed_table.h), one entry per block;
// it is a side block in every other way (cache reference, LRU, eviction alone, attach), with owner kKeyed.
// alias(block): for a block that was found to duplicate a node when its request was indexed, that node (the
// request's path runs through it), so a side block can be cached at the node a duplicate stands for.
#ifndef TAGMA_PREFIX_INDEX_H
#define TAGMA_PREFIX_INDEX_H

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "keyed_table.h"
#include "tagma.h"

namespace tagma {

enum class EvictionMode : int32_t {
  kLru = TAGMA_EVICT_LRU,
  kContiguous = TAGMA_EVICT_CONTIGUOUS,
};

// Throws TAGMA_E_INVALID_ARG for an unknown mode.
EvictionMode parse_eviction_mode(int32_t mode);

class PrefixIndex {
 public:
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kMaxSideGroups = 64;
  static constexpr int32_t kKeyed = -2;  // side_owner of a keyed side block

  // Where a request stands: its logical blocks [0, indexed) are indexed (or duplicates of indexed blocks)
  // and `node` is the node reached (kNone before its namespace has a root). `lost`: it indexes nothing more.
  struct Cursor {
    uint64_t ns = 0;
    int32_t indexed = 0;
    int32_t node = kNone;
    uint32_t generation = 0;  // of `node` when it is a block: a different one means it was evicted
    uint64_t epoch = 0;       // of the index: a different one means it was cleared
    bool lost = false;
  };

  struct Counters {
    int64_t lookups = 0;
    int64_t lookup_blocks = 0;
    int64_t hit_blocks = 0;
    int64_t inserted_blocks = 0;
    int64_t duplicate_blocks = 0;
    int64_t evicted_blocks = 0;
    int64_t subtree_blocks = 0;
    int64_t in_place_evictions = 0;
    int64_t window_evictions = 0;
    int64_t clears = 0;
    int64_t side_inserted_blocks = 0;
    int64_t side_evicted_blocks = 0;  // side blocks uncached (on their own or with their node)
  };

  PrefixIndex(int32_t num_blocks, int32_t block_size, EvictionMode mode);

  int32_t block_size() const { return block_size_; }
  EvictionMode mode() const { return mode_; }
  void set_mode(EvictionMode mode) { mode_ = mode; }
  uint64_t epoch() const { return epoch_; }
  int64_t num_nodes() const { return num_nodes_; }
  int64_t num_roots() const { return static_cast<int64_t>(roots_.size()); }

  // The root of namespace ns, or kNone.
  int32_t find_root(uint64_t ns) const {
    const auto found = roots_.find(ns);
    return found == roots_.end() ? kNone : found->second;
  }
  // The root of namespace ns, created when missing (may throw bad_alloc; nothing changed then).
  int32_t root(uint64_t ns);

  // The child of `node` whose block holds tokens[0, block_size), or kNone.
  int32_t find_child(int32_t node, const int32_t* tokens) const {
    // Most nodes have one child (a prompt's chain): try the first child before the table.
    const int32_t first = first_child_[static_cast<size_t>(node)];
    if (first == kNone) return kNone;
    if (std::memcmp(block_tokens(first), tokens, token_bytes_) == 0) return first;
    if (next_sibling_[static_cast<size_t>(first)] == kNone) return kNone;  // an only child
    const Slot& slot = slots_[find_slot(key(node, tokens[0]))];
    for (int32_t child = slot.head; child != kNone; child = next_same_[static_cast<size_t>(child)]) {
      if (std::memcmp(block_tokens(child), tokens, token_bytes_) == 0) return child;
    }
    return kNone;
  }
  // Adds unindexed block `block` holding tokens[0, block_size) as a child of `parent`, which must have no
  // child with these tokens.
  void add_child(int32_t parent, int32_t block, const int32_t* tokens);

  bool indexed(int32_t block) const { return parent_[static_cast<size_t>(block)] != kNone; }
  uint32_t generation(int32_t block) const { return generation_[static_cast<size_t>(block)]; }

  // Removes indexed block `block` and its whole subtree; visit(b) is called once per removed block.
  template <class Visit>
  void remove_subtree(int32_t block, Visit&& visit);

  // Forgets every node, root and side block (O(num_blocks * side groups)); the epoch changes.
  void reset();

  // ---- side groups
  int32_t side_groups() const { return side_groups_; }
  // Sizes the side tables for `groups` side groups (the index must hold no node yet).
  void enable_side(int32_t groups);
  int32_t side(int32_t node, int32_t group) const {
    return side_[static_cast<size_t>(node) * static_cast<size_t>(side_groups_) + static_cast<size_t>(group)];
  }
  // The node side block `block` is cached at, or kNone when it is no side block.
  int32_t side_owner(int32_t block) const {
    return side_groups_ == 0 ? kNone : side_owner_[static_cast<size_t>(block)];
  }
  // Caches `block` (no node, no side block) as group `group`'s block at `node` (which has none).
  void add_side(int32_t node, int32_t group, int32_t block) {
    side_[static_cast<size_t>(node) * static_cast<size_t>(side_groups_) + static_cast<size_t>(group)] = block;
    side_owner_[static_cast<size_t>(block)] = node;
    side_group_[static_cast<size_t>(block)] = group;
    ++num_side_;
  }
  // Uncaches side block `block` from its node (a keyed one from the keyed table).
  void remove_side(int32_t block) {
    const auto b = static_cast<size_t>(block);
    if (side_owner_[b] == kKeyed) {
      keyed_.remove(block);
    } else {
      side_[static_cast<size_t>(side_owner_[b]) * static_cast<size_t>(side_groups_) +
            static_cast<size_t>(side_group_[b])] = kNone;
    }
    side_owner_[b] = kNone;
    --num_side_;
  }
  // ---- keyed side blocks
  bool keyed() const { return keyed_.built(); }
  // Side groups whose blocks are keyed by content (enable_side's rules, plus the keyed table).
  void enable_keyed(int32_t groups);
  // Group `group`'s block cached under `key` holding tokens[0, block_size), or kNone.
  int32_t keyed_find(const ChainKey& key, int32_t group, const int32_t* tokens) const {
    const int32_t block = keyed_.find(key, group);
    if (block == kNone || std::memcmp(block_tokens(block), tokens, token_bytes_) != 0) return kNone;
    return block;
  }
  // Whether (key, group) has a block, whatever its tokens.
  bool keyed_taken(const ChainKey& key, int32_t group) const { return keyed_.find(key, group) != kNone; }
  // Caches `block` (no node, no side block) as group `group`'s block under `key` (which has none).
  void add_keyed(const ChainKey& key, int32_t group, int32_t block, const int32_t* tokens) {
    keyed_.add(key, group, block);
    std::memcpy(tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(block_size_), tokens,
                token_bytes_);
    side_owner_[static_cast<size_t>(block)] = kKeyed;
    side_group_[static_cast<size_t>(block)] = group;
    ++num_side_;
  }
  int64_t num_side() const { return num_side_; }
  void set_alias(int32_t block, int32_t node) {
    if (side_groups_ == 0) return;
    alias_[static_cast<size_t>(block)] = node;
    alias_generation_[static_cast<size_t>(block)] = generation_[static_cast<size_t>(node)];
  }
  // The node block `block` stands for: itself when it is a node, the node it duplicated while that node
  // lives, else kNone. Only meaningful for a block its request has indexed (the caller checks).
  int32_t node_of(int32_t block) const {
    const auto b = static_cast<size_t>(block);
    if (parent_[b] != kNone) return block;
    if (side_groups_ == 0) return kNone;
    const int32_t node = alias_[b];
    if (node == kNone || parent_[static_cast<size_t>(node)] == kNone ||
        generation_[static_cast<size_t>(node)] != alias_generation_[b]) {
      return kNone;
    }
    return node;
  }

  std::unordered_map<uint64_t, Cursor> cursors;  // by engine request id
  Counters counters;

 private:
  struct Slot {
    uint64_t key;
    int32_t head;  // first child in the chain, kNone when the slot is empty
  };

  static uint64_t key(int32_t node, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(token);
  }
  size_t home(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ULL) >> shift_); }
  // The slot holding key k, or the empty slot where it would go.
  size_t find_slot(uint64_t k) const {
    size_t i = home(k);
    while (slots_[i].head != kNone && slots_[i].key != k) i = (i + 1) & mask_;
    return i;
  }
  void erase_slot(size_t i);
  const int32_t* block_tokens(int32_t block) const {
    return tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(block_size_);
  }
  // Unlinks block from its parent's chain and child list (the block keeps its own children).
  void detach(int32_t block);

  int32_t num_blocks_;
  int32_t block_size_;
  size_t token_bytes_;
  EvictionMode mode_;
  uint64_t epoch_ = 1;
  int64_t num_nodes_ = 0;
  int shift_;
  size_t mask_;
  std::vector<Slot> slots_;
  std::vector<int32_t> tokens_;        // block_size per block
  std::vector<int32_t> parent_;        // per block; kNone when not indexed
  std::vector<int32_t> next_same_;     // per block: next child of the same parent with the same first token
  std::vector<int32_t> next_sibling_;  // per block: the parent's child list (doubly linked)
  std::vector<int32_t> prev_sibling_;
  std::vector<uint32_t> generation_;   // per block: bumped when its node is removed
  std::vector<uint8_t> in_table_;      // per block: in the table (else its parent's first child)
  std::vector<int32_t> first_child_;   // per node (blocks, then roots)
  std::unordered_map<uint64_t, int32_t> roots_;
  std::vector<int32_t> stack_;  // remove_subtree's work list, reserved for every block
  int32_t side_groups_ = 0;
  int64_t num_side_ = 0;
  std::vector<int32_t> side_;        // per node and side group: the side block, kNone when none
  std::vector<int32_t> side_owner_;  // per block: the node it is cached at as a side block, else kNone
  std::vector<int32_t> side_group_;  // per block: its side group (while side_owner_ is set)
  std::vector<int32_t> alias_;       // per block: the node it duplicated (see node_of)
  std::vector<uint32_t> alias_generation_;
  KeyedTable keyed_;  // built by enable_keyed only
};

template <class Visit>
void PrefixIndex::remove_subtree(int32_t block, Visit&& visit) {
  detach(block);
  stack_.clear();
  stack_.push_back(block);
  while (!stack_.empty()) {
    const int32_t node = stack_.back();
    stack_.pop_back();
    const auto n = static_cast<size_t>(node);
    for (int32_t child = first_child_[n]; child != kNone; child = next_sibling_[static_cast<size_t>(child)]) {
      if (in_table_[static_cast<size_t>(child)] != 0) {
        const size_t slot = find_slot(key(node, block_tokens(child)[0]));
        if (slots_[slot].head != kNone) erase_slot(slot);  // children sharing a first token share the slot
        in_table_[static_cast<size_t>(child)] = 0;
      }
      stack_.push_back(child);
    }
    first_child_[n] = kNone;
    parent_[n] = kNone;
    ++generation_[n];
    --num_nodes_;
    visit(node);
  }
}

}  // namespace tagma

#endif  // TAGMA_PREFIX_INDEX_H
