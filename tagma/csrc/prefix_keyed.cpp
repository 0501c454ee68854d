// Keyed side groups of the prefix index (tagma_prefix_keyed_* and tagma_prefix_chain_keys in tagma.h): the
// blocks of KV cache groups that no full-attention group keys (every layer slides), cached under their
// chained content key per group, found by key and tokens, attached with tagma_prefix_side_attach.
#include "engine.h"
#include "error.h"
#include "prefix_index.h"

namespace tagma {

namespace {

void check_keyed_group(const PrefixIndex& index, int32_t group) {
  if (!index.keyed()) fail(TAGMA_E_STATE, "the prefix index has no keyed side groups (tagma_prefix_keyed_enable)");
  if (group < 0 || group >= index.side_groups()) {
    fail(TAGMA_E_INVALID_ARG, "side group ", group, " is outside [0, ", index.side_groups(), ")");
  }
}

ChainKey key_at(const uint64_t* keys, int64_t i) {
  return ChainKey{keys[2 * static_cast<size_t>(i)], keys[2 * static_cast<size_t>(i) + 1]};
}

}  // namespace

void Engine::prefix_keyed_enable(int32_t groups) { prefix_index().enable_keyed(groups); }

void Engine::prefix_chain_keys(uint64_t ns, const uint64_t* prev, const int32_t* tokens, int64_t num_blocks,
                               uint64_t* keys) const {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  if (num_blocks < 0) fail(TAGMA_E_INVALID_ARG, "num_blocks ", num_blocks, " must be >= 0");
  if (num_blocks == 0) return;
  require_non_null(tokens, "tokens");
  require_non_null(keys, "keys");
  const int32_t block_size = prefix_->block_size();
  ChainKey key = prev != nullptr ? ChainKey{prev[0], prev[1]} : namespace_key(ns);
  for (int64_t i = 0; i < num_blocks; ++i) {
    key = chain_key(key, tokens + static_cast<size_t>(i) * static_cast<size_t>(block_size), block_size);
    keys[2 * static_cast<size_t>(i)] = key.lo;
    keys[2 * static_cast<size_t>(i) + 1] = key.hi;
  }
}

int64_t Engine::prefix_keyed_insert(int32_t group, uint64_t side_id, int64_t side_first_logical, int64_t start,
                                    int64_t end, const uint64_t* keys, const int32_t* tokens, const uint8_t* mask) {
  PrefixIndex& index = prefix_index();
  check_keyed_group(index, group);
  const Request& side = find_request(side_id);
  if (side_first_logical < 0) fail(TAGMA_E_INVALID_ARG, "side_first_logical ", side_first_logical, " must be >= 0");
  if (start < 0 || end < start) fail(TAGMA_E_INVALID_ARG, "[", start, ", ", end, ") is no range of logical blocks");
  if (end == start) return 0;
  require_non_null(keys, "keys");
  require_non_null(tokens, "tokens");
  // Only the side request's blocks can be cached: [side_first_logical, + its blocks) within [start, end).
  const int64_t first = start > side_first_logical ? start : side_first_logical;
  const int64_t stop = end - side_first_logical > side.num_blocks() ? side_first_logical + side.num_blocks() : end;
  const auto block_size = static_cast<size_t>(index.block_size());
  int64_t added = 0;
  for (int64_t logical = first; logical < stop; ++logical) {
    const int64_t i = logical - start;
    if (mask != nullptr && mask[i] == 0) continue;
    const ChainKey key = key_at(keys, i);
    if (index.keyed_taken(key, group)) continue;  // cached already (the first block cached stays)
    const int32_t block = side.physical(logical - side_first_logical);
    if (index.side_owner(block) != PrefixIndex::kNone || index.indexed(block)) continue;  // cached elsewhere
    index.add_keyed(key, group, block, tokens + static_cast<size_t>(i) * block_size);
    cache_refs_[static_cast<size_t>(block)] = 1;  // in use by the side request: not in the LRU
    ++added;
  }
  index.counters.side_inserted_blocks += added;
  return added;
}

void Engine::prefix_keyed_lookup(int32_t group, const uint64_t* keys, const int32_t* tokens, int64_t count,
                                 int32_t* out) const {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  const PrefixIndex& index = *prefix_;
  check_keyed_group(index, group);
  if (count < 0) fail(TAGMA_E_INVALID_ARG, "count ", count, " must be >= 0");
  if (count == 0) return;
  require_non_null(keys, "keys");
  require_non_null(tokens, "tokens");
  require_non_null(out, "out");
  const auto block_size = static_cast<size_t>(index.block_size());
  for (int64_t i = 0; i < count; ++i) {
    out[i] = index.keyed_find(key_at(keys, i), group, tokens + static_cast<size_t>(i) * block_size);
  }
}

}  // namespace tagma
