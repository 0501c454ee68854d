/* tagma range engine: C ABI.
 *
 * The physical KV cache is `num_blocks` blocks; block 0 is the null/pad block and is never handed out.
 * A request owns an ordered list of contiguous ranges (extents) covering its logical blocks; logical
 * block i maps to a physical block by range arithmetic. Blocks carry two separate counts: request
 * references and cache references. A block is
 *   free        when it has neither (it lives in the coalesced free list),
 *   cache-only  when it has cache references but no request references (evictable, LRU order),
 *   in use      when at least one request references it.
 *
 * Conventions
 *   - Counts of blocks passed in (append, attach, mark, unmark, request_blocks, cache_evict's max_blocks)
 *     must be > 0: zero or negative is TAGMA_E_INVALID_ARG. Capacities of output buffers may be 0.
 *   - The null block 0 or an id listed twice in one attach is TAGMA_E_STATE; ids outside [0, num_blocks)
 *     are TAGMA_E_OUT_OF_RANGE. mark/unmark count a repeated id once per occurrence.
 *   - After TAGMA_E_INTERNAL (an allocation failure mid-update) the engine is marked broken and every
 *     later call on it returns TAGMA_E_INTERNAL; only destroy still works.
 *   - Every function returns a tagma_status; TAGMA_OK (0) on success. On any error the engine's state is
 *     unchanged and tagma_last_error() describes the failure. No C++ exception crosses this ABI.
 *   - Engines are named by opaque 64-bit handles that are never reused; a destroyed or unknown handle
 *     yields TAGMA_E_INVALID_HANDLE. Request ids are engine-assigned, never reused within an engine.
 *   - Block ids are int32; positions, slots and counts of tokens are int64.
 *   - Any value of an argument's C type is safe to pass: no calculation on caller-supplied counts, hints,
 *     positions or indices can overflow or wrap. A count that cannot fit is TAGMA_E_NO_SPACE (checked before
 *     any buffer is sized by it), an index outside its bounds TAGMA_E_OUT_OF_RANGE, a sum or product that
 *     would leave int64 TAGMA_E_OVERFLOW; growth hints are advisory and clamped (tagma_request_append_runs).
 *     Enum arguments (policy, eviction mode) outside their defined values are TAGMA_E_INVALID_ARG.
 *
 * Concurrency
 *   - tagma_engine_create / tagma_engine_destroy and handle lookup are thread-safe (a global registry
 *     guarded by a mutex).
 *   - Calls on ONE engine must be serialized by the caller (the engine has no internal lock); calls on
 *     different engines may run concurrently, except destroying an engine while another thread uses it.
 *   - tagma_slot_mapping_ranges, tagma_slot_mapping_paged, tagma_slot_mapping_step and tagma_coord_offset
 *     are pure functions over caller buffers: reentrant and safe to call concurrently from any thread.
 *   - tagma_last_error() returns a thread-local string valid until the next tagma call on that thread.
 */
#ifndef TAGMA_H
#define TAGMA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t tagma_status;

#define TAGMA_OK 0
#define TAGMA_E_INVALID_ARG 1     /* bad argument: zero/negative count, null pointer, unknown policy */
#define TAGMA_E_INVALID_HANDLE 2  /* unknown or destroyed engine handle */
#define TAGMA_E_NOT_FOUND 3       /* unknown or released request id */
#define TAGMA_E_NO_SPACE 4        /* not enough free + evictable blocks */
#define TAGMA_E_MISALIGNED 5      /* count not a multiple of the engine's alignment */
#define TAGMA_E_OUT_OF_RANGE 6    /* block id or coordinate outside its bounds */
#define TAGMA_E_OVERFLOW 7        /* arithmetic would overflow int64 */
#define TAGMA_E_STATE 8           /* operation not valid for the block's state (e.g. attach a free block) */
#define TAGMA_E_INTERNAL 9        /* allocation failure or broken invariant inside the engine */

/* Placement policy for a NEW range (in-place growth of the last range is always tried first). */
#define TAGMA_POLICY_FIRST_FIT 0  /* lowest-addressed free range that fits */
#define TAGMA_POLICY_BEST_FIT 1   /* smallest free range that fits (ties: lowest address) */
#define TAGMA_POLICY_HEADROOM 2   /* largest free range; when it does not start at block 1 the new range is
                                     placed in its middle, leaving growth room for both neighbours */
