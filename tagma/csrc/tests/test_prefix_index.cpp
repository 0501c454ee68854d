// The prefix index: lookup, attach, insert, namespaces, eviction modes, subtrees, clear, errors.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::Pairs;
using test::require_ok;
using test::TestEngine;

namespace {

using Tokens = std::vector<int32_t>;

// Tokens of `blocks` blocks of size bs: block i holds base + i*bs ... (distinct per base).
Tokens make_tokens(int64_t blocks, int64_t bs, int32_t base) {
  Tokens tokens;
  for (int64_t i = 0; i < blocks * bs; ++i) tokens.push_back(base + static_cast<int32_t>(i));
  return tokens;
}

tagma_prefix_stats prefix_stats(const TestEngine& engine) {
  tagma_prefix_stats s{};
  require_ok(tagma_prefix_stats_get(engine.handle(), &s), "tagma_prefix_stats_get");
  return s;
}

std::vector<int32_t> lookup(const TestEngine& engine, uint64_t ns, const Tokens& tokens, int64_t max_blocks = 1 << 20) {
  std::vector<int32_t> ids(static_cast<size_t>(std::min<int64_t>(max_blocks, 1024)), -1);
  int64_t hit = -1;
  require_ok(tagma_prefix_lookup(engine.handle(), ns, tokens.data(), static_cast<int64_t>(tokens.size()), max_blocks,
                                 ids.data(), &hit),
             "tagma_prefix_lookup");
  ids.resize(static_cast<size_t>(hit));
  return ids;
}

int64_t lookup_attach(const TestEngine& engine, uint64_t ns, uint64_t request, const Tokens& tokens,
                      int64_t max_blocks = 1 << 20) {
  int64_t hit = -1;
  require_ok(tagma_prefix_lookup_attach(engine.handle(), ns, request, tokens.data(),
                                        static_cast<int64_t>(tokens.size()), max_blocks, &hit),
             "tagma_prefix_lookup_attach");
  return hit;
}

int64_t insert(const TestEngine& engine, uint64_t ns, uint64_t request, const Tokens& tokens, int64_t start = 0) {
  int64_t indexed = -1;
  require_ok(tagma_prefix_insert(engine.handle(), ns, request, tokens.data() + start,
                                 start, static_cast<int64_t>(tokens.size()) - start, &indexed),
             "tagma_prefix_insert");
  return indexed;
}

void enable(const TestEngine& engine, int64_t bs, int32_t mode = TAGMA_EVICT_LRU) {
  require_ok(tagma_prefix_enable(engine.handle(), bs, mode), "tagma_prefix_enable");
}

// The tests below lay blocks out under LRU mode (the engine's first-fit policy places them), then switch:
// CONTIGUOUS places new ranges by its own rules (reservations, headroom).
void set_mode(const TestEngine& engine, int32_t mode) {
  require_ok(tagma_prefix_set_eviction_mode(engine.handle(), mode), "tagma_prefix_set_eviction_mode");
}

// A request that computes `tokens` from scratch (a lookup that may hit, new blocks for the rest) and indexes
// its full blocks; returns the request.
uint64_t compute(TestEngine& engine, uint64_t ns, const Tokens& tokens, int64_t bs) {
  const uint64_t r = engine.new_request();
  const int64_t hit = lookup_attach(engine, ns, r, tokens);
  const int64_t need = static_cast<int64_t>(tokens.size() + bs - 1) / bs - hit;
  if (need > 0) engine.append(r, need);
  insert(engine, ns, r, tokens);
  return r;
}

// Prefix-index invariants on top of the engine's: each block has at most one cache reference (the index's),
// and the index has one node per block with a cache reference.
void check_prefix_invariants(const TestEngine& engine) {
  engine.check_invariants();
  const std::vector<int32_t> cache = engine.cache_refs();
  int64_t cached = 0;
  for (const int32_t refs : cache) {
    CHECK(refs == 0 || refs == 1);
    cached += refs;
  }
  CHECK_EQ(prefix_stats(engine).indexed_blocks, cached);
}

}  // namespace

