// The prefix index (the trie): nodes, the (parent, first token) table, subtree removal. It knows nothing of
// the engine; the engine's prefix-cache operations are in engine_prefix.cpp.
#include "prefix_index.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "error.h"

namespace tagma {

EvictionMode parse_eviction_mode(int32_t mode) {
  switch (mode) {
    case TAGMA_EVICT_LRU:
      return EvictionMode::kLru;
    case TAGMA_EVICT_CONTIGUOUS:
      return EvictionMode::kContiguous;
    default:
      fail(TAGMA_E_INVALID_ARG, "unknown eviction mode ", mode);
  }
}

PrefixIndex::PrefixIndex(int32_t num_blocks, int32_t block_size, EvictionMode mode)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      token_bytes_(static_cast<size_t>(block_size) * sizeof(int32_t)),
      mode_(mode) {
  // At most one node per block: a table of >= 2 * num_blocks slots stays at most half full.
  size_t capacity = 16;
  int bits = 4;
  while (capacity < 2 * static_cast<size_t>(num_blocks)) {
    capacity *= 2;
    ++bits;
  }
  shift_ = 64 - bits;
  mask_ = capacity - 1;
  const auto n = static_cast<size_t>(num_blocks);
  slots_.assign(capacity, Slot{0, kNone});
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  parent_.assign(n, kNone);
  next_same_.assign(n, kNone);
  next_sibling_.assign(n, kNone);
  prev_sibling_.assign(n, kNone);
  generation_.assign(n, 0);
  in_table_.assign(n, 0);
  first_child_.assign(n, kNone);
  stack_.reserve(n);
}

int32_t PrefixIndex::root(uint64_t ns) {
  const int32_t found = find_root(ns);
  if (found != kNone) return found;
  if (first_child_.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(TAGMA_E_OVERFLOW, "too many prefix-index namespaces");
  }
  const auto id = static_cast<int32_t>(first_child_.size());
  first_child_.push_back(kNone);  // may throw: nothing else changed yet
  try {
    roots_.emplace(ns, id);
  } catch (...) {
    first_child_.pop_back();
    throw;
  }
  return id;
}

void PrefixIndex::add_child(int32_t parent, int32_t block, const int32_t* tokens) {
  const auto b = static_cast<size_t>(block);
  std::memcpy(tokens_.data() + b * static_cast<size_t>(block_size_), tokens, token_bytes_);
  const auto p = static_cast<size_t>(parent);
  const int32_t first = first_child_[p];
  next_same_[b] = kNone;
  if (first == kNone) {  // the first child: found by its parent, not through the table
    first_child_[p] = block;
    next_sibling_[b] = kNone;
    prev_sibling_[b] = kNone;
    in_table_[b] = 0;
  } else {  // a later child: into the table, and after the first in the child list
    const size_t slot = find_slot(key(parent, tokens[0]));
    if (slots_[slot].head == kNone) {
      slots_[slot].key = key(parent, tokens[0]);
    } else {
      next_same_[b] = slots_[slot].head;
    }
    slots_[slot].head = block;
    in_table_[b] = 1;
    const auto f = static_cast<size_t>(first);
    next_sibling_[b] = next_sibling_[f];
    prev_sibling_[b] = first;
    if (next_sibling_[f] != kNone) prev_sibling_[static_cast<size_t>(next_sibling_[f])] = block;
    next_sibling_[f] = block;
  }
  parent_[b] = parent;
  ++num_nodes_;
}

void PrefixIndex::detach(int32_t block) {
  const auto b = static_cast<size_t>(block);
  const int32_t parent = parent_[b];
  if (in_table_[b] != 0) {
    const size_t slot = find_slot(key(parent, block_tokens(block)[0]));
    if (slots_[slot].head == block) {
      slots_[slot].head = next_same_[b];
      if (slots_[slot].head == kNone) erase_slot(slot);
    } else {
      int32_t before = slots_[slot].head;
      while (next_same_[static_cast<size_t>(before)] != block) before = next_same_[static_cast<size_t>(before)];
      next_same_[static_cast<size_t>(before)] = next_same_[b];
    }
    in_table_[b] = 0;
  }
  next_same_[b] = kNone;
  if (prev_sibling_[b] != kNone) {
    next_sibling_[static_cast<size_t>(prev_sibling_[b])] = next_sibling_[b];
  } else {
    first_child_[static_cast<size_t>(parent)] = next_sibling_[b];
  }
  if (next_sibling_[b] != kNone) prev_sibling_[static_cast<size_t>(next_sibling_[b])] = prev_sibling_[b];
  next_sibling_[b] = kNone;
  prev_sibling_[b] = kNone;
}

// Linear probing with backward-shift deletion: entries after the hole move back unless their home slot lies
// cyclically in (hole, entry].
void PrefixIndex::erase_slot(size_t hole) {
  size_t j = hole;
  while (true) {
    j = (j + 1) & mask_;
    if (slots_[j].head == kNone) break;
    const size_t k = home(slots_[j].key);
    const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].head = kNone;
}

void PrefixIndex::reset() {
  std::fill(slots_.begin(), slots_.end(), Slot{0, kNone});
  std::fill(parent_.begin(), parent_.end(), kNone);
  std::fill(next_same_.begin(), next_same_.end(), kNone);
  std::fill(next_sibling_.begin(), next_sibling_.end(), kNone);
  std::fill(prev_sibling_.begin(), prev_sibling_.end(), kNone);
  std::fill(in_table_.begin(), in_table_.end(), 0);
  first_child_.resize(static_cast<size_t>(num_blocks_));
  std::fill(first_child_.begin(), first_child_.end(), kNone);
  for (uint32_t& generation : generation_) ++generation;
  roots_.clear();
  num_nodes_ = 0;
  std::fill(side_.begin(), side_.end(), kNone);
  std::fill(side_owner_.begin(), side_owner_.end(), kNone);
  std::fill(alias_.begin(), alias_.end(), kNone);
  if (keyed_.built()) keyed_.clear();
  num_side_ = 0;
  ++epoch_;
}

void PrefixIndex::enable_side(int32_t groups) {
  if (groups < 1 || groups > kMaxSideGroups) {
    fail(TAGMA_E_INVALID_ARG, "side groups ", groups, " must be in [1, ", kMaxSideGroups, "]");
  }
  if (side_groups_ != 0) fail(TAGMA_E_STATE, "the prefix index's side groups are already enabled");
  if (num_nodes_ != 0) fail(TAGMA_E_STATE, "side groups on a prefix index that holds ", num_nodes_, " blocks");
  const auto n = static_cast<size_t>(num_blocks_);
  // Every allocation first: a failure leaves the index without side groups.
  std::vector<int32_t> side(n * static_cast<size_t>(groups), kNone);
  std::vector<int32_t> owner(n, kNone);
  std::vector<int32_t> group(n, 0);
  std::vector<int32_t> alias(n, kNone);
  std::vector<uint32_t> alias_generation(n, 0);
  side_.swap(side);
  side_owner_.swap(owner);
  side_group_.swap(group);
  alias_.swap(alias);
  alias_generation_.swap(alias_generation);
  side_groups_ = groups;
}

void PrefixIndex::enable_keyed(int32_t groups) {
  KeyedTable table(num_blocks_);  // first: a failure changes nothing
  enable_side(groups);
  keyed_ = std::move(table);
}

}  // namespace tagma