#define TAGMA_POLICY_RESERVE 3    /* requests' expected sizes (the append_runs hint) as soft reservations: a
                                     free range that follows a request's last range first keeps that
                                     request's remaining expected blocks; a new range goes right after them,
                                     in the free range whose rest best fits the whole remaining hint */

typedef uint64_t tagma_engine_handle;

typedef struct tagma_stats {
    int64_t num_blocks;          /* total, including the null block 0 */
    int64_t usable_blocks;       /* blocks that can ever be handed out */
    int64_t free_blocks;         /* in the free list */
    int64_t cached_only_blocks;  /* evictable */
    int64_t used_blocks;         /* referenced by at least one request */
    int64_t free_ranges;         /* number of ranges in the free list */
    int64_t largest_free_range;  /* blocks */
    double external_fragmentation; /* 1 - largest_free_range / free_blocks; 0 when no block is free */
    int64_t live_requests;
    int64_t total_request_ranges; /* sum over live requests of their number of ranges */
    int64_t max_request_ranges;
    /* Cumulative counters since creation. */
    int64_t in_place_growths;    /* appends that extended the last range in place (fully or partly) */
    int64_t new_ranges;          /* ranges started elsewhere */
    int64_t merges;              /* a new or attached range that turned out adjacent and merged */
    int64_t evictions;           /* cache-only blocks evicted */
    int64_t appended_blocks;     /* blocks handed out by append */
} tagma_stats;

/* Coordinate layout of a KV cache: n(layer, block, token) = (layer * num_blocks + block) * block_size + token,
 * offset = n * bytes_per_token. */
typedef struct tagma_coord_layout {
    int64_t num_layers;
    int64_t num_blocks;
    int64_t block_size;       /* tokens per block */
    int64_t bytes_per_token;
} tagma_coord_layout;

const char *tagma_last_error(void);
const char *tagma_version(void);

/* num_blocks >= 2 (block 0 is null). align >= 1: starts and counts of allocated ranges are multiples of
 * align (the usable space then starts at block `align`). */
tagma_status tagma_engine_create(int64_t num_blocks, int64_t align, int32_t policy, tagma_engine_handle *out);
tagma_status tagma_engine_destroy(tagma_engine_handle h);
tagma_status tagma_engine_set_policy(tagma_engine_handle h, int32_t policy);
/* RESERVE admission (percent in [0, 100], 0 = off, the default; pieces >= 1): under TAGMA_POLICY_RESERVE, a
 * tagma_request_append_runs with a hint on a request that holds no block yet fails with TAGMA_E_NO_SPACE,
 * changing nothing, unless the free space clear of other requests' reservations (each free range past its
 * left neighbour's remaining expected blocks) holds W = max(count, ceil(percent% of the hint)) blocks, at
 * most the usable space (an empty pool always admits): in one free range when pieces == 1, else in the
 * `pieces` largest such parts together, the largest holding `count`. The caller (the scheduler) then leaves
 * the request waiting: admission waits for room in a few large pieces instead of scattering the request.
 * Costs O(free ranges) per admission attempt. */
tagma_status tagma_engine_set_admission(tagma_engine_handle h, int32_t percent, int32_t pieces);
tagma_status tagma_engine_stats(tagma_engine_handle h, tagma_stats *out);

/* Requests. A new request owns no blocks. */
tagma_status tagma_request_create(tagma_engine_handle h, uint64_t *out_request);
/* Drops the request's references in reverse logical order: blocks left unreferenced become cache-only
 * (appended to the LRU tail in that order, so a request's last blocks are evicted first) or free
 * (coalesced into the free list). The request id is then invalid. */
tagma_status tagma_request_release(tagma_engine_handle h, uint64_t request);

/* Release the request's first `count` blocks (0 <= count <= its blocks, a multiple of align), as release does, in reverse logical
 * order; the blocks after them are renumbered from logical 0 (a sliding window's start advancing: the caller
 * keeps how many it dropped). Its ranges stay, the first one cut; O(ranges). The request stays valid, empty
 * when count is all of it. With the prefix index, fails with TAGMA_E_STATE for a request in it (indexed or
 * attached by lookup_attach: the index keys its blocks from logical 0); a side request's freed blocks that
 * are cached become cache-only. */