TEST(prefix_lookup_finds_the_indexed_full_blocks_of_a_request) {
  TestEngine engine(64);
  enable(engine, 4);
  const Tokens tokens = make_tokens(3, 4, 100);  // 3 full blocks
  Tokens with_partial = tokens;
  with_partial.push_back(7);  // a partial 4th block is never indexed
  const uint64_t r = engine.new_request();
  CHECK_EQ(lookup_attach(engine, 1, r, with_partial), 0);
  const std::vector<int32_t> blocks = engine.append(r, 4);
  CHECK_EQ(insert(engine, 1, r, with_partial), 3);
  const std::vector<int32_t> first3(blocks.begin(), blocks.begin() + 3);
  CHECK_EQ(lookup(engine, 1, with_partial), first3);
  CHECK_EQ(lookup(engine, 1, tokens, 2), (std::vector<int32_t>{blocks[0], blocks[1]}));
  Tokens diverging = tokens;
  diverging[9] = -5;  // third block differs in its second token
  CHECK_EQ(lookup(engine, 1, diverging), (std::vector<int32_t>{blocks[0], blocks[1]}));
  Tokens first_token_differs = tokens;
  first_token_differs[4] = -1;
  CHECK_EQ(lookup(engine, 1, first_token_differs), (std::vector<int32_t>{blocks[0]}));
  CHECK_EQ(lookup(engine, 1, Tokens(tokens.begin(), tokens.begin() + 3)), (std::vector<int32_t>{}));
  const tagma_prefix_stats s = prefix_stats(engine);
  CHECK_EQ(s.indexed_blocks, 3);
  CHECK_EQ(s.inserted_blocks, 3);
  CHECK_EQ(s.namespaces, 1);
  CHECK_EQ(engine.cache_refs()[static_cast<size_t>(blocks[3])], 0);
  check_prefix_invariants(engine);
}

TEST(prefix_namespaces_never_share_a_block) {
  TestEngine engine(64);
  enable(engine, 4);
  const Tokens tokens = make_tokens(2, 4, 0);
  const uint64_t a = compute(engine, 1, tokens, 4);
  CHECK_EQ(lookup(engine, 2, tokens).size(), 0u);
  const uint64_t b = compute(engine, 2, tokens, 4);
  const std::vector<int32_t> in_a = lookup(engine, 1, tokens);
  const std::vector<int32_t> in_b = lookup(engine, 2, tokens);
  CHECK_EQ(in_a, engine.blocks(a));
  CHECK_EQ(in_b, engine.blocks(b));
  for (const int32_t block : in_a) CHECK(std::find(in_b.begin(), in_b.end(), block) == in_b.end());
  CHECK_EQ(prefix_stats(engine).namespaces, 2);
  // A request keeps its namespace.
  check_error(tagma_prefix_insert(engine.handle(), 2, a, tokens.data(), 0, 8, nullptr), TAGMA_E_STATE,
              "tagma_prefix_insert");
  check_prefix_invariants(engine);
}

TEST(prefix_lookup_attach_takes_references_and_release_makes_blocks_cache_only) {
  TestEngine engine(32);
  enable(engine, 2);
  const Tokens tokens = make_tokens(3, 2, 10);
  const uint64_t a = compute(engine, 0, tokens, 2);
  const std::vector<int32_t> blocks = engine.blocks(a);
  engine.release(a);
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{blocks[2], blocks[1], blocks[0]}));  // last blocks evicted first
  const uint64_t b = engine.new_request();
  CHECK_EQ(lookup_attach(engine, 0, b, tokens, 2), 2);
  CHECK_EQ(engine.blocks(b), (std::vector<int32_t>{blocks[0], blocks[1]}));
  CHECK_EQ(engine.ranges(b).size(), 1u);  // consecutive hits are one range
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{blocks[2]}));
  CHECK_EQ(engine.req_refs()[static_cast<size_t>(blocks[0])], 1);
  // The request continues: its third block is new and gets indexed below the hit.
  const std::vector<int32_t> more = engine.append(b, 1);
  Tokens longer = tokens;
  longer[5] = 99;  // its third block differs from a's
  CHECK_EQ(insert(engine, 0, b, longer, 4), 3);
  CHECK_EQ(lookup(engine, 0, longer), (std::vector<int32_t>{blocks[0], blocks[1], more[0]}));
  CHECK_EQ(lookup(engine, 0, tokens), blocks);  // both continuations are children of the same node
  // lookup_attach wants a fresh request.
  check_error(tagma_prefix_lookup_attach(engine.handle(), 0, b, tokens.data(), 6, 3, nullptr), TAGMA_E_INVALID_ARG,
              "tagma_prefix_lookup_attach");
  int64_t hit = 0;
  check_error(tagma_prefix_lookup_attach(engine.handle(), 0, b, tokens.data(), 6, 3, &hit), TAGMA_E_STATE,
              "tagma_prefix_lookup_attach");
  engine.release(b);
  check_prefix_invariants(engine);
}

