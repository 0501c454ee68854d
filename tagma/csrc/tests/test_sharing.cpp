// attach / release: shared prefixes, range merging, LRU order on release, coalescing, histogram, stats.
#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::RangeTriple;
using test::require_ok;
using test::TestEngine;

TEST(attach_shares_a_prefix_until_both_requests_release) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 4);  // [1, 5)
  engine.attach(r2, {1, 2});
  CHECK_EQ(engine.append(r2, 2), (std::vector<int32_t>{5, 6}));  // block 3 is r1's: a new range
  CHECK_EQ(engine.ranges(r2), (std::vector<RangeTriple>{{1, 2, 0}, {5, 2, 2}}));
  CHECK_EQ(engine.req_refs()[1], 2);
  CHECK_EQ(engine.stats().used_blocks, 6);
  engine.check_invariants();

  engine.release(r1);
  CHECK_EQ(engine.req_refs()[1], 1);
  CHECK_EQ(engine.req_refs()[2], 1);
  CHECK_EQ(engine.free_ranges(), (Pairs{{3, 2}, {7, 10}}));
  engine.check_invariants();
  engine.release(r2);
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 16}}));
  engine.check_invariants();
}

TEST(attach_turns_consecutive_ids_into_ranges_and_merges) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 8);
  engine.attach(r2, {3, 4, 5});
  CHECK_EQ(engine.ranges(r2), (std::vector<RangeTriple>{{3, 3, 0}}));
  CHECK_EQ(engine.stats().merges, 0);
  engine.attach(r2, {6, 7});  // adjacent to the last range: merges
  CHECK_EQ(engine.ranges(r2), (std::vector<RangeTriple>{{3, 5, 0}}));
  CHECK_EQ(engine.stats().merges, 1);
  engine.attach(r2, {1, 8, 2});
  CHECK_EQ(engine.ranges(r2), (std::vector<RangeTriple>{{3, 5, 0}, {1, 1, 5}, {8, 1, 6}, {2, 1, 7}}));
  CHECK_EQ(engine.stats().merges, 1);
  CHECK_EQ(engine.stats().new_ranges, 1);  // attach does not start ranges
  CHECK_EQ(engine.stats().total_request_ranges, 5);
  engine.check_invariants();
}

TEST(attach_takes_a_cache_only_block_out_of_the_lru) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  engine.append(r1, 4);
  engine.mark({1, 2, 3, 4});
  engine.release(r1);
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{4, 3, 2, 1}));
  const uint64_t r2 = engine.new_request();
  engine.attach(r2, {1, 2});
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{4, 3}));
  CHECK_EQ(engine.req_refs()[1], 1);
  CHECK_EQ(engine.cache_refs()[1], 1);
  CHECK_EQ(engine.stats().used_blocks, 2);
  CHECK_EQ(engine.stats().cached_only_blocks, 2);
  engine.check_invariants();
  engine.release(r2);  // cached again: back to the LRU tail, last logical block first
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{4, 3, 2, 1}));
  engine.check_invariants();
}

TEST(release_puts_cached_blocks_on_the_lru_in_reverse_logical_order) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 3);  // [1, 4)
  engine.append(r2, 2);  // [4, 6)
  engine.append(r1, 2);  // [6, 8)
  engine.mark({1, 2, 3, 6, 7, 4, 5});
  engine.release(r2);
  engine.release(r1);
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{5, 4, 7, 6, 3, 2, 1}));
  CHECK_EQ(engine.evict(3), (std::vector<int32_t>{5, 4, 7}));
  engine.check_invariants();
}

TEST(release_frees_uncached_blocks_and_coalesces) {
  TestEngine engine(17);
  std::vector<uint64_t> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), 4);
  }
  engine.mark({6});  // one cached block in the middle of requests[1]
  engine.release(requests[1]);
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 1}, {7, 2}}));
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{6}));
  engine.release(requests[2]);
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 1}, {7, 6}}));
  engine.unmark({6});
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 8}}));
  engine.check_invariants();
}

TEST(release_removes_the_request) {
  TestEngine engine(17);
  const uint64_t r = engine.new_request();
  engine.append(r, 3);
  engine.release(r);
  int64_t num_blocks = 0;
  test::check_error(tagma_request_num_blocks(engine.handle(), r, &num_blocks), TAGMA_E_NOT_FOUND,
                    "tagma_request_num_blocks");
  CHECK_EQ(engine.stats().live_requests, 0);
  CHECK_EQ(engine.new_request(), r + 1);  // ids are never reused
}

TEST(ranges_histogram_counts_requests_per_number_of_ranges) {
  TestEngine engine(41);
  engine.new_request();  // no ranges
  const uint64_t one = engine.new_request();
  const uint64_t two = engine.new_request();
  const uint64_t three = engine.new_request();
  engine.append(one, 2);    // [1, 3)
  engine.append(two, 1);    // [3, 4)
  engine.append(three, 1);  // [4, 5)
  engine.append(two, 1);    // [5, 6)
  engine.append(three, 1);  // [6, 7)
  engine.attach(three, {1});
  CHECK_EQ(engine.ranges(one).size(), 1u);
  CHECK_EQ(engine.ranges(two).size(), 2u);
  CHECK_EQ(engine.ranges(three).size(), 3u);

  std::vector<int64_t> histogram(5, -1);
  require_ok(tagma_ranges_histogram(engine.handle(), histogram.data(), 5), "tagma_ranges_histogram");
  CHECK_EQ(histogram, (std::vector<int64_t>{1, 1, 1, 1, 0}));
  std::vector<int64_t> clamped(3, -1);  // the last bucket holds requests with >= 2 ranges
  require_ok(tagma_ranges_histogram(engine.handle(), clamped.data(), 3), "tagma_ranges_histogram");
  CHECK_EQ(clamped, (std::vector<int64_t>{1, 1, 2}));
  std::vector<int64_t> single(1, -1);  // one bucket: every request
  require_ok(tagma_ranges_histogram(engine.handle(), single.data(), 1), "tagma_ranges_histogram");
  CHECK_EQ(single, (std::vector<int64_t>{4}));
  CHECK_EQ(engine.stats().max_request_ranges, 3);
  CHECK_EQ(engine.stats().total_request_ranges, 6);
  engine.check_invariants();
}

TEST(stats_report_fragmentation_of_the_free_list) {
  TestEngine engine(17);
  CHECK_EQ(engine.stats().external_fragmentation, 0.0);
  std::vector<uint64_t> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), 4);
  }
  CHECK_EQ(engine.stats().free_blocks, 0);
  CHECK_EQ(engine.stats().external_fragmentation, 0.0);
  engine.release(requests[0]);  // {1:4}
  engine.release(requests[2]);  // {9:4}
  tagma_stats s = engine.stats();
  CHECK_EQ(s.free_ranges, 2);
  CHECK_EQ(s.largest_free_range, 4);
  CHECK_EQ(s.external_fragmentation, 0.5);
  CHECK_EQ(s.usable_blocks, 16);
  CHECK_EQ(s.num_blocks, 17);
  CHECK_EQ(s.live_requests, 2);
  engine.release(requests[1]);
  s = engine.stats();
  CHECK_EQ(s.free_ranges, 1);
  CHECK_EQ(s.external_fragmentation, 0.0);
}