tagma_status tagma_request_free_front(tagma_engine_handle h, uint64_t request, int64_t count);

/* Append `count` new blocks (count > 0, multiple of align) to the request's logical end. In-place growth of
 * the last range first (as many of the free blocks right after it as needed), then one new range placed by
 * the policy, or, when no free range is large enough, several ranges taken largest-first. When free
 * blocks are fewer than `count`, exactly (count - free) cache-only blocks are evicted in LRU order first.
 * Fails with TAGMA_E_NO_SPACE, changing nothing, when free + cache-only < count. With align > 1 it may also
 * fail when the (count - free) evictions leave no aligned room for the remainder; those evictions are then
 * undone exactly (LRU order and cache counts restored). 
 * new_blocks_out (nullable, capacity count) receives the physical ids of the appended blocks in logical
 * order; evicted_out (nullable, capacity count) receives the evicted block ids in eviction order;
 * *num_evicted (nullable) their number. */
tagma_status tagma_request_append(tagma_engine_handle h, uint64_t request, int64_t count, int32_t *new_blocks_out,
                                  int32_t *evicted_out, int64_t *num_evicted);

/* Append existing blocks (in use by another request, or cache-only) to the request's logical end, taking a
 * request reference on each; consecutive ids form one range. A cache-only block leaves the LRU. Fails on a
 * free block, the null block, an id out of range, or a block the request already holds. */
tagma_status tagma_request_attach(tagma_engine_handle h, uint64_t request, const int32_t *block_ids, int64_t count);

tagma_status tagma_request_num_blocks(tagma_engine_handle h, uint64_t request, int64_t *out);
tagma_status tagma_request_num_ranges(tagma_engine_handle h, uint64_t request, int64_t *out);
/* Copies up to `capacity` ranges as (physical_start, num_blocks, first_logical_block) int32 triples into
 * `out` (3 * capacity int32). *num_ranges receives the total number of ranges even when it exceeds
 * capacity (then only `capacity` are written and TAGMA_OK is returned). */
tagma_status tagma_request_ranges(tagma_engine_handle h, uint64_t request, int32_t *out, int64_t capacity,
                                  int64_t *num_ranges);
/* Physical id of logical block `logical` (range arithmetic, O(log ranges)). */
tagma_status tagma_request_block(tagma_engine_handle h, uint64_t request, int64_t logical, int32_t *out);
/* Physical ids of logical blocks [first, first + count) into out (capacity count). */
tagma_status tagma_request_blocks(tagma_engine_handle h, uint64_t request, int64_t first, int64_t count,
                                  int32_t *out);

/* Cache references. mark: each block must be in use or cache-only; its cache count goes up by one.
 * unmark: each block's cache count must be positive; it goes down by one and a block left with no
 * reference becomes free. All-or-nothing: on error no block is changed. */
tagma_status tagma_cache_mark(tagma_engine_handle h, const int32_t *block_ids, int64_t count);
tagma_status tagma_cache_unmark(tagma_engine_handle h, const int32_t *block_ids, int64_t count);
/* Evict up to max_blocks cache-only blocks in LRU order (their cache counts drop to zero; they become
 * free). out (capacity max_blocks, nullable) receives their ids; *num_evicted their number. */
tagma_status tagma_cache_evict(tagma_engine_handle h, int64_t max_blocks, int32_t *out, int64_t *num_evicted);
/* Drop every cache reference (cache-only blocks become free). *num_dropped (nullable): blocks that had one. */
tagma_status tagma_cache_clear(tagma_engine_handle h, int64_t *num_dropped);
/* Per-block state for inspection and tests: req_refs[b], cache_refs[b] for b in [0, num_blocks)
 * (either pointer nullable; capacity num_blocks). */
tagma_status tagma_block_state(tagma_engine_handle h, int32_t *req_refs, int32_t *cache_refs, int64_t capacity);
/* Free ranges in address order as (start, count) int32 pairs; semantics of capacity as tagma_request_ranges. */
tagma_status tagma_free_ranges(tagma_engine_handle h, int32_t *out, int64_t capacity, int64_t *num_ranges);
/* Cache-only blocks in LRU order (next to evict first); capacity semantics as above. */
tagma_status tagma_lru_order(tagma_engine_handle h, int32_t *out, int64_t capacity, int64_t *num_blocks);
/* Histogram of ranges per live request: out[k] = number of live requests with k ranges, for
 * k in [0, capacity - 1]; requests with >= capacity - 1 ranges count in the last bucket. */