TEST(prefix_insert_is_incremental_and_validates_before_changing_anything) {
  TestEngine engine(64);
  enable(engine, 4);
  const Tokens tokens = make_tokens(6, 4, 1000);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);
  CHECK_EQ(insert(engine, 3, r, Tokens(tokens.begin(), tokens.begin() + 6)), 1);  // one full block computed
  CHECK_EQ(insert(engine, 3, r, tokens), 2);  // capped by the request's blocks
  engine.append(r, 4);
  // Tokens must start at or before the first position not indexed (8): 12 is refused, nothing changes.
  const test::Snapshot before = engine.snapshot();
  check_error(tagma_prefix_insert(engine.handle(), 3, r, tokens.data() + 12, 12, 12, nullptr), TAGMA_E_INVALID_ARG,
              "tagma_prefix_insert");
  check_error(tagma_prefix_insert(engine.handle(), 3, r, nullptr, 8, 4, nullptr), TAGMA_E_INVALID_ARG,
              "tagma_prefix_insert");
  check_error(tagma_prefix_insert(engine.handle(), 3, r, tokens.data(), -1, 4, nullptr), TAGMA_E_INVALID_ARG,
              "tagma_prefix_insert");
  check_error(tagma_prefix_insert(engine.handle(), 3, 999, tokens.data(), 0, 4, nullptr), TAGMA_E_NOT_FOUND,
              "tagma_prefix_insert");
  CHECK_EQ(engine.snapshot(), before);
  CHECK_EQ(prefix_stats(engine).indexed_blocks, 2);
  // Decode-time inserts pass only the new tokens.
  CHECK_EQ(insert(engine, 3, r, tokens, 8), 6);
  CHECK_EQ(lookup(engine, 3, tokens), engine.blocks(r));
  // Nothing new to index: any start is accepted.
  CHECK_EQ(insert(engine, 3, r, tokens, 20), 6);
  check_prefix_invariants(engine);
}

TEST(prefix_duplicate_blocks_stay_uncached_and_indexing_continues_below_the_existing_node) {
  TestEngine engine(64);
  enable(engine, 2);
  const Tokens tokens = make_tokens(2, 2, 0);
  const uint64_t a = engine.new_request();
  const uint64_t b = engine.new_request();
  CHECK_EQ(lookup_attach(engine, 0, a, tokens), 0);
  CHECK_EQ(lookup_attach(engine, 0, b, tokens), 0);  // both miss: computed twice, as in vLLM
  engine.append(a, 2);
  engine.append(b, 3);
  CHECK_EQ(insert(engine, 0, a, tokens), 2);
  Tokens longer = tokens;
  longer.push_back(50);
  longer.push_back(51);
  CHECK_EQ(insert(engine, 0, b, longer), 3);
  const tagma_prefix_stats s = prefix_stats(engine);
  CHECK_EQ(s.duplicate_blocks, 2);
  CHECK_EQ(s.indexed_blocks, 3);
  const std::vector<int32_t> hit = lookup(engine, 0, longer);
  CHECK_EQ(hit, (std::vector<int32_t>{engine.blocks(a)[0], engine.blocks(a)[1], engine.blocks(b)[2]}));
  engine.release(b);
  engine.release(a);
  CHECK_EQ(engine.stats().cached_only_blocks, 3);
  check_prefix_invariants(engine);
}

TEST(prefix_lru_mode_evicts_in_lru_order_and_removes_subtrees) {
  TestEngine engine(9);  // usable blocks 1..8
  enable(engine, 1, TAGMA_EVICT_LRU);
  const Tokens parent = {1, 2, 3, 4};
  const uint64_t a = compute(engine, 0, parent, 1);  // blocks 1..4: 1 <- 2 <- 3 <- 4
  const std::vector<int32_t> a_blocks = engine.blocks(a);
  engine.release(a);  // LRU 4 3 2 1
  // Make the root block 1 the next victim with its descendants behind it.
  const uint64_t holder = engine.new_request();
  engine.attach(holder, {4, 3, 2});
  engine.release(holder);  // LRU 1, then 2 3 4 (released in reverse logical order: 2 first)
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{1, 2, 3, 4}));
  // Fill the free blocks (5..8), then ask one more: evicting block 1 takes its subtree with it.
  const uint64_t r = engine.new_request();
  engine.append(r, 4);
  std::vector<int32_t> evicted;
  const std::vector<int32_t> got = engine.append(r, 1, &evicted);
  REQUIRE_EQ(evicted.size(), 4u);  // *num_evicted: 4 freed, of which the first `count` are listed
  CHECK_EQ(evicted[0], 1);
  CHECK_EQ(engine.stats().evictions, 4);
  CHECK_EQ(lookup(engine, 0, parent).size(), 0u);
  const tagma_prefix_stats s = prefix_stats(engine);
  CHECK_EQ(s.evicted_blocks, 4);
  CHECK_EQ(s.subtree_blocks, 3);
  CHECK_EQ(s.indexed_blocks, 0);
  CHECK_EQ(engine.stats().free_blocks, 3);
  (void)got;
  check_prefix_invariants(engine);
}

TEST(prefix_subtree_eviction_uncaches_descendants_still_in_use) {
  TestEngine engine(7);  // usable 1..6
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t a = compute(engine, 0, {5, 6, 7}, 1);  // blocks 1 2 3
  engine.release(a);
  const uint64_t holder = engine.new_request();
  engine.attach(holder, {3});  // in use, a descendant of block 1
  const uint64_t holder2 = engine.new_request();
  engine.attach(holder2, {2});
  engine.release(holder2);  // LRU: 1, 2
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{1, 2}));
  const uint64_t r = engine.new_request();
  engine.append(r, 4);  // 3 free (4..6) + evicts 1 (subtree: 2 freed, 3 uncached but in use)
  CHECK_EQ(engine.stats().evictions, 2);
  CHECK_EQ(engine.cache_refs()[3], 0);
  CHECK_EQ(engine.req_refs()[3], 1);
  CHECK_EQ(prefix_stats(engine).indexed_blocks, 0);
  engine.release(holder);  // block 3 is free now, not cache-only
  CHECK_EQ(engine.stats().cached_only_blocks, 0);
  check_prefix_invariants(engine);
}

