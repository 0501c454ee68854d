// The range engine: requests, block reference counts, the free list and the LRU of cache-only blocks.
//
// Every public method validates all of its arguments before changing anything and throws Error on bad
// input, so a failed call leaves the engine unchanged.
#ifndef TAGMA_ENGINE_H
#define TAGMA_ENGINE_H

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include <memory>  // the prefix index

#include "free_list.h"
#include "lru.h"
#include "request.h"
#include "tagma.h"

namespace tagma {

class PrefixIndex;

// Block space: ids [0, num_blocks); ranges are handed out from [first_usable, end_usable).
struct Geometry {
  int32_t num_blocks;
  int32_t align;
  int32_t first_usable;  // = align (block 0 is null; with align > 1 the first aligned block)
  int32_t end_usable;    // = num_blocks rounded down to a multiple of align

  // Throws TAGMA_E_INVALID_ARG unless 2 <= num_blocks <= INT32_MAX, align >= 1 and some block is usable.
  static Geometry validate(int64_t num_blocks, int64_t align);
};

struct Counters {
  int64_t in_place_growths = 0;
  int64_t new_ranges = 0;
  int64_t merges = 0;
  int64_t evictions = 0;
  int64_t appended_blocks = 0;
};

// Growth hints are advisory: the engine reads min(hint, kMaxHint). A pool holds fewer than 2^31 blocks, so any
// hint past 100 * the pool already behaves as an unbounded one (RESERVE admission asks for at least 1% of
// it); the cap keeps every sum and product on a hint far inside int64 (see tagma_request_append_runs).
constexpr int64_t kMaxHint = int64_t{1} << 40;
inline int64_t clamp_hint(int64_t hint) { return hint < kMaxHint ? hint : kMaxHint; }

class Engine {
 public:
  Engine(int64_t num_blocks, int64_t align, int32_t policy);
  ~Engine();

  void set_policy(int32_t policy);
  // RESERVE admission check of a request's first hinted append (0: off); see tagma_engine_set_admission.
  void set_admission(int32_t percent, int32_t pieces);
  tagma_stats stats() const;

  // Requests (engine.cpp, allocate.cpp, refs.cpp).
  uint64_t create_request();
  void release_request(uint64_t id);
  // Releases the request's first `count` blocks (a sliding window's start advancing); see
  // tagma_request_free_front.
  void free_front(uint64_t id, int64_t count);
  void append(uint64_t id, int64_t count, int32_t* new_blocks_out, int32_t* evicted_out, int64_t* num_evicted);
  void attach(uint64_t id, const int32_t* block_ids, int64_t count);
  // append() reporting the new blocks as (start, count) runs, with a growth hint; see
  // tagma_request_append_runs. Returns the number of runs written.
  int64_t append_runs(uint64_t id, int64_t count, int64_t hint, int32_t* runs_out, int64_t capacity);
  // The appends of one scheduler step (batch.cpp); see tagma_append_runs_batch.
  void append_runs_batch(const tagma_append_batch& batch);
  int64_t request_num_blocks(uint64_t id) const;
  int64_t request_num_ranges(uint64_t id) const;
  void request_ranges(uint64_t id, int32_t* out, int64_t capacity, int64_t* num_ranges) const;
  int32_t request_block(uint64_t id, int64_t logical) const;
  void request_blocks(uint64_t id, int64_t first, int64_t count, int32_t* out) const;

  // Cache references (refs.cpp).
  void cache_mark(const int32_t* block_ids, int64_t count);
  void cache_unmark(const int32_t* block_ids, int64_t count);
  int64_t cache_evict(int64_t max_blocks, int32_t* out);
  int64_t cache_clear();

  // Inspection (engine.cpp).
  void block_state(int32_t* req_refs, int32_t* cache_refs, int64_t capacity) const;
  void free_ranges(int32_t* out, int64_t capacity, int64_t* num_ranges) const;
  void lru_order(int32_t* out, int64_t capacity, int64_t* num_blocks) const;
  void ranges_histogram(int64_t* out, int64_t capacity) const;