tagma_status tagma_ranges_histogram(tagma_engine_handle h, int64_t *out, int64_t capacity);

/* ---- range manager: appends reported as runs ----
 * tagma_request_append (no evictions allowed) with the new blocks reported as maximal runs of consecutive
 * ids, in logical order: runs_out receives (start, count) int32 pairs, *num_runs their number (<= count).
 * capacity (pairs) must be >= count so that any placement fits; checked before anything changes. Fails
 * with TAGMA_E_STATE, changing nothing, when the append would have to evict cache-only blocks (use
 * tagma_request_append, which reports them), unless the prefix index is enabled (it evicts by its mode).
 * One call per growth of a request, whatever its size.
 * hint (>= 0; 0 = none): blocks the request expects to append from this call on, this one included. When
 * the last range cannot grow in place and hint exceeds what remains to place, the new range goes into the
 * smallest free range that can hold the whole hint (in the middle of its slack) so that later appends grow
 * in place; when none can, the engine's policy places it as without a hint (with the prefix index in
 * TAGMA_EVICT_CONTIGUOUS mode, that mode's placement reads the hint instead). Any hint >= 0 is accepted and read
 * as min(hint, 2^40): a pool has fewer than 2^31 blocks, so every hint past 100 times the pool (RESERVE admission
 * asks for at least 1% of it) already means "more than the pool", and the cap keeps the engine's arithmetic on
 * hints (expected size = blocks held + max(hint, count), admission's percent of it) inside int64. A count over
 * the free + cache-only blocks is TAGMA_E_NO_SPACE, whatever capacity claims. */
tagma_status tagma_request_append_runs(tagma_engine_handle h, uint64_t request, int64_t count, int64_t hint,
                                       int32_t *runs_out, int64_t capacity, int64_t *num_runs);

/* ---- range manager: the appends of one scheduler step in one crossing ----
 * tagma_append_runs_batch appends, for i = 0 .. num_requests - 1 in that order, counts[i] new blocks to
 * requests[i], exactly as the same sequence of tagma_request_append_runs(h, requests[i], counts[i], hint_i,
 * ...) calls would (hint_i = hints[i], or 0 when hints is NULL): the placement is identical. requests[i] == 0
 * first creates a new request (as tagma_request_create) and writes its id into requests[i]. A request may
 * appear in several entries (they apply in order). Entry i's new blocks are reported as maximal runs of
 * consecutive ids in logical order: (start, count) int32 pairs runs_out[2 * run_offsets[i] ..
 * 2 * run_offsets[i + 1]) (run_offsets has num_requests + 1 entries, run_offsets[0] = 0).
 * All-or-nothing: every entry is validated before anything changes (h, requests that exist, counts > 0 and
 * multiples of align, hints >= 0 (clamped as in tagma_request_append_runs), runs_capacity >= the sum of
 * counts (the sum saturates: it never wraps), the sum within the free blocks);
 * like tagma_request_append_runs the batch never evicts: when the sum exceeds the free blocks it fails with
 * TAGMA_E_STATE if cache-only blocks exist, else TAGMA_E_NO_SPACE. With the prefix index enabled it evicts
 * as the index's mode says (the sum must be within the free + cache-only blocks, else TAGMA_E_NO_SPACE). On error nothing changed (no request
 * created, requests[] untouched) and tagma_last_error() names the entry. num_requests == 0 only writes
 * run_offsets[0] = 0. Under RESERVE admission (tagma_engine_set_admission), a hinted entry for a request that
 * holds no block yet is refused with TAGMA_E_STATE: its admission check may decline it, so it goes through
 * tagma_request_append_runs. */
typedef struct tagma_append_batch {
    tagma_engine_handle engine;
    uint64_t *requests;    /* num_requests ids, in/out: 0 = create a new request, its id is written back */
    const int64_t *counts; /* num_requests blocks to append (> 0 each) */
    const int64_t *hints;  /* nullable: growth hints as in tagma_request_append_runs (NULL: none) */
    int64_t num_requests;  /* >= 0 */
    int32_t *runs_out;     /* 2 * runs_capacity int32: (start, count) pairs */
    int64_t runs_capacity; /* pairs; >= sum of counts (any placement fits) */
    int64_t *run_offsets;  /* num_requests + 1 entries */
} tagma_append_batch;