TEST(prefix_contiguous_mode_grows_in_place_over_cache_only_neighbours) {
  for (const int32_t mode : {TAGMA_EVICT_LRU, TAGMA_EVICT_CONTIGUOUS}) {
    TestEngine engine(11);  // usable 1..10
    enable(engine, 1, TAGMA_EVICT_LRU);
    const uint64_t old = compute(engine, 0, {1, 2, 3, 4, 5}, 1);  // blocks 1..5
    const uint64_t r = engine.new_request();
    engine.append(r, 2);  // blocks 6 7
    const uint64_t next = compute(engine, 0, {9, 9, 9}, 1);  // blocks 8 9 10
    engine.release(next);  // LRU: 10 9 8
    engine.release(old);   // LRU: 10 9 8 5 4 3 2 1
    set_mode(engine, mode);
    const std::vector<int32_t> got = engine.append(r, 2);
    if (mode == TAGMA_EVICT_LRU) {
      CHECK_EQ(got, (std::vector<int32_t>{9, 10}));  // the LRU victims: a new range
      CHECK_EQ(engine.ranges(r).size(), 2u);
    } else {
      CHECK_EQ(got, (std::vector<int32_t>{8, 9}));  // right after the last range: one range
      CHECK_EQ(engine.ranges(r).size(), 1u);
      CHECK_EQ(prefix_stats(engine).in_place_evictions, 3);  // 8 and its subtree 9, 10
    }
    check_prefix_invariants(engine);
  }
}

TEST(prefix_contiguous_mode_evicts_a_window_for_a_new_range) {
  TestEngine engine(13);  // usable 1..12
  enable(engine, 1, TAGMA_EVICT_LRU);
  // Alternate cached requests and in-use blocks: 1-3 cached (a), 4 in use, 5-8 cached (b), 9 in use, 10-12 cached (c)
  const uint64_t a = compute(engine, 0, {1, 1, 1}, 1);
  const uint64_t pin1 = engine.new_request();
  engine.append(pin1, 1);
  const uint64_t b = compute(engine, 0, {2, 2, 2, 2}, 1);
  const uint64_t pin2 = engine.new_request();
  engine.append(pin2, 1);
  const uint64_t c = compute(engine, 0, {3, 3, 3}, 1);
  engine.release(a);  // LRU: 3 2 1 ...
  engine.release(b);
  engine.release(c);
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t r = engine.new_request();
  const std::vector<int32_t> got = engine.append(r, 3);
  CHECK_EQ(engine.ranges(r).size(), 1u);
  CHECK_EQ(got, (std::vector<int32_t>{1, 2, 3}));  // the window around the LRU victim (block 3)
  CHECK_EQ(prefix_stats(engine).window_evictions, 1);
  CHECK(lookup(engine, 0, {2, 2, 2, 2}).size() == 4u);  // b untouched
  check_prefix_invariants(engine);
}

// CONTIGUOUS evicts for contiguity only once the pool has cycled: while never-used blocks cover an append
// (vLLM would hand those out first), a growing request goes to free blocks and the cached neighbour after
// it stays cached; once every block has been used, it grows in place over that neighbour.
TEST(prefix_contiguous_mode_evicts_for_contiguity_only_once_never_used_blocks_run_short) {
  for (const bool cycled : {false, true}) {
    TestEngine engine(12);  // usable 1..11
    enable(engine, 1, TAGMA_EVICT_LRU);
    const uint64_t r = engine.new_request();
    engine.append(r, 2);  // 1 2
    const uint64_t c = compute(engine, 0, {4, 4}, 1);  // 3 4
    const uint64_t d = compute(engine, 0, {6, 6}, 1);  // 5 6
    engine.release(c);
    engine.release(d);  // LRU: 4 3 6 5
    if (cycled) {
      const uint64_t filler = engine.new_request();
      engine.append(filler, 5);  // 7..11, released uncached: free, but used
      engine.release(filler);
    }
    set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
    const std::vector<int32_t> got = engine.append(r, 1);
    if (cycled) {
      CHECK_EQ(got[0], 3);  // in place
      CHECK_EQ(engine.stats().evictions, 2);  // 3 and its child 4
      CHECK_EQ(engine.ranges(r).size(), 1u);
    } else {
      CHECK_EQ(got[0], 7);  // the start of the free range 7..11: the rest stays one run
      CHECK_EQ(engine.stats().evictions, 0);
      CHECK_EQ(lookup(engine, 0, {4, 4}).size(), 2u);
    }
    check_prefix_invariants(engine);
  }
}