  // Prefix index (engine_prefix.cpp); see tagma_prefix_* in tagma.h.
  void prefix_enable(int64_t block_size, int32_t eviction_mode);
  void prefix_set_eviction_mode(int32_t eviction_mode);
  int64_t prefix_lookup(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks, int32_t* ids_out);
  int64_t prefix_lookup_attach(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t num_tokens,
                               int64_t max_blocks);
  int64_t prefix_insert(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t tokens_start, int64_t num_tokens);
  int64_t prefix_clear();
  tagma_prefix_stats prefix_stats() const;
  // Side groups of the prefix index (prefix_side.cpp); see tagma_prefix_side_* in tagma.h.
  void prefix_side_enable(int32_t groups);
  int64_t prefix_side_insert(uint64_t full_id, int32_t group, uint64_t side_id, int64_t side_first_logical,
                             int64_t start, int64_t end, const uint8_t* mask);
  void prefix_side_lookup(int32_t group, const int32_t* nodes, int64_t count, int32_t* out) const;
  void prefix_side_attach(uint64_t id, const int32_t* blocks, int64_t count);
  tagma_prefix_side_stats prefix_side_stats() const;
  // Keyed side groups (prefix_keyed.cpp); see tagma_prefix_keyed_* and tagma_prefix_chain_keys in tagma.h.
  void prefix_keyed_enable(int32_t groups);
  void prefix_chain_keys(uint64_t ns, const uint64_t* prev, const int32_t* tokens, int64_t num_blocks,
                         uint64_t* keys) const;
  int64_t prefix_keyed_insert(int32_t group, uint64_t side_id, int64_t side_first_logical, int64_t start,
                              int64_t end, const uint64_t* keys, const int32_t* tokens, const uint8_t* mask);
  void prefix_keyed_lookup(int32_t group, const uint64_t* keys, const int32_t* tokens, int64_t count,
                           int32_t* out) const;

 private:
  // engine_prefix.cpp: the prefix index, when enabled; it owns every cache reference then.
  PrefixIndex& prefix_index();
  int64_t prefix_walk(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks, int32_t* out);
  void prefix_forget(uint64_t id);
  int64_t prefix_evict(int32_t block, FreeRunBuilder& freed);
  // Drops cached block `block`'s cache reference; frees it (into `freed`) when no request uses it. Returns
  // the blocks freed (0 or 1).
  int64_t uncache(int32_t block, FreeRunBuilder& freed);
  // prefix_allocate.cpp: allocation while the index is enabled (it evicts as the index's mode says).
  void prefix_allocate(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out);
  int64_t evict_lru_until_free(int64_t count);
  int64_t evict_unused(int32_t start, int32_t count);
  int32_t older_cached_run(const Request& request, int32_t count) const;
  std::optional<int32_t> place_over_cache(uint64_t id, int32_t count, int64_t want, bool over_cached) const;
  std::optional<int32_t> place_in_run(uint64_t id, FreeRange run, int32_t victim, int64_t want,
                                      bool respect_reservation) const;
  std::unique_ptr<PrefixIndex> prefix_;
  // With the index: the blocks no request uses (free or cache-only) as coalesced runs, the space a new
  // range can be placed in by evicting what it covers.
  std::unique_ptr<FreeList> unused_;
  // With the index: whether each block was ever taken since the index was enabled, and how many were not
  // (vLLM hands out never-used blocks before it evicts: while they cover an append, nothing is evicted).
  std::vector<uint8_t> used_ever_;
  int64_t never_used_ = 0;
  bool pool_cycled_ = false;  // an append found never_used_ short: cached blocks are space from then on
  std::vector<int32_t> attach_scratch_;  // prefix_lookup_attach: the hit blocks
  std::vector<int32_t> prefix_evicted_;  // prefix_allocate: blocks freed, in order (reserved: never grows)

  // A block evicted by append, remembered so the eviction can be undone when the append then fails.
  struct Eviction {
    int32_t block;
    int32_t cache_refs;
  };

  Engine(const Geometry& geometry, Policy policy);