tagma_status tagma_append_runs_batch(const tagma_append_batch *batch);

/* Slot mapping over buffers (pure). Request r owns ranges [req_range_offsets[r], req_range_offsets[r+1]) of
 * `ranges` (int32 triples (physical_start, num_blocks, first_logical_block), ordered by logical block,
 * contiguous in logical space from 0). Its tokens are [query_start_loc[r], query_start_loc[r+1]) of
 * `positions`. out[t] = physical_block(pos / block_size) * block_size + pos % block_size, or -1 when pos
 * lies past the request's blocks. query_start_loc[0] must be 0 and both offset arrays non-decreasing; a
 * negative position is TAGMA_E_OUT_OF_RANGE. Everything is validated before `out` is written. out has num_tokens = query_start_loc[num_reqs] entries; entries of out
 * in [query_start_loc[num_reqs], out_len) are set to -1 (vLLM's padding). */
tagma_status tagma_slot_mapping_ranges(const int32_t *ranges, const int32_t *req_range_offsets, int64_t num_reqs,
                                       const int32_t *query_start_loc, const int64_t *positions,
                                       int64_t block_size, int64_t *out, int64_t out_len);
/* The paged reference: the same output through a dense block table [num_reqs, max_blocks_per_req] (row r
 * valid for its first num_blocks_per_req[r] entries). */
tagma_status tagma_slot_mapping_paged(const int32_t *block_table, int64_t max_blocks_per_req,
                                      const int32_t *num_blocks_per_req, int64_t num_reqs,
                                      const int32_t *query_start_loc, const int64_t *positions,
                                      int64_t block_size, int64_t *out, int64_t out_len);

/* ---- Slot mapping for one worker step, from each request's FIRST position (the write path's hot call).
 *
 * vLLM schedules request r's tokens [query_start_loc[r], query_start_loc[r+1]) at consecutive positions
 * p0, p0 + 1, ... (p0 = its computed-token count). Only the first and the last position of each request are
 * read: p0 = positions[query_start_loc[r]], and positions[query_start_loc[r+1] - 1] must equal p0 + n - 1
 * (else TAGMA_E_INVALID_ARG). The request's range holding p0 is found once (the last range first, then a
 * binary search); from there each range contributes one run of consecutive slots
 * (physical_start - first_logical_block) * block_size + p. Positions past the request's blocks get -1, and
 * so does out[query_start_loc[num_reqs] .. out_len) (vLLM's padding).
 *
 * Validation is fused into the same pass: buffer bounds (every index is checked against the capacities
 * given), offsets and query_start_loc non-decreasing (query_start_loc[0] == 0), the first range of each
 * request starting at logical block 0, and every range a request's tokens touch (num_blocks > 0,
 * physical_start >= 0, contiguous with the previous one, slots and positions within int64). On an error
 * the status says what is wrong and `out` may be partly written. req_range_offsets holds max_reqs + 1
 * entries and query_start_loc num_reqs + 1 (the caller's duty: the ABI cannot see the latter's length). */
typedef struct tagma_slot_mapping_batch {
    const int32_t *ranges;            /* (physical_start, num_blocks, first_logical_block) triples */
    int64_t ranges_capacity;          /* triples readable at `ranges` */
    const int32_t *req_range_offsets; /* request r owns ranges [off[r], off[r+1]) */
    int64_t max_reqs;                 /* req_range_offsets has max_reqs + 1 entries; num_reqs <= max_reqs */
    const int32_t *query_start_loc;   /* num_reqs + 1 entries */
    const int64_t *positions;         /* positions_capacity entries */
    int64_t positions_capacity;
    int64_t *out;                     /* out_len entries */
    int64_t out_len;
    int64_t num_reqs;
    int64_t block_size;
} tagma_slot_mapping_batch;

tagma_status tagma_slot_mapping_step(const tagma_slot_mapping_batch *batch);

/* Coordinate map with bounds and overflow checks. */
tagma_status tagma_coord_offset(const tagma_coord_layout *layout, int64_t layer, int64_t block, int64_t token,
                                int64_t *out_offset);