// Evicting a cached block evicts its subtree: a neighbour cached recently (in the LRU's newer half, e.g. a
// preempted request that will come back) is not cut at its head for in-place growth; the growth takes a
// new range over the oldest cached chain's end instead.
TEST(prefix_contiguous_mode_keeps_a_recently_cached_neighbour) {
  TestEngine engine(9);  // usable 1..8
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);  // 1 2
  const uint64_t recent = compute(engine, 0, {4, 4, 4}, 1);  // 3 4 5
  const uint64_t old = compute(engine, 0, {7, 7, 7}, 1);     // 6 7 8
  engine.release(old);     // LRU: 8 7 6
  engine.release(recent);  // then 5 4 3
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const std::vector<int32_t> got = engine.append(r, 1);
  CHECK_EQ(got[0], 8);  // the oldest victim, the end of `old`
  CHECK_EQ(lookup(engine, 0, {4, 4, 4}).size(), 3u);
  CHECK_EQ(lookup(engine, 0, {7, 7, 7}).size(), 2u);
  check_prefix_invariants(engine);
}

// A pool full of cached blocks with no free block: a hinted new range goes where its hint fits, ending at
// the LRU victim (the tail of a cached chain), and then grows in place to the hint with no new range.
TEST(prefix_contiguous_mode_places_a_hinted_range_over_cached_blocks_and_grows_in_place) {
  TestEngine engine(21);  // usable 1..20
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t pin = engine.new_request();
  engine.append(pin, 2);  // 1 2
  const uint64_t a = compute(engine, 0, {1, 1, 1, 1, 1, 1, 1, 1}, 1);  // 3..10
  const uint64_t b = compute(engine, 0, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, 1);  // 11..20
  engine.release(b);  // LRU: 20 .. 11
  engine.release(a);  // then 10 .. 3
  CHECK_EQ(engine.stats().free_blocks, 0);
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t r = engine.new_request();
  int32_t runs[16] = {};
  int64_t num_runs = 0;
  require_ok(tagma_request_append_runs(engine.handle(), r, 2, 6, runs, 8, &num_runs), "append_runs");
  CHECK_EQ(num_runs, 1);
  // The victim is 20, the end of b's chain; its unused run 3..20 holds the hint: the latest start that
  // leaves 6 blocks of room, 15. Evicting 15 evicts its subtree 15..20: b's prefix 11..14 stays cached.
  CHECK_EQ(runs[0], 15);
  CHECK_EQ(runs[1], 2);
  CHECK_EQ(lookup(engine, 0, {1, 1, 1, 1, 1, 1, 1, 1}).size(), 8u);  // a untouched
  CHECK_EQ(lookup(engine, 0, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2}).size(), 4u);
  for (int i = 0; i < 4; ++i) engine.append(r, 1);
  CHECK_EQ(engine.ranges(r).size(), 1u);
  CHECK_EQ(engine.ranges(r)[0].start, 15);
  CHECK_EQ(engine.ranges(r)[0].count, 6);
  check_prefix_invariants(engine);
}

// A hinted append with room for its hint in a free run starts right where the left neighbour's reservation
// ends: the rest of the run stays one run, so a batch of admissions packs each behind the last one's room
// (a start in the middle of the run would halve it per admission and leave later hints no run to fit).
TEST(prefix_contiguous_mode_packs_hinted_ranges_behind_each_others_room) {
  TestEngine engine(21);  // usable 1..20, all free
  enable(engine, 1, TAGMA_EVICT_CONTIGUOUS);
  int32_t runs[4] = {};
  int64_t num_runs = 0;
  std::vector<uint64_t> requests;
  for (const int32_t expected_start : {1, 6, 11}) {
    const uint64_t r = engine.new_request();
    requests.push_back(r);
    require_ok(tagma_request_append_runs(engine.handle(), r, 2, 5, runs, 2, &num_runs), "append_runs");
    CHECK_EQ(num_runs, 1);
    CHECK_EQ(runs[0], expected_start);
  }
  CHECK(engine.free_ranges() == (Pairs{{3, 3}, {8, 3}, {13, 8}}));
  for (int i = 0; i < 3; ++i) {
    for (const uint64_t r : requests) engine.append(r, 1);  // each grows into its own room
  }
  for (const uint64_t r : requests) CHECK_EQ(engine.ranges(r).size(), 1u);
  check_prefix_invariants(engine);
}