  Request& find_request(uint64_t id);
  const Request& find_request(uint64_t id) const;
  // Throws TAGMA_E_OUT_OF_RANGE unless 0 <= block < num_blocks; `index` locates it in the caller's list.
  void check_block_id(int32_t block, int64_t index) const;
  // Throws TAGMA_E_STATE when the block is the null block or free (no reference of either kind).
  void check_not_free(int32_t block, int64_t index) const;

  // allocate.cpp
  int32_t growth_room(const Request& request, int64_t count) const;
  bool can_allocate(const Request& request, int64_t count) const;
  int64_t runs_from_scratch(int32_t* runs_out) const;
  // Appends `count` blocks to the request (with the prefix index: prefix_allocate, which may evict); requires
  // that they fit (can_allocate, or free + cache-only blocks >= count with the index).
  void allocate(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out);
  // allocate() from free blocks only: in-place growth, then a new range by hint or policy, then pieces.
  void allocate_free(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out);
  // RESERVE placement of a new range of `count` blocks for request `id`, which expects `want` >= count
  // blocks from here; nullopt when no free range has the aligned capacity for `count`.
  std::optional<int32_t> place_reserving(uint64_t id, int32_t count, int64_t want, int* tier = nullptr) const;
  bool admissible(uint64_t id, const Request& request, int64_t count) const;
  // Remaining expected blocks of the request whose last range ends at `block` (0: none, or `self`).
  int64_t reserved_at(int32_t block, uint64_t self) const;
  // Keeps frontiers_ in step with the request's last range; old_end is its end before the change (or -1).
  void update_frontier(uint64_t id, const Request& request, int32_t old_end);
  // frontiers_ is kept under RESERVE and with the prefix index (both place by reservations).
  bool tracks_frontiers() const { return policy_ == Policy::kReserve || unused_ != nullptr; }
  std::unordered_map<int32_t, uint64_t> live_frontiers() const;
  void add_new_range(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out);
  bool take_blocks(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out);
  std::vector<Eviction> evict(int64_t count);
  void undo_eviction(const std::vector<Eviction>& evicted);

  // refs.cpp
  void check_attachable(const Request& request, const int32_t* block_ids, int64_t count) const;
  // Appends blocks in use or cache-only to request `id` in logical order (tagma_request_attach, a prefix
  // hit, a side attach): request references taken, cache-only blocks leave the LRU, runs become ranges.
  void attach_blocks(uint64_t id, Request& request, const int32_t* block_ids, int64_t count);
  void drop_request_ref(int32_t block, FreeRunBuilder& freed, FreeRunBuilder* unused);
  // Blocks that stop being unused (no request reference before): out of unused_ (with the index).
  void take_unused(int32_t start, int32_t count) {
    if (unused_) unused_->take(start, count);
  }
  // The listed blocks that no request uses yet, out of unused_ (one take per ascending run); call before
  // their request references go up.
  void take_unused_blocks(const int32_t* blocks, int64_t count);

  Geometry geometry_;
  Policy policy_;
  std::vector<int32_t> req_refs_;    // per block: request references
  std::vector<int32_t> cache_refs_;  // per block: cache references
  FreeList free_list_;               // blocks with no reference
  Lru lru_;                          // blocks with cache references only
  std::unordered_map<uint64_t, Request> requests_;
  // End (one past the last block) of each request's last range -> the request: whose growth a free range
  // starting there serves (RESERVE placement keeps that request's remaining expected blocks free for it).
  std::unordered_map<int32_t, uint64_t> frontiers_;
  uint64_t next_request_id_ = 1;
  RangeCountStats range_counts_;
  int64_t used_blocks_ = 0;  // blocks with request references
  Counters counters_;
  std::vector<int32_t> append_scratch_;  // append_runs: the new block ids before they become runs
  int64_t growth_hint_ = 0;
  int32_t admission_percent_ = 0;
  int32_t admission_pieces_ = 1;  // during append_runs: blocks the request expects from this append on (0: none)
};

}  // namespace tagma

#endif  // TAGMA_ENGINE_H
