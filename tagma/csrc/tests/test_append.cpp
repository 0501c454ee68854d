// append: in-place growth, new ranges, policies, the multi-range fallback, alignment and eviction.
#include <numeric>

#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::RangeTriple;
using test::require_ok;
using test::TestEngine;

namespace {

std::vector<int32_t> iota_blocks(int32_t first, int32_t count) {
  std::vector<int32_t> blocks(static_cast<size_t>(count));
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// 40 usable blocks carved (by first fit) into free holes {1:2} {6:8} {16:5} {24:4} between live requests;
// the engine then uses `policy`.
void carve_holes(TestEngine& engine, int32_t policy = TAGMA_POLICY_FIRST_FIT) {
  engine.set_policy(TAGMA_POLICY_FIRST_FIT);
  std::vector<uint64_t> requests;
  for (const int64_t count : {2, 3, 8, 2, 5, 3, 4, 13}) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), count);
  }
  for (const size_t hole : {0, 2, 4, 6}) engine.release(requests[hole]);
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 2}, {6, 8}, {16, 5}, {24, 4}}));
  engine.set_policy(policy);
}

}  // namespace

TEST(append_grows_the_last_range_in_place) {
  TestEngine engine(32);
  const uint64_t r = engine.new_request();
  CHECK_EQ(engine.append(r, 4), iota_blocks(1, 4));
  CHECK_EQ(engine.append(r, 3), iota_blocks(5, 3));
  CHECK_EQ(engine.ranges(r), (std::vector<RangeTriple>{{1, 7, 0}}));
  const tagma_stats s = engine.stats();
  CHECK_EQ(s.in_place_growths, 1);
  CHECK_EQ(s.new_ranges, 1);
  CHECK_EQ(s.merges, 0);
  CHECK_EQ(s.appended_blocks, 7);
  CHECK_EQ(engine.free_ranges(), (Pairs{{8, 24}}));
  engine.check_invariants();
}

TEST(append_starts_a_new_range_when_the_next_block_is_taken) {
  TestEngine engine(32);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 4);
  engine.append(r2, 2);
  CHECK_EQ(engine.append(r1, 3), iota_blocks(7, 3));
  CHECK_EQ(engine.ranges(r1), (std::vector<RangeTriple>{{1, 4, 0}, {7, 3, 4}}));
  CHECK_EQ(engine.stats().in_place_growths, 0);
  CHECK_EQ(engine.stats().new_ranges, 3);
  engine.check_invariants();
}

TEST(append_grows_partly_then_places_the_rest) {
  TestEngine engine(32);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  const uint64_t r3 = engine.new_request();
  engine.append(r1, 4);  // [1, 5)
  engine.append(r2, 4);  // [5, 9)
  engine.append(r3, 4);  // [9, 13)
  engine.release(r2);
  const std::vector<int32_t> expected{5, 6, 7, 8, 13, 14};
  CHECK_EQ(engine.append(r1, 6), expected);
  CHECK_EQ(engine.ranges(r1), (std::vector<RangeTriple>{{1, 8, 0}, {13, 2, 8}}));
  CHECK_EQ(engine.stats().in_place_growths, 1);
  CHECK_EQ(engine.stats().new_ranges, 4);
  engine.check_invariants();
}

TEST(append_falls_back_to_many_ranges_when_fragmented) {
  TestEngine engine(65);
  std::vector<uint64_t> singles;
  for (int i = 0; i < 64; ++i) {
    singles.push_back(engine.new_request());
    engine.append(singles.back(), 1);
  }
  for (size_t i = 0; i < singles.size(); i += 2) engine.release(singles[i]);  // frees blocks 1, 3, ..., 63
  CHECK_EQ(engine.stats().free_ranges, 32);
  const uint64_t big = engine.new_request();
  std::vector<int32_t> expected;
  for (int32_t b = 1; b <= 39; b += 2) expected.push_back(b);  // all capacities tie: lowest address first
  CHECK_EQ(engine.append(big, 20), expected);
  CHECK_EQ(engine.ranges(big).size(), 20u);
  CHECK_EQ(engine.ranges(big)[19], (RangeTriple{39, 1, 19}));
  CHECK_EQ(engine.stats().max_request_ranges, 20);
  CHECK_EQ(engine.stats().free_blocks, 12);
  engine.check_invariants();
}