// Once an append has found the never-used blocks short, cached blocks stay placeable space: a placement
// over cached blocks leaves a few never-used ones behind, and they must not keep a one-block decode append
// off the cached block right after its range.
TEST(prefix_contiguous_mode_keeps_treating_cached_blocks_as_space_once_the_pool_cycled) {
  TestEngine engine(16);  // usable 1..15
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);                                // 1 2
  const uint64_t c = compute(engine, 0, {4}, 1);      // 3
  const uint64_t pin = engine.new_request();
  engine.append(pin, 1);                              // 4
  const uint64_t e = compute(engine, 0, {6, 6, 6, 6}, 1);  // 5..8; 9..15 never used
  engine.release(e);  // LRU: 8 7 6 5
  engine.release(c);  // then 3
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t big = engine.new_request();
  CHECK_EQ(engine.append(big, 8), (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 12}));  // over e: 7 never used < 8
  CHECK_EQ(engine.stats().free_blocks, 3);  // 13..15, never used
  const std::vector<int32_t> got = engine.append(r, 1);
  CHECK_EQ(got, (std::vector<int32_t>{3}));  // in place over c, not a new range at 13
  CHECK_EQ(engine.ranges(r).size(), 1u);
  CHECK_EQ(lookup(engine, 0, {4}).size(), 0u);
  check_prefix_invariants(engine);
}

// A range placed over cached blocks grows into its room (its remaining expected blocks) even when those
// blocks read as "recently cached" by then: the LRU's halves move as older blocks are evicted, and the
// placement chose the room over exactly these blocks.
TEST(prefix_contiguous_mode_grows_into_its_room_when_the_lru_halves_have_moved) {
  TestEngine engine(12);  // usable 1..11
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t pin1 = engine.new_request();
  engine.append(pin1, 1);                                   // 1
  const uint64_t o = compute(engine, 0, {5}, 1);            // 2
  const uint64_t pin2 = engine.new_request();
  engine.append(pin2, 1);                                   // 3
  const uint64_t m = compute(engine, 0, {7, 7}, 1);         // 4 5
  const uint64_t q = compute(engine, 0, {8, 8, 8, 8}, 1);   // 6..9
  const uint64_t pin3 = engine.new_request();
  engine.append(pin3, 2);                                   // 10 11
  engine.release(o);  // LRU: 2
  engine.release(q);  // then 9 8 7 6
  engine.release(m);  // then 5 4
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t r = engine.new_request();
  int32_t runs[4] = {};
  int64_t num_runs = 0;
  require_ok(tagma_request_append_runs(engine.handle(), r, 2, 6, runs, 2, &num_runs), "append_runs");
  // o's run (2) is too short; q's end 9 anchors the window 4..9: the range evicts m, its room is q.
  CHECK_EQ(num_runs, 1);
  CHECK_EQ(runs[0], 4);
  CHECK_EQ(lookup(engine, 0, {8, 8, 8, 8}).size(), 4u);
  // With m gone the LRU is 2, then q: q's first blocks are in its newer half.
  for (int i = 0; i < 4; ++i) engine.append(r, 1);
  CHECK_EQ(engine.ranges(r).size(), 1u);
  CHECK_EQ(engine.ranges(r)[0].count, 6);
  CHECK_EQ(lookup(engine, 0, {5}).size(), 1u);  // o stays cached
  check_prefix_invariants(engine);
}

