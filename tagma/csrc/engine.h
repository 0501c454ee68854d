// The range engine: requests, block reference counts, the free list and the LRU of cache-only blocks.
//
// Every public method validates all of its arguments before changing anything and throws Error on bad
// input, so a failed call leaves the engine unchanged.
#ifndef TAGMA_ENGINE_H
#define TAGMA_ENGINE_H

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

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

class Engine {
 public:
  Engine(int64_t num_blocks, int64_t align, int32_t policy);
  ~Engine();

  void set_policy(int32_t policy);
  tagma_stats stats() const;

  // Requests (engine.cpp, allocate.cpp, refs.cpp).
  uint64_t create_request();
  void release_request(uint64_t id);
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

  // Prefix index (prefix_index.cpp); see tagma_prefix_* in tagma.h.
  void prefix_enable(int64_t block_size, int32_t eviction_mode);
  void prefix_set_eviction_mode(int32_t eviction_mode);
  int64_t prefix_lookup(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks, int32_t* ids_out);
  int64_t prefix_lookup_attach(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t num_tokens,
                               int64_t max_blocks);
  int64_t prefix_insert(uint64_t ns, uint64_t id, const int32_t* tokens, int64_t tokens_start, int64_t num_tokens);
  int64_t prefix_clear();
  tagma_prefix_stats prefix_stats() const;

 private:
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
  void allocate(Request& request, int64_t count, int32_t* new_blocks_out);
  void add_new_range(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out);
  bool take_blocks(Request& request, int32_t start, int32_t count, int32_t*& new_blocks_out);
  std::vector<Eviction> evict(int64_t count);
  void undo_eviction(const std::vector<Eviction>& evicted);

  // refs.cpp
  void check_attachable(const Request& request, const int32_t* block_ids, int64_t count) const;
  void drop_request_ref(int32_t block, FreeRunBuilder& freed);

  Geometry geometry_;
  Policy policy_;
  std::vector<int32_t> req_refs_;    // per block: request references
  std::vector<int32_t> cache_refs_;  // per block: cache references
  FreeList free_list_;               // blocks with no reference
  Lru lru_;                          // blocks with cache references only
  std::unordered_map<uint64_t, Request> requests_;
  uint64_t next_request_id_ = 1;
  RangeCountStats range_counts_;
  int64_t used_blocks_ = 0;  // blocks with request references
  Counters counters_;
  std::vector<int32_t> append_scratch_;  // append_runs: the new block ids before they become runs
  int64_t growth_hint_ = 0;  // during append_runs: blocks the request expects from this append on (0: none)

  // prefix_index.cpp: the prefix index, when enabled; it owns every cache reference then.
  PrefixIndex& prefix_index();
  int64_t prefix_walk(uint64_t ns, const int32_t* tokens, int64_t num_tokens, int64_t max_blocks, int32_t* out);
  void prefix_forget(uint64_t id);
  int64_t prefix_evict(int32_t block, FreeRunBuilder& freed);
  int64_t prefix_evict_window(int32_t start, int64_t count);
  int64_t prefix_make_room(const Request& request, int64_t count);
  std::unique_ptr<PrefixIndex> prefix_;
  std::vector<int32_t> attach_scratch_;  // prefix_lookup_attach: the hit blocks
  std::vector<int32_t> prefix_evicted_;  // prefix_make_room: blocks freed, in order (reserved: never grows)
};

}  // namespace tagma

#endif  // TAGMA_ENGINE_H