/* ---- prefix index (engine_prefix.cpp; the trie in prefix_index.cpp): cached full blocks found by their
 * token ids, no hashing.
 *
 * An engine may carry one prefix index, enabled once with tagma_prefix_enable (align must be 1). It is a
 * trie per namespace whose nodes are full blocks: a node stores its block's block_size token ids and is
 * the physical block holding their KV; a node's first child is compared directly, its other children are
 * found by their first token (a table lookup keyed by (parent, token)) then a compare of the whole block,
 * so lookup and insert cost O(tokens) compares with no copy. The namespace (uint64, chosen by the caller; e.g. an interned (cache_salt, LoRA, extra keys)) picks
 * the root: blocks of different namespaces are never shared.
 *
 * An indexed block holds the index's cache reference (exactly one). When its requests release it, it is
 * cache-only (LRU, evictable). Evicting it removes its node and the node's whole subtree (unreachable
 * otherwise): cache-only blocks of the subtree become free, blocks of the subtree still in use lose their
 * cache reference (they are freed when released). While the index is enabled it owns every cache
 * reference: tagma_cache_mark, tagma_cache_unmark and tagma_cache_evict fail with TAGMA_E_STATE, and
 * tagma_cache_clear clears the index (as tagma_prefix_clear).
 *
 * Evictions happen inside appends (tagma_request_append, tagma_request_append_runs and
 * tagma_append_runs_batch, which may all evict then: the index knows which blocks it loses), as the
 * eviction mode says:
 *   TAGMA_EVICT_LRU         exactly vLLM's order: LRU victims, with their subtrees, until enough blocks are
 *                           free; then the blocks are placed as without the index;
 *   TAGMA_EVICT_CONTIGUOUS  while never-used blocks cover an append (vLLM would hand those out first), it
 *                           takes free blocks only and evicts nothing. Once they do not (the pool has
 *                           cycled), cache-only blocks are placeable space: the request's last range grows
 *                           in place over the blocks right after it that no request uses, evicting the
 *                           cached ones (up to one that entered the LRU in its newer half: evicting a block
 *                           evicts its subtree, and a chain cached recently, e.g. a preempted request's,
 *                           keeps its head); the rest becomes a new range that evicts only the cached blocks
 *                           it covers. Either way a new range goes where its growth hint fits past its left
 *                           neighbour's remaining hint: the largest free range; the hint's blocks ending at
 *                           one of the next LRU victims (a chain's end: its prefix stays cached); the
 *                           largest run of unused blocks; then the same ignoring the neighbour (middle of
 *                           the slack); then for the new blocks alone; then pieces, largest first. The
 *                           engine's placement policy is not used in this mode.
 * With the index, tagma_request_append may evict more than `count` blocks (subtrees, windows): evicted_out
 * receives the first `count` evicted ids and *num_evicted the number of blocks evicted.
 *
 * A request remembers how many of its logical blocks are indexed (from 0) and the node reached, so an
 * insert costs O(new tokens). A request that lost its place (the node it reached was evicted, the index was
 * cleared, or a block of it could not be indexed) indexes nothing more. When a full block's tokens are
 * already indexed under the same parent by another block, the request's own copy is not indexed (it stays
 * uncached) and indexing continues below the existing node.
 * Tokens are int32 ids; a block's tokens are compared exactly. */
#define TAGMA_EVICT_LRU 0
#define TAGMA_EVICT_CONTIGUOUS 1

typedef struct tagma_prefix_stats {
    int64_t block_size;
    int64_t eviction_mode;
    int64_t namespaces;         /* namespace roots created since the last clear */
    int64_t indexed_blocks;     /* nodes: blocks holding the index's cache reference */
    /* Cumulative counters since the index was enabled. */
    int64_t lookups;            /* tagma_prefix_lookup and tagma_prefix_lookup_attach calls */
    int64_t lookup_blocks;      /* full blocks asked for (after max_blocks) */
    int64_t hit_blocks;         /* of which found */
    int64_t inserted_blocks;    /* blocks indexed */
    int64_t duplicate_blocks;   /* full blocks not indexed: the same tokens were indexed under the same parent */
    int64_t evicted_blocks;     /* indexed blocks freed by eviction (subtrees included) */
    int64_t subtree_blocks;     /* nodes removed because an ancestor was evicted (freed or still in use) */
    int64_t in_place_evictions; /* blocks evicted right after a growing request's last range */
    int64_t window_evictions;   /* new ranges placed over cache-only blocks (their windows evicted) */
    int64_t clears;
} tagma_prefix_stats;

