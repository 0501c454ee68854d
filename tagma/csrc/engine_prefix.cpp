// The engine's prefix-cache operations (tagma_prefix_* in tagma.h): enable, lookup, attach, insert, clear,
// stats. The trie itself is PrefixIndex (prefix_index.h, prefix_index.cpp); eviction by mode while
// allocating is in prefix_allocate.cpp.
#include <algorithm>
#include <limits>
#include <memory>

#include "engine.h"
#include "error.h"
#include "prefix_index.h"

namespace tagma {

namespace {

constexpr int64_t kMaxBlockSize = 65536;

}  // namespace

PrefixIndex& Engine::prefix_index() {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  return *prefix_;
}

void Engine::prefix_enable(int64_t block_size, int32_t eviction_mode) {
  if (block_size < 1 || block_size > kMaxBlockSize) {
    fail(TAGMA_E_INVALID_ARG, "block_size ", block_size, " must be in [1, ", kMaxBlockSize, "]");
  }
  const EvictionMode mode = parse_eviction_mode(eviction_mode);
  if (prefix_) fail(TAGMA_E_STATE, "the prefix index is already enabled");
  if (geometry_.align != 1) fail(TAGMA_E_STATE, "the prefix index needs align 1, the engine has ", geometry_.align);
  for (size_t b = 0; b < cache_refs_.size(); ++b) {
    if (cache_refs_[b] != 0) fail(TAGMA_E_STATE, "block ", b, " has a cache reference: clear the cache first");
  }
  auto index = std::make_unique<PrefixIndex>(geometry_.num_blocks, static_cast<int32_t>(block_size), mode);
  // The unused runs: the usable space less the blocks in use now.
  auto unused = std::make_unique<FreeList>(geometry_.first_usable, geometry_.end_usable, 1);
  for (int32_t block = geometry_.first_usable; block < geometry_.end_usable;) {
    if (req_refs_[static_cast<size_t>(block)] == 0) {
      ++block;
      continue;
    }
    int32_t end = block + 1;
    while (end < geometry_.end_usable && req_refs_[static_cast<size_t>(end)] != 0) ++end;
    unused->take(block, end - block);
    block = end;
  }
  prefix_evicted_.reserve(static_cast<size_t>(geometry_.num_blocks));
  // Blocks free now hold nothing: they count as never used.
  std::vector<uint8_t> used_ever(static_cast<size_t>(geometry_.num_blocks), 1);
  for (const auto& [start, count] : free_list_.ranges()) {
    std::fill(used_ever.begin() + start, used_ever.begin() + start + count, 0);
  }
  // frontiers_ is kept from now on (placement reads the neighbours' reservations); built before any change.
  std::unordered_map<int32_t, uint64_t> frontiers = tracks_frontiers() ? frontiers_ : live_frontiers();
  prefix_ = std::move(index);
  unused_ = std::move(unused);
  frontiers_.swap(frontiers);
  used_ever_.swap(used_ever);
  never_used_ = free_list_.free_blocks();
  pool_cycled_ = false;
}

void Engine::prefix_set_eviction_mode(int32_t eviction_mode) {
  const EvictionMode mode = parse_eviction_mode(eviction_mode);
  prefix_index().set_mode(mode);
}

namespace {

void check_tokens(const int32_t* tokens, int64_t num_tokens) {
  if (num_tokens < 0) fail(TAGMA_E_INVALID_ARG, "num_tokens ", num_tokens, " must be >= 0");
  if (num_tokens > 0) require_non_null(tokens, "tokens");
}

}  // namespace

// The walk shared by lookup and lookup_attach: hit node ids into out (capacity >= blocks asked for).
int64_t Engine::prefix_walk(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks,
                            int32_t* out) {
  PrefixIndex& index = *prefix_;
  const int64_t bs = index.block_size();
  const int64_t asked = std::min(num_tokens / bs, max_blocks);
  ++index.counters.lookups;
  index.counters.lookup_blocks += asked;
  int32_t node = index.find_root(ns);
  int64_t hit = 0;
  if (node != PrefixIndex::kNone) {
    for (; hit < asked; ++hit) {
      node = index.find_child(node, tokens + hit * bs);
      if (node == PrefixIndex::kNone) break;
      if (out != nullptr) out[hit] = node;
    }
  }
  index.counters.hit_blocks += hit;
  return hit;
}

int64_t Engine::prefix_lookup(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks,
                              int32_t* ids_out) {
  prefix_index();
  check_tokens(tokens, num_tokens);
  if (max_blocks < 0) fail(TAGMA_E_INVALID_ARG, "max_blocks ", max_blocks, " must be >= 0");
  return prefix_walk(ns, tokens, num_tokens, max_blocks, ids_out);
}

int64_t Engine::prefix_lookup_attach(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t num_tokens,
                                     int64_t max_blocks) {
  PrefixIndex& index = prefix_index();
  Request& request = find_request(id);
  check_tokens(tokens, num_tokens);
  if (max_blocks < 0) fail(TAGMA_E_INVALID_ARG, "max_blocks ", max_blocks, " must be >= 0");
  if (request.num_blocks() != 0) fail(TAGMA_E_STATE, "request ", id, " already holds ", request.num_blocks(), " blocks");
  if (index.cursors.count(id) != 0) fail(TAGMA_E_STATE, "request ", id, " has already been looked up or indexed");

  const int64_t asked = std::min(num_tokens / index.block_size(), max_blocks);
  // Every allocation before the walk: a failure then changes nothing.
  attach_scratch_.resize(static_cast<size_t>(std::min<int64_t>(asked, geometry_.num_blocks)));
  PrefixIndex::Cursor& cursor = index.cursors[id];
  const int64_t hit = prefix_walk(ns, tokens, num_tokens, max_blocks, attach_scratch_.data());

  attach_blocks(id, request, attach_scratch_.data(), hit);

  cursor.ns = ns;
  cursor.indexed = static_cast<int32_t>(hit);
  cursor.node = hit > 0 ? attach_scratch_[static_cast<size_t>(hit - 1)] : index.find_root(ns);
  cursor.generation = hit > 0 ? index.generation(cursor.node) : 0;
  cursor.epoch = index.epoch();
  return hit;
}

int64_t Engine::prefix_insert(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t tokens_start,
                              int64_t num_tokens) {
  PrefixIndex& index = prefix_index();
  const Request& request = find_request(id);
  check_tokens(tokens, num_tokens);
  if (tokens_start < 0) fail(TAGMA_E_INVALID_ARG, "tokens_start ", tokens_start, " must be >= 0");
  if (tokens_start > std::numeric_limits<int64_t>::max() - num_tokens) {
    fail(TAGMA_E_OVERFLOW, "tokens_start ", tokens_start, " + num_tokens ", num_tokens, " overflows int64");
  }
  const int64_t bs = index.block_size();
  const auto found = index.cursors.find(id);
  if (found != index.cursors.end() && found->second.ns != ns) {
    fail(TAGMA_E_STATE, "request ", id, " is indexed in namespace ", found->second.ns, ", not ", ns);
  }
  const int64_t indexed = found == index.cursors.end() ? 0 : found->second.indexed;
  const int64_t target = std::min<int64_t>((tokens_start + num_tokens) / bs, request.num_blocks());
  if (target <= indexed) return indexed;
  if (tokens_start > indexed * bs) {
    fail(TAGMA_E_INVALID_ARG, "tokens_start ", tokens_start, " is past the first token not indexed yet (",
         indexed * bs, ") of request ", id);
  }

  // Allocations first (cursor, root): a failure then changes nothing the caller can see.
  PrefixIndex::Cursor& cursor = found == index.cursors.end() ? index.cursors[id] : found->second;
  cursor.ns = ns;
  if (cursor.lost) return cursor.indexed;
  if (cursor.epoch != 0 && cursor.epoch != index.epoch()) cursor.lost = true;
  if (!cursor.lost && cursor.node != PrefixIndex::kNone && cursor.node < geometry_.num_blocks &&
      index.generation(cursor.node) != cursor.generation) {
    cursor.lost = true;  // the node it reached was evicted
  }
  if (cursor.lost) return cursor.indexed;
  if (cursor.node == PrefixIndex::kNone) cursor.node = index.root(ns);
  cursor.epoch = index.epoch();

  // Walk the request's ranges from logical block `indexed`.
  size_t range_index = request.range_index(indexed);
  int32_t node = cursor.node;
  int64_t logical = indexed;
  for (; logical < target; ++logical) {
    const Range* range = &request.ranges()[range_index];
    if (logical >= int64_t{range->first_logical} + range->count) range = &request.ranges()[++range_index];
    const auto block = static_cast<int32_t>(range->start + (logical - range->first_logical));
    const int32_t* block_tokens = tokens + (logical * bs - tokens_start);
    const int32_t child = index.find_child(node, block_tokens);
    if (child != PrefixIndex::kNone) {
      if (child != block) {
        ++index.counters.duplicate_blocks;
        index.set_alias(block, child);  // side blocks at this position are cached at `child`
      }
      node = child;
      continue;
    }
    // Attached from elsewhere under another parent, or cached as another group's side block (keyed or at a
    // node): a block is cached once, so the request's indexing stops here.
    if (index.indexed(block) || index.side_owner(block) != PrefixIndex::kNone) {
      cursor.lost = true;
      break;
    }
    index.add_child(node, block, block_tokens);
    cache_refs_[static_cast<size_t>(block)] = 1;  // in use by this request: not in the LRU
    ++index.counters.inserted_blocks;
    node = block;
  }
  cursor.indexed = static_cast<int32_t>(logical);
  cursor.node = node;
  cursor.generation = node < geometry_.num_blocks ? index.generation(node) : 0;
  return cursor.indexed;
}

int64_t Engine::prefix_clear() {
  PrefixIndex& index = prefix_index();
  int64_t dropped = 0;
  FreeRunBuilder freed(free_list_);
  for (int32_t block = 0; block < geometry_.num_blocks; ++block) {
    const auto b = static_cast<size_t>(block);
    if (cache_refs_[b] == 0) continue;
    ++dropped;
    cache_refs_[b] = 0;
    if (req_refs_[b] == 0) {
      lru_.remove(block);
      freed.add(block);
    }
  }
  freed.flush();
  index.reset();
  ++index.counters.clears;
  return dropped;
}

tagma_prefix_stats Engine::prefix_stats() const {
  if (!prefix_) fail(TAGMA_E_STATE, "the prefix index is not enabled (tagma_prefix_enable)");
  const PrefixIndex& index = *prefix_;
  tagma_prefix_stats s{};
  s.block_size = index.block_size();
  s.eviction_mode = static_cast<int64_t>(index.mode());
  s.namespaces = index.num_roots();
  s.indexed_blocks = index.num_nodes();
  s.lookups = index.counters.lookups;
  s.lookup_blocks = index.counters.lookup_blocks;
  s.hit_blocks = index.counters.hit_blocks;
  s.inserted_blocks = index.counters.inserted_blocks;
  s.duplicate_blocks = index.counters.duplicate_blocks;
  s.evicted_blocks = index.counters.evicted_blocks;
  s.subtree_blocks = index.counters.subtree_blocks;
  s.in_place_evictions = index.counters.in_place_evictions;
  s.window_evictions = index.counters.window_evictions;
  s.clears = index.counters.clears;
  return s;
}

void Engine::prefix_forget(uint64_t id) { prefix_->cursors.erase(id); }

}  // namespace tagma