TEST(append_fallback_takes_the_largest_free_ranges_first) {
  TestEngine engine(41);
  carve_holes(engine);  // holes {1:2} {6:8} {16:5} {24:4}
  const uint64_t r = engine.new_request();
  std::vector<int32_t> expected = iota_blocks(6, 8);
  for (const int32_t b : iota_blocks(16, 5)) expected.push_back(b);
  expected.push_back(24);
  CHECK_EQ(engine.append(r, 14), expected);
  CHECK_EQ(engine.ranges(r), (std::vector<RangeTriple>{{6, 8, 0}, {16, 5, 8}, {24, 1, 13}}));
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 2}, {25, 3}}));
  engine.check_invariants();
}

TEST(append_first_fit_on_hand_made_free_list) {
  TestEngine engine(41, 1, TAGMA_POLICY_FIRST_FIT);
  carve_holes(engine);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(6, 4));
  CHECK_EQ(engine.append(engine.new_request(), 2), iota_blocks(1, 2));
  CHECK_EQ(engine.free_ranges(), (Pairs{{10, 4}, {16, 5}, {24, 4}}));
  engine.check_invariants();
}

TEST(append_best_fit_on_hand_made_free_list) {
  TestEngine engine(41);
  carve_holes(engine, TAGMA_POLICY_BEST_FIT);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(24, 4));
  CHECK_EQ(engine.append(engine.new_request(), 5), iota_blocks(16, 5));
  CHECK_EQ(engine.append(engine.new_request(), 1), iota_blocks(1, 1));
  CHECK_EQ(engine.free_ranges(), (Pairs{{2, 1}, {6, 8}}));
  engine.check_invariants();
}

TEST(append_headroom_on_hand_made_free_list) {
  TestEngine engine(41);
  carve_holes(engine, TAGMA_POLICY_HEADROOM);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(8, 4));  // middle of {6:8}
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 2}, {6, 2}, {12, 2}, {16, 5}, {24, 4}}));
  CHECK_EQ(engine.append(engine.new_request(), 3), iota_blocks(17, 3));  // middle of {16:5}
  engine.check_invariants();
}

TEST(append_headroom_starts_at_the_first_usable_block) {
  TestEngine engine(41, 1, TAGMA_POLICY_HEADROOM);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(1, 4));
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(21, 4));  // middle of [5, 41)
}

TEST(append_policy_can_change_between_calls) {
  TestEngine engine(41);
  carve_holes(engine, TAGMA_POLICY_BEST_FIT);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(24, 4));
  engine.set_policy(TAGMA_POLICY_FIRST_FIT);
  CHECK_EQ(engine.append(engine.new_request(), 4), iota_blocks(6, 4));
}

TEST(append_alignment_counts_starts_and_usable_space) {
  TestEngine engine(34, 4);  // usable [4, 32)
  CHECK_EQ(engine.stats().usable_blocks, 28);
  CHECK_EQ(engine.free_ranges(), (Pairs{{4, 28}}));
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  CHECK_EQ(engine.append(r1, 4), iota_blocks(4, 4));
  CHECK_EQ(engine.append(r2, 8), iota_blocks(8, 8));
  CHECK_EQ(engine.append(r1, 4), iota_blocks(16, 4));
  CHECK_EQ(engine.ranges(r1), (std::vector<RangeTriple>{{4, 4, 0}, {16, 4, 4}}));
  CHECK_EQ(engine.append(r1, 12), iota_blocks(20, 12));  // grows to the end of the usable space
  CHECK_EQ(engine.stats().free_blocks, 0);
  engine.check_invariants();
}