// Released and attached blocks keep the engine's unused runs in step: a new range never lands on a block
// in use, whatever mix of attach, release and eviction came before.
TEST(prefix_contiguous_mode_never_places_over_blocks_in_use) {
  TestEngine engine(17);  // usable 1..16
  enable(engine, 1, TAGMA_EVICT_LRU);
  const uint64_t a = compute(engine, 0, {1, 2, 3, 4, 5, 6, 7, 8}, 1);  // 1..8
  const uint64_t b = compute(engine, 0, {9, 9, 9, 9, 9, 9, 9, 9}, 1);  // 9..16
  engine.release(a);
  engine.release(b);
  const uint64_t hit = engine.new_request();
  CHECK_EQ(lookup_attach(engine, 0, hit, {1, 2, 3, 4, 5, 6, 7, 8}, 4), 4);  // 1..4 in use again
  set_mode(engine, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t r = engine.new_request();
  const std::vector<int32_t> got = engine.append(r, 12);  // every block not in use
  for (const int32_t block : got) CHECK(block > 4);
  CHECK_EQ(engine.stats().free_blocks + engine.stats().cached_only_blocks, 0);
  engine.release(hit);  // 1..4 cached again, so placeable
  const uint64_t s = engine.new_request();
  const std::vector<int32_t> more = engine.append(s, 4);
  CHECK_EQ(more, (std::vector<int32_t>{1, 2, 3, 4}));
  check_prefix_invariants(engine);
}

TEST(prefix_clear_drops_every_cache_reference_and_live_requests_stop_indexing) {
  TestEngine engine(32);
  enable(engine, 2);
  const Tokens tokens = make_tokens(4, 2, 0);
  const uint64_t a = compute(engine, 0, tokens, 2);
  const uint64_t live = engine.new_request();
  engine.append(live, 4);
  CHECK_EQ(insert(engine, 0, live, Tokens{7, 7, 7, 7, 7, 7, 7, 7}, 0), 4);
  engine.release(a);
  int64_t dropped = -1;
  require_ok(tagma_cache_clear(engine.handle(), &dropped), "tagma_cache_clear");  // = tagma_prefix_clear
  CHECK_EQ(dropped, 8);
  CHECK_EQ(engine.stats().cached_only_blocks, 0);
  CHECK_EQ(lookup(engine, 0, tokens).size(), 0u);
  const tagma_prefix_stats s = prefix_stats(engine);
  CHECK_EQ(s.indexed_blocks, 0);
  CHECK_EQ(s.namespaces, 0);
  CHECK_EQ(s.clears, 1);
  engine.append(live, 1);
  CHECK_EQ(insert(engine, 0, live, Tokens{7, 7, 7, 7, 7, 7, 7, 7, 8, 8}, 0), 4);  // lost its place
  CHECK_EQ(prefix_stats(engine).indexed_blocks, 0);
  check_prefix_invariants(engine);
}

TEST(prefix_errors_and_refusals) {
  TestEngine aligned(32, 2);
  check_error(tagma_prefix_enable(aligned.handle(), 4, TAGMA_EVICT_LRU), TAGMA_E_STATE, "tagma_prefix_enable");
  TestEngine engine(32);
  check_error(tagma_prefix_enable(engine.handle(), 0, TAGMA_EVICT_LRU), TAGMA_E_INVALID_ARG, "tagma_prefix_enable");
  check_error(tagma_prefix_enable(engine.handle(), 4, 7), TAGMA_E_INVALID_ARG, "tagma_prefix_enable");
  tagma_prefix_stats s{};
  check_error(tagma_prefix_stats_get(engine.handle(), &s), TAGMA_E_STATE, "tagma_prefix_stats_get");
  int64_t hit = 0;
  check_error(tagma_prefix_lookup(engine.handle(), 0, nullptr, 0, 1, nullptr, &hit), TAGMA_E_STATE,
              "tagma_prefix_lookup");
  const uint64_t r = engine.new_request();
  engine.append(r, 1);
  engine.mark({1});
  check_error(tagma_prefix_enable(engine.handle(), 4, TAGMA_EVICT_LRU), TAGMA_E_STATE, "tagma_prefix_enable");
  engine.unmark({1});
  enable(engine, 4);
  check_error(tagma_prefix_enable(engine.handle(), 4, TAGMA_EVICT_LRU), TAGMA_E_STATE, "tagma_prefix_enable");
  const int32_t block = 1;
  check_error(tagma_cache_mark(engine.handle(), &block, 1), TAGMA_E_STATE, "tagma_cache_mark");
  check_error(tagma_cache_unmark(engine.handle(), &block, 1), TAGMA_E_STATE, "tagma_cache_unmark");
  int64_t n = 0;
  check_error(tagma_cache_evict(engine.handle(), 1, nullptr, &n), TAGMA_E_STATE, "tagma_cache_evict");
  check_error(tagma_prefix_set_eviction_mode(engine.handle(), -1), TAGMA_E_INVALID_ARG,
              "tagma_prefix_set_eviction_mode");
  require_ok(tagma_prefix_set_eviction_mode(engine.handle(), TAGMA_EVICT_CONTIGUOUS), "set mode");
  CHECK_EQ(prefix_stats(engine).eviction_mode, TAGMA_EVICT_CONTIGUOUS);
  check_error(tagma_prefix_lookup(engine.handle(), 0, nullptr, 4, 1, nullptr, &hit), TAGMA_E_INVALID_ARG,
              "tagma_prefix_lookup");
  const Tokens tokens = make_tokens(1, 4, 0);
  check_error(tagma_prefix_lookup(engine.handle(), 0, tokens.data(), 4, -1, nullptr, &hit), TAGMA_E_INVALID_ARG,
              "tagma_prefix_lookup");
  check_error(tagma_prefix_lookup(engine.handle(), 0, tokens.data(), 4, 1, nullptr, nullptr), TAGMA_E_INVALID_ARG,
              "tagma_prefix_lookup");
  check_error(tagma_prefix_lookup(engine.handle() + 1000, 0, tokens.data(), 4, 1, nullptr, &hit),
              TAGMA_E_INVALID_HANDLE, "tagma_prefix_lookup");
  // append_runs may evict with the index: the index knows what it loses.
  check_prefix_invariants(engine);
}

TEST(prefix_append_runs_may_evict_with_the_index) {
  TestEngine engine(9);
  enable(engine, 1, TAGMA_EVICT_CONTIGUOUS);
  const uint64_t a = compute(engine, 0, {1, 2, 3, 4, 5, 6, 7, 8}, 1);
  engine.release(a);
  const uint64_t r = engine.new_request();
  int32_t runs[8] = {};
  int64_t num_runs = 0;
  require_ok(tagma_request_append_runs(engine.handle(), r, 4, 0, runs, 4, &num_runs), "append_runs");
  CHECK_EQ(num_runs, 1);
  CHECK_EQ(runs[1], 4);
  CHECK_EQ(runs[0], 5);  // the window around the LRU victim 8: blocks 5..8
  CHECK_EQ(lookup(engine, 0, {1, 2, 3, 4, 5, 6, 7, 8}).size(), 4u);
  check_prefix_invariants(engine);
}

TEST(prefix_random_operations_keep_the_invariants) {
  for (const int32_t mode : {TAGMA_EVICT_LRU, TAGMA_EVICT_CONTIGUOUS}) {
    std::mt19937 rng(1234 + static_cast<unsigned>(mode));
    TestEngine engine(97);
    const int64_t bs = 2;
    enable(engine, bs, mode);
    struct Live {
      uint64_t id;
      uint64_t ns;
      Tokens tokens;
    };
    std::vector<Live> live;
    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4 && live.size() < 12) {
        // A prompt drawn from a few families so that prefixes are shared.
        const uint64_t ns = rng() % 2;
        Tokens tokens;
        const int family = static_cast<int>(rng() % 3);
        const int len = 1 + static_cast<int>(rng() % 14);
        for (int i = 0; i < len; ++i) tokens.push_back(family * 100 + (i < 6 ? i : static_cast<int>(rng() % 3)));
        const uint64_t r = engine.new_request();
        const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
        const int64_t hit = lookup_attach(engine, ns, r, tokens, max_blocks);
        const int64_t need = (static_cast<int64_t>(tokens.size()) + bs - 1) / bs - hit;
        const tagma_stats s = engine.stats();
        if (need > 0 && s.free_blocks + s.cached_only_blocks < need) {
          engine.release(r);
          continue;
        }
        if (need > 0) engine.append(r, need);
        insert(engine, ns, r, tokens);
        live.push_back(Live{r, ns, tokens});
      } else if (op < 7 && !live.empty()) {
        Live& l = live[rng() % live.size()];  // decode: one token more
        l.tokens.push_back(static_cast<int32_t>(rng() % 4));
        const int64_t need = (static_cast<int64_t>(l.tokens.size()) + bs - 1) / bs -
                             static_cast<int64_t>(engine.blocks(l.id).size());
        const tagma_stats s = engine.stats();
        if (need > 0 && s.free_blocks + s.cached_only_blocks < need) continue;
        if (need > 0) engine.append(l.id, need);
        const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(l.tokens.size()) - 3);
        int64_t indexed = 0;
        const tagma_status status = tagma_prefix_insert(engine.handle(), l.ns, l.id, l.tokens.data() + start, start,
                                                        static_cast<int64_t>(l.tokens.size()) - start, &indexed);
        CHECK(status == TAGMA_OK || status == TAGMA_E_INVALID_ARG);  // a start past the indexed prefix
      } else if (!live.empty()) {
        const size_t i = rng() % live.size();
        engine.release(live[i].id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (step % 25 == 0) check_prefix_invariants(engine);
      // Every hit block holds the tokens it was looked up with: check through a second request's view.
      for (const Live& l : live) {
        const std::vector<int32_t> hit = lookup(engine, l.ns, l.tokens);
        for (const int32_t block : hit) CHECK_EQ(engine.cache_refs()[static_cast<size_t>(block)], 1);
      }
    }
    for (const Live& l : live) engine.release(l.id);
    check_prefix_invariants(engine);
    CHECK_EQ(engine.stats().used_blocks, 0);
  }
}