/* Enables the engine's prefix index: block_size in [1, 65536] tokens per block, eviction_mode one of
 * TAGMA_EVICT_*. TAGMA_E_STATE when already enabled, when the engine's align is not 1, or when some block
 * has a cache reference (from tagma_cache_mark). Memory: num_blocks * (block_size * 4 + ~48) bytes. */
tagma_status tagma_prefix_enable(tagma_engine_handle h, int64_t block_size, int32_t eviction_mode);
tagma_status tagma_prefix_set_eviction_mode(tagma_engine_handle h, int32_t eviction_mode);
/* The longest cached prefix of tokens[0, num_tokens) in namespace ns, in full blocks, at most max_blocks
 * (>= 0): *num_hit blocks, their physical ids in logical order into ids_out (nullable; capacity
 * max_blocks). Changes no block state (no LRU touch). tokens may be NULL when num_tokens is 0. */
tagma_status tagma_prefix_lookup(tagma_engine_handle h, uint64_t ns, const int32_t *tokens, int64_t num_tokens,
                                 int64_t max_blocks, int32_t *ids_out, int64_t *num_hit);
/* tagma_prefix_lookup, then the hit blocks are attached to `request` (which must hold no block and never
 * have been indexed): request references taken, cache-only hits leave the LRU, consecutive ids become one
 * range; the request's indexed prefix is the hit. One walk; O(hit tokens). */
tagma_status tagma_prefix_lookup_attach(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t *tokens,
                                        int64_t num_tokens, int64_t max_blocks, int64_t *num_hit);
/* Indexes the request's full blocks not indexed yet, in namespace ns (the request's first insert or
 * lookup_attach fixes its namespace; another is TAGMA_E_STATE). tokens[0, num_tokens) are the request's
 * tokens at positions [tokens_start, tokens_start + num_tokens); tokens_start must be <= the first
 * position not indexed yet (indexed_blocks * block_size) unless nothing is left to index. The blocks indexed
 * are the request's logical blocks up to min(request blocks, (tokens_start + num_tokens) / block_size).
 * *num_indexed (nullable): the request's indexed blocks afterwards. */
tagma_status tagma_prefix_insert(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t *tokens,
                                 int64_t tokens_start, int64_t num_tokens, int64_t *num_indexed);
/* Drops every node and cache reference (cache-only blocks become free); live requests index nothing more.
 * *num_dropped (nullable): blocks that had a cache reference. */
tagma_status tagma_prefix_clear(tagma_engine_handle h, int64_t *num_dropped);
tagma_status tagma_prefix_stats_get(tagma_engine_handle h, tagma_prefix_stats *out);

/* ---- side groups of the prefix index (prefix_side.cpp): the blocks of other KV cache groups (a sliding
 * window's) cached at the full-attention group's nodes, as vLLM caches each group's block by (hash, group).
 *
 * The full group's requests are indexed as above; each other group's blocks of a request live in a side
 * request (an engine request with no place in the index, whose leading logical blocks may have been freed
 * with tagma_request_free_front). A side block is cached at the node of the same logical position, for its
 * group: one block per (node, group). It holds the index's cache reference like a node, is cache-only (LRU)
 * once no request uses it, and is evicted alone (it has no subtree); evicting a node evicts the side blocks
 * cached at it and at its subtree. A window's hit needs only the last blocks of the full group's hit, whose
 * earlier side blocks may be gone: the caller looks them up by the nodes of the full group's walk
 * (tagma_prefix_lookup's ids). */
typedef struct tagma_prefix_side_stats {
    int64_t side_groups;
    int64_t cached_blocks;    /* side blocks cached now */
    int64_t inserted_blocks;  /* cumulative: side blocks cached */
    int64_t evicted_blocks;   /* cumulative: side blocks uncached (alone or with their node) */
} tagma_prefix_side_stats;

/* Sizes the index for `groups` side groups in [1, 64]: once, before any block is indexed (else
 * TAGMA_E_STATE). Memory: num_blocks * (groups + 4) * 4 bytes. */