TEST(append_alignment_rounds_unaligned_free_ranges_up) {
  TestEngine engine(64, 4);  // usable [4, 64)
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 8);   // [4, 12)
  engine.append(r2, 52);  // [12, 64)
  engine.mark(iota_blocks(4, 8));
  engine.release(r1);
  CHECK_EQ(engine.evict(5), (std::vector<int32_t>{11, 10, 9, 8, 7}));
  CHECK_EQ(engine.free_ranges(), (Pairs{{7, 5}}));
  const uint64_t r3 = engine.new_request();
  CHECK_EQ(engine.append(r3, 4), iota_blocks(8, 4));
  CHECK_EQ(engine.free_ranges(), (Pairs{{7, 1}}));
  engine.check_invariants();
}

TEST(append_alignment_no_space_when_free_blocks_are_unaligned) {
  TestEngine engine(64, 4);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  engine.append(r1, 12);  // [4, 16)
  engine.append(r2, 48);  // [16, 64)
  engine.mark(iota_blocks(4, 12));
  engine.release(r1);
  engine.unmark({5, 6, 9, 10});
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 2}, {9, 2}}));
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{15, 14, 13, 12, 11, 8, 7, 4}));

  const uint64_t r3 = engine.new_request();
  const test::Snapshot before = engine.snapshot();
  // 4 free blocks, none at an aligned run of 4: no eviction is needed, yet nothing fits.
  test::check_error(tagma_request_append(engine.handle(), r3, 4, nullptr, nullptr, nullptr), TAGMA_E_NO_SPACE,
                    "tagma_request_append");
  CHECK_EQ(engine.snapshot(), before);
  // 8 blocks: evicting 15, 14, 13, 12 gives aligned capacity 4 only; the eviction is undone.
  test::check_error(tagma_request_append(engine.handle(), r3, 8, nullptr, nullptr, nullptr), TAGMA_E_NO_SPACE,
                    "tagma_request_append");
  CHECK_EQ(engine.snapshot(), before);
  engine.check_invariants();
  // 12 blocks: evicting all 8 cached blocks frees [4, 16) entirely, which fits.
  std::vector<int32_t> evicted;
  CHECK_EQ(engine.append(r3, 12, &evicted), iota_blocks(4, 12));
  CHECK_EQ(evicted, (std::vector<int32_t>{15, 14, 13, 12, 11, 8, 7, 4}));
  engine.check_invariants();
}

TEST(append_evicts_exactly_the_shortfall_in_lru_order) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  engine.append(r1, 8);  // [1, 9)
  engine.mark(iota_blocks(1, 8));
  engine.release(r1);  // LRU 8, 7, ..., 1
  const uint64_t r2 = engine.new_request();
  engine.append(r2, 6);  // [9, 15); 2 blocks stay free
  std::vector<int32_t> evicted;
  const uint64_t r3 = engine.new_request();
  const std::vector<int32_t> blocks = engine.append(r3, 5, &evicted);
  CHECK_EQ(evicted, (std::vector<int32_t>{8, 7, 6}));
  CHECK_EQ(blocks, (std::vector<int32_t>{6, 7, 8, 15, 16}));  // fallback: [6, 9) then [15, 17)
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{5, 4, 3, 2, 1}));
  CHECK_EQ(engine.stats().evictions, 3);
  CHECK_EQ(engine.cache_refs()[8], 0);
  engine.check_invariants();
}

TEST(append_without_eviction_when_enough_blocks_are_free) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  engine.append(r1, 4);
  engine.mark(iota_blocks(1, 4));
  engine.release(r1);
  std::vector<int32_t> evicted{99};
  engine.append(engine.new_request(), 12, &evicted);
  CHECK(evicted.empty());
  CHECK_EQ(engine.lru(), (std::vector<int32_t>{4, 3, 2, 1}));
}