TEST(prefix_later_children_stay_reachable_when_the_first_child_is_evicted) {
  TestEngine engine(5);  // usable 1..4: P, A, B, C
  enable(engine, 2, TAGMA_EVICT_LRU);
  const uint64_t a = compute(engine, 0, {1, 1, 2, 2}, 2);  // P, then A (P's first child)
  const uint64_t b = compute(engine, 0, {1, 1, 2, 3}, 2);  // B: same first token as A
  const uint64_t c = compute(engine, 0, {1, 1, 5, 5}, 2);  // C: another first token
  const int32_t first_child = engine.blocks(a)[1];
  engine.release(a);  // LRU: A (P is still held by b and c)
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{first_child}));
  const uint64_t r = engine.new_request();
  CHECK_EQ(engine.append(r, 1), (std::vector<int32_t>{first_child}));  // evicts A
  CHECK_EQ(lookup(engine, 0, {1, 1, 2, 2}).size(), 1u);
  CHECK_EQ(lookup(engine, 0, {1, 1, 2, 3}), engine.blocks(b));
  CHECK_EQ(lookup(engine, 0, {1, 1, 5, 5}), engine.blocks(c));
  // A new child goes after the current first child, and everything stays reachable.
  engine.release(r);
  const uint64_t d = compute(engine, 0, {1, 1, 7, 7}, 2);
  CHECK_EQ(lookup(engine, 0, {1, 1, 7, 7}), engine.blocks(d));
  CHECK_EQ(lookup(engine, 0, {1, 1, 2, 3}), engine.blocks(b));
  CHECK_EQ(lookup(engine, 0, {1, 1, 5, 5}), engine.blocks(c));
  check_prefix_invariants(engine);
}
