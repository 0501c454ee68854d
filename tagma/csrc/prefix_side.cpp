// The prefix index's side groups (tagma_prefix_side_* in tagma.h): blocks of other KV cache groups (a
// sliding window's) cached at the full-attention group's nodes, found by node, attached to a request.
#include <algorithm>

#include "engine.h"
#include "error.h"
#include "prefix_index.h"

namespace tagma {

namespace {

void check_group(const PrefixIndex& index, int32_t group) {
  if (index.side_groups() == 0) fail(TAGMA_E_STATE, "the prefix index has no side groups (tagma_prefix_side_enable)");
  if (group < 0 || group >= index.side_groups()) {
    fail(TAGMA_E_INVALID_ARG, "side group ", group, " is outside [0, ", index.side_groups(), ")");
  }
}

}  // namespace

void Engine::prefix_side_enable(int32_t groups) { prefix_index().enable_side(groups); }

int64_t Engine::prefix_side_insert(uint64_t full_id, int32_t group, uint64_t side_id, int64_t side_first_logical,
                                   int64_t start, int64_t end, const uint8_t* mask) {
  PrefixIndex& index = prefix_index();
  check_group(index, group);
  const Request& full = find_request(full_id);
  const Request& side = find_request(side_id);
  if (full_id == side_id) fail(TAGMA_E_INVALID_ARG, "request ", full_id, " cannot be its own side request");
  if (side_first_logical < 0) fail(TAGMA_E_INVALID_ARG, "side_first_logical ", side_first_logical, " must be >= 0");
  if (start < 0 || end < start) fail(TAGMA_E_INVALID_ARG, "[", start, ", ", end, ") is no range of logical blocks");
  const auto cursor = index.cursors.find(full_id);
  if (cursor == index.cursors.end()) return 0;  // the full request indexed nothing: no node to cache at
  // Positions its walk has reached (a lost walk stops where it was lost): each is a node or a duplicate's alias.
  const int64_t stop = std::min<int64_t>({end, cursor->second.indexed, full.num_blocks()});
  int64_t added = 0;
  for (int64_t logical = start; logical < stop; ++logical) {
    if (mask != nullptr && mask[logical - start] == 0) continue;
    const int64_t local = logical - side_first_logical;
    if (local < 0 || local >= side.num_blocks()) continue;  // dropped already, or not allocated
    const int32_t node = index.node_of(full.physical(logical));
    if (node == PrefixIndex::kNone || index.side(node, group) != PrefixIndex::kNone) continue;
    const int32_t block = side.physical(local);
    if (index.side_owner(block) != PrefixIndex::kNone || index.indexed(block)) continue;  // cached elsewhere
    index.add_side(node, group, block);
    cache_refs_[static_cast<size_t>(block)] = 1;  // in use by the side request: not in the LRU
    ++added;
  }
  index.counters.side_inserted_blocks += added;
  return added;
}

void Engine::prefix_side_lookup(int32_t group, const int32_t* nodes, int64_t count, int32_t* out) const {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  const PrefixIndex& index = *prefix_;
  check_group(index, group);
  if (count < 0) fail(TAGMA_E_INVALID_ARG, "count ", count, " must be >= 0");
  if (count == 0) return;
  require_non_null(nodes, "nodes");
  require_non_null(out, "out");
  for (int64_t i = 0; i < count; ++i) check_block_id(nodes[i], i);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = index.indexed(nodes[i]) ? index.side(nodes[i], group) : PrefixIndex::kNone;
  }
}

void Engine::prefix_side_attach(uint64_t id, const int32_t* blocks, int64_t count) {
  PrefixIndex& index = prefix_index();
  Request& request = find_request(id);
  if (count < 0) fail(TAGMA_E_INVALID_ARG, "count ", count, " must be >= 0");
  if (request.num_blocks() != 0) fail(TAGMA_E_STATE, "request ", id, " already holds ", request.num_blocks(), " blocks");
  if (index.cursors.count(id) != 0) fail(TAGMA_E_STATE, "request ", id, " is in the prefix index's full group");
  if (count == 0) return;
  require_non_null(blocks, "blocks");
  for (int64_t i = 0; i < count; ++i) {
    check_block_id(blocks[i], i);
    if (index.side_owner(blocks[i]) == PrefixIndex::kNone) {
      fail(TAGMA_E_STATE, "block ", blocks[i], " (at ", i, ") is no cached side block");
    }
  }
  check_attachable(request, blocks, count);  // no block listed twice
  attach_blocks(id, request, blocks, count);
}

tagma_prefix_side_stats Engine::prefix_side_stats() const {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  const PrefixIndex& index = *prefix_;
  tagma_prefix_side_stats s{};
  s.side_groups = index.side_groups();
  s.cached_blocks = index.num_side();
  s.inserted_blocks = index.counters.side_inserted_blocks;
  s.evicted_blocks = index.counters.side_evicted_blocks;
  return s;
}

}  // namespace tagma