TEST(append_more_than_free_plus_cached_changes_nothing) {
  TestEngine engine(17);
  const uint64_t r1 = engine.new_request();
  engine.append(r1, 10);
  engine.mark({1, 2});
  const uint64_t r2 = engine.new_request();
  const test::Snapshot before = engine.snapshot();
  test::check_error(tagma_request_append(engine.handle(), r2, 7, nullptr, nullptr, nullptr), TAGMA_E_NO_SPACE,
                    "tagma_request_append");
  CHECK_EQ(engine.snapshot(), before);
  test::check_error(tagma_request_append(engine.handle(), r2, 1000, nullptr, nullptr, nullptr), TAGMA_E_NO_SPACE,
                    "tagma_request_append");
  CHECK_EQ(engine.snapshot(), before);
  engine.append(r2, 6);  // exactly what is free
  CHECK_EQ(engine.stats().free_blocks, 0);
}

TEST(append_accepts_null_outputs) {
  TestEngine engine(17);
  const uint64_t r = engine.new_request();
  require_ok(tagma_request_append(engine.handle(), r, 5, nullptr, nullptr, nullptr), "append");
  CHECK_EQ(engine.ranges(r), (std::vector<RangeTriple>{{1, 5, 0}}));
}

TEST(request_has_no_cap_on_ranges) {
  TestEngine engine(4001);
  std::vector<uint64_t> singles;
  for (int i = 0; i < 4000; ++i) {
    singles.push_back(engine.new_request());
    engine.append(singles.back(), 1);
  }
  for (size_t i = 0; i < singles.size(); i += 2) engine.release(singles[i]);
  const uint64_t big = engine.new_request();
  engine.append(big, 2000);
  int64_t num_ranges = 0;
  require_ok(tagma_request_num_ranges(engine.handle(), big, &num_ranges), "num_ranges");
  CHECK_EQ(num_ranges, 2000);
  CHECK_EQ(engine.stats().max_request_ranges, 2000);
  engine.check_invariants();
  engine.release(big);
  for (size_t i = 1; i < singles.size(); i += 2) engine.release(singles[i]);
  CHECK_EQ(engine.free_ranges(), (Pairs{{1, 4000}}));
}

TEST(request_block_queries_use_range_arithmetic) {
  TestEngine engine(41);
  carve_holes(engine);
  const uint64_t r = engine.new_request();
  const std::vector<int32_t> blocks = engine.append(r, 14);  // ranges {6:8} {16:5} {24:1}
  for (int64_t logical = 0; logical < 14; ++logical) {
    int32_t physical = -1;
    require_ok(tagma_request_block(engine.handle(), r, logical, &physical), "tagma_request_block");
    CHECK_EQ(physical, blocks[static_cast<size_t>(logical)]);
  }
  std::vector<int32_t> middle(9, -1);
  require_ok(tagma_request_blocks(engine.handle(), r, 5, 9, middle.data()), "tagma_request_blocks");
  CHECK_EQ(middle, (std::vector<int32_t>(blocks.begin() + 5, blocks.end())));
  int64_t num_blocks = 0;
  require_ok(tagma_request_num_blocks(engine.handle(), r, &num_blocks), "tagma_request_num_blocks");
  CHECK_EQ(num_blocks, 14);
}

TEST(request_ranges_copies_up_to_capacity_and_reports_the_total) {
  TestEngine engine(41);
  carve_holes(engine);
  const uint64_t r = engine.new_request();
  engine.append(r, 14);
  std::vector<int32_t> out(9, -7);
  int64_t total = 0;
  require_ok(tagma_request_ranges(engine.handle(), r, out.data(), 2, &total), "tagma_request_ranges");
  CHECK_EQ(total, 3);
  CHECK_EQ(out, (std::vector<int32_t>{6, 8, 0, 16, 5, 8, -7, -7, -7}));
  require_ok(tagma_request_ranges(engine.handle(), r, nullptr, 0, &total), "tagma_request_ranges");
  CHECK_EQ(total, 3);
}
