// Cache references: mark, unmark, evict, clear.
#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::require_ok;
using test::TestEngine;

TEST(cache_mark_keeps_an_in_use_block_in_use) {
  TestEngine engine(17);
  const uint64_t r = engine.new_request();
  engine.append(r, 4);
  engine.mark({2, 3});
  CHECK_EQ(engine.cache_refs()[2], 1);
  CHECK_EQ(engine.stats().used_blocks, 4);
  CHECK_EQ(engine.stats().cached_only_blocks, 0);
  engine.unmark({2});
  CHECK_EQ(engine.cache_refs()[2], 0);
  CHECK_EQ(engine.stats().used_blocks, 4);
  engine.release(r);
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{3}));
  engine.check_invariants();
}

TEST(cache_mark_counts_each_listing) {
  TestEngine engine(17);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);
  engine.mark({1, 1, 2});
  CHECK_EQ(engine.cache_refs()[1], 2);
  engine.release(r);
  engine.unmark({1});
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{2, 1}));  // still cached once
  engine.unmark({1, 2});
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{}));
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 16}}));
  engine.check_invariants();
}

TEST(cache_unmark_frees_a_cache_only_block) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 4);
  engine.append(r2, 12);
  engine.mark({1, 2, 3, 4});
  engine.release(r1);
  engine.unmark({3, 2});
  CHECK_EQ(engine.free_ranges(), (Pairs{{2, 2}}));
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{4, 1}));
  engine.check_invariants();
}

TEST(cache_evict_follows_lru_order_and_reports_blocks) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 3);
  engine.append(r2, 3);
  engine.mark({1, 2, 3, 4, 5, 6});
  engine.release(r2);
  engine.release(r1);
  CHECK_EQ(engine.evict(2), (std::vector<int32_t>{6, 5}));
  CHECK_EQ(engine.stats().evictions, 2);
  CHECK_EQ(engine.cache_refs()[6], 0);
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 12}}));
  CHECK_EQ(engine.evict(100), (std::vector<int32_t>{4, 3, 2, 1}));  // fewer than asked
  CHECK_EQ(engine.evict(1), (std::vector<int32_t>{}));
  CHECK_EQ(engine.stats().evictions, 6);
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 16}}));
  engine.check_invariants();
}

TEST(cache_evict_accepts_a_null_block_output) {
  TestEngine engine(17);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);
  engine.mark({1, 2});
  engine.release(r);
  int64_t num_evicted = -1;
  require_ok(tagma_cache_evict(engine.handle(), 5, nullptr, &num_evicted), "tagma_cache_evict");
  CHECK_EQ(num_evicted, 2);
}

TEST(cache_clear_drops_every_cache_reference) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 4);
  engine.append(r2, 4);
  engine.mark({1, 2, 5, 5, 6});
  engine.release(r1);  // 1, 2 cache-only; 3, 4 free
  int64_t dropped = -1;
  require_ok(tagma_cache_clear(engine.handle(), &dropped), "tagma_cache_clear");
  CHECK_EQ(dropped, 4);
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{}));
  CHECK_EQ(engine.cache_refs(), std::vector<int32_t>(17, 0));
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 4}, {9, 8}}));
  CHECK_EQ(engine.stats().used_blocks, 4);
  CHECK_EQ(engine.stats().evictions, 0);
  require_ok(tagma_cache_clear(engine.handle(), nullptr), "tagma_cache_clear");
  engine.check_invariants();
}