tagma_status tagma_prefix_side_enable(tagma_engine_handle h, int32_t groups);
/* Caches side request `side_request`'s blocks for `group` at the nodes of full request `full_request`:
 * for each logical position p in [start, end) with mask[p - start] != 0 (mask nullable: every position)
 * that the full request's walk has indexed (its own block is the node, or its block duplicated a node),
 * the side request's block at local position p - side_first_logical (skipped when outside its blocks:
 * freed, or not allocated) is cached at that node unless the node has a block for the group already or the
 * block is cached elsewhere. *num_cached (nullable): blocks cached by this call. */
tagma_status tagma_prefix_side_insert(tagma_engine_handle h, uint64_t full_request, int32_t group,
                                      uint64_t side_request, int64_t side_first_logical, int64_t start, int64_t end,
                                      const uint8_t *mask, int64_t *num_cached);
/* out[i] = group `group`'s side block cached at nodes[i] (a block id), or -1 (none, or nodes[i] is no node
 * now). Changes nothing. */
tagma_status tagma_prefix_side_lookup(tagma_engine_handle h, int32_t group, const int32_t *nodes, int64_t count,
                                      int32_t *out);
/* Attaches cached side blocks to `request`, which holds no block and is not in the index: request references
 * taken, cache-only blocks leave the LRU, consecutive ids become one range, in the order given. Every block
 * must be a cached side block, listed once (else TAGMA_E_STATE, nothing changed). */
tagma_status tagma_prefix_side_attach(tagma_engine_handle h, uint64_t request, const int32_t *blocks, int64_t count);
tagma_status tagma_prefix_side_stats_get(tagma_engine_handle h, tagma_prefix_side_stats *out);

/* ---- keyed side groups (prefix_keyed.cpp): for KV cache groups that no full-attention group keys (a model
 * whose every layer slides), each group's cached block is found by a chained 128-bit content key instead of
 * a node: key(block i) = hash(key(block i - 1), block i's tokens), key(block -1) from the request's
 * namespace, as vLLM chains its block hashes; the block's own tokens are compared on a lookup too. One
 * table entry per cached block, sized when enabled. A keyed block is a side block in every other way: it
 * holds the index's cache reference, is cache-only (LRU) once no request uses it, is evicted alone, is
 * attached with tagma_prefix_side_attach and counted by tagma_prefix_side_stats_get; tagma_prefix_clear
 * drops it. */

/* Sizes the index for `groups` keyed side groups in [1, 64] (tagma_prefix_side_enable's rules; once, and
 * instead of it). Memory: tagma_prefix_side_enable's plus about 64 bytes per block. */
tagma_status tagma_prefix_keyed_enable(tagma_engine_handle h, int32_t groups);
/* keys[2i], keys[2i + 1] = the chained key of block i of tokens[0, num_blocks * block_size), chained from
 * prev[0], prev[1] (the key of the block before; nullable: the start of namespace `ns`, else `ns` is
 * unused). Pure arithmetic: changes nothing. */
tagma_status tagma_prefix_chain_keys(tagma_engine_handle h, uint64_t ns, const uint64_t *prev, const int32_t *tokens,
                                     int64_t num_blocks, uint64_t *keys);
/* Caches side request `side_request`'s blocks for `group` under their keys: for each logical position p in
 * [start, end) with mask[p - start] != 0 (mask nullable: every position), the side request's block at
 * local position p - side_first_logical (skipped when outside its blocks: freed, or not allocated) is
 * cached under keys[2(p - start)], keys[2(p - start) + 1] with tokens[(p - start) * block_size, + block_size)
 * unless that key has a block for the group already or the block is cached elsewhere. keys, tokens and mask
 * hold end - start entries. *num_cached (nullable): blocks cached by this call. */
tagma_status tagma_prefix_keyed_insert(tagma_engine_handle h, int32_t group, uint64_t side_request,
                                       int64_t side_first_logical, int64_t start, int64_t end, const uint64_t *keys,
                                       const int32_t *tokens, const uint8_t *mask, int64_t *num_cached);
/* out[i] = group `group`'s block cached under keys[2i], keys[2i + 1] holding tokens[i * block_size,
 * + block_size), or -1. Changes nothing. */
tagma_status tagma_prefix_keyed_lookup(tagma_engine_handle h, int32_t group, const uint64_t *keys,
                                       const int32_t *tokens, int64_t count, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* TAGMA_H */
