// tagma_request_append_runs: the same placement as tagma_request_append, reported as runs.
#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::RangeTriple;
using test::TestEngine;
using test::check_error;

namespace {

Pairs append_runs(TestEngine& engine, uint64_t request, int64_t count, int64_t hint = 0) {
  std::vector<int32_t> runs(static_cast<size_t>(2 * count), -1);
  int64_t num_runs = -1;
  const tagma_status status =
      tagma_request_append_runs(engine.handle(), request, count, hint, runs.data(), count, &num_runs);
  REQUIRE_EQ(status, TAGMA_OK);
  Pairs out;
  for (int64_t i = 0; i < num_runs; ++i) out.emplace_back(runs[2 * i], runs[2 * i + 1]);
  return out;
}

}  // namespace

TEST(append_runs_reports_in_place_growth_and_new_ranges_as_runs) {
  TestEngine engine(32);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  CHECK_EQ(append_runs(engine, r1, 4), (Pairs{{1, 4}}));
  CHECK_EQ(append_runs(engine, r2, 2), (Pairs{{5, 2}}));
  CHECK_EQ(append_runs(engine, r1, 3), (Pairs{{7, 3}}));
  CHECK_EQ(engine.ranges(r1), (std::vector<RangeTriple>{{1, 4, 0}, {7, 3, 4}}));
  CHECK_EQ(append_runs(engine, r1, 1), (Pairs{{10, 1}}));  // in place
  engine.check_invariants();
}

TEST(append_runs_of_a_fragmented_pool_lists_every_piece) {
  TestEngine engine(16);
  std::vector<uint64_t> requests;
  for (int i = 0; i < 5; ++i) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), 3);
  }
  engine.release(requests[1]);
  engine.release(requests[3]);
  engine.release(requests[4]);  // free: {4:3} {10:6}
  const uint64_t r = engine.new_request();
  const Pairs runs = append_runs(engine, r, 9);  // no free range holds 9: largest pieces first
  CHECK_EQ(runs, (Pairs{{10, 6}, {4, 3}}));
  std::vector<int32_t> ids;
  for (const auto& [start, count] : runs) {
    for (int32_t b = start; b < start + count; ++b) ids.push_back(b);
  }
  CHECK_EQ(engine.blocks(r), ids);
  engine.check_invariants();
}

TEST(append_runs_validates_before_changing_anything) {
  TestEngine engine(16);
  const uint64_t r = engine.new_request();
  std::vector<int32_t> runs(64);
  int64_t num_runs = 0;
  const test::Snapshot before = engine.snapshot();
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, 0, runs.data(), 3, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 0, 0, runs.data(), 3, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, 0, nullptr, 4, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, 0, runs.data(), 4, nullptr), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r + 99, 4, 0, runs.data(), 4, &num_runs), TAGMA_E_NOT_FOUND);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 16, 0, runs.data(), 16, &num_runs), TAGMA_E_NO_SPACE);
  CHECK(engine.snapshot() == before);
  // Eviction would be needed: refused, the cache-only blocks stay.
  const uint64_t owner = engine.new_request();
  const std::vector<int32_t> owned = engine.append(owner, 10);
  engine.mark(owned);
  engine.release(owner);
  const test::Snapshot cached = engine.snapshot();
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 8, 0, runs.data(), 8, &num_runs), TAGMA_E_STATE);
  CHECK(engine.snapshot() == cached);
  CHECK_EQ(append_runs(engine, r, 5), (Pairs{{11, 5}}));  // fits in the free blocks: fine
  engine.check_invariants();
}

TEST(append_runs_with_a_hint_places_where_the_whole_hint_fits) {
  TestEngine engine(64, 1, TAGMA_POLICY_HEADROOM);
  std::vector<uint64_t> requests;
  for (const int64_t count : {10, 6, 10, 20, 10}) {  // first fit: [1,11) [11,17) [17,27) [27,47) [47,57)
    requests.push_back(engine.new_request());
    engine.set_policy(TAGMA_POLICY_FIRST_FIT);
    engine.append(requests.back(), count);
  }
  engine.set_policy(TAGMA_POLICY_HEADROOM);
  engine.release(requests[1]);  // free: {11:6}
  engine.release(requests[3]);  // free: {11:6} {27:20} {57:7}
  CHECK_EQ(engine.free_ranges(), (Pairs{{11, 6}, {27, 20}, {57, 7}}));
  // Without a hint, headroom takes the largest free range: the middle of {27:20}.
  const uint64_t plain = engine.new_request();
  CHECK_EQ(append_runs(engine, plain, 2), (Pairs{{36, 2}}));
  engine.release(plain);
  // Expecting 7 blocks in all: the smallest range that holds 7 is {57:7}; later appends grow in place.
  const uint64_t hinted = engine.new_request();
  CHECK_EQ(append_runs(engine, hinted, 2, 7), (Pairs{{57, 2}}));
  CHECK_EQ(append_runs(engine, hinted, 5, 5), (Pairs{{59, 5}}));
  CHECK_EQ(engine.ranges(hinted), (std::vector<RangeTriple>{{57, 7, 0}}));
  // A hint no free range holds: placed by the policy as without one.
  const uint64_t big = engine.new_request();
  CHECK_EQ(append_runs(engine, big, 2, 40), (Pairs{{36, 2}}));
  int64_t num_runs = 0;
  std::vector<int32_t> runs(8);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), big, 1, -1, runs.data(), 4, &num_runs), TAGMA_E_INVALID_ARG);
  engine.check_invariants();
}

TEST(reserve_keeps_the_left_neighbours_expected_growth_free) {
  TestEngine engine(64, 1, TAGMA_POLICY_RESERVE);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  CHECK_EQ(append_runs(engine, r1, 4, 20), (Pairs{{1, 4}}));  // expects 20 in all: [1, 21) is kept for it
  CHECK_EQ(append_runs(engine, r2, 3, 10), (Pairs{{21, 3}}));  // right after r1's reservation
  CHECK_EQ(append_runs(engine, r1, 16), (Pairs{{5, 16}}));  // grows in place to its expected size
  CHECK_EQ(append_runs(engine, r2, 7), (Pairs{{24, 7}}));
  CHECK_EQ(engine.ranges(r1), (std::vector<RangeTriple>{{1, 20, 0}}));
  CHECK_EQ(engine.ranges(r2), (std::vector<RangeTriple>{{21, 10, 0}}));
  // Without a hint a request expects only what it asks for: the smallest open part that holds it.
  engine.release(r1);  // free: {1:20} {31:33}
  const uint64_t r3 = engine.new_request();
  CHECK_EQ(append_runs(engine, r3, 5), (Pairs{{1, 5}}));
  engine.check_invariants();
}

TEST(reserve_cuts_into_a_reservation_from_its_far_end_when_nothing_else_fits) {
  TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
  const uint64_t r1 = engine.new_request();
  CHECK_EQ(append_runs(engine, r1, 4, 31), (Pairs{{1, 4}}));  // the whole pool is r1's reservation
  const uint64_t r2 = engine.new_request();
  CHECK_EQ(append_runs(engine, r2, 3, 3), (Pairs{{29, 3}}));  // r1 keeps [5, 29)
  CHECK_EQ(engine.free_ranges(), (Pairs{{5, 24}}));
  engine.check_invariants();
}

TEST(reserve_admission_waits_for_room_clear_of_reservations) {
  TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
  const uint64_t r1 = engine.new_request();
  CHECK_EQ(append_runs(engine, r1, 4, 20), (Pairs{{1, 4}}));
  REQUIRE_EQ(tagma_engine_set_admission(engine.handle(), 100, 1), TAGMA_OK);
  const uint64_t r2 = engine.new_request();
  const test::Snapshot before = engine.snapshot();
  std::vector<int32_t> runs(8);
  int64_t num_runs = -1;
  // Free [5, 32): r1 keeps 16 of it, 11 are open; r2 expects 20.
  check_error(tagma_request_append_runs(engine.handle(), r2, 4, 20, runs.data(), 4, &num_runs), TAGMA_E_NO_SPACE,
              "tagma_request_append_runs");
  CHECK_EQ(engine.snapshot(), before);
  // Half of the hint must fit: 10 <= 11.
  REQUIRE_EQ(tagma_engine_set_admission(engine.handle(), 50, 1), TAGMA_OK);
  CHECK_EQ(append_runs(engine, r2, 4, 20), (Pairs{{21, 4}}));
  // A request that already holds blocks is never refused by admission.
  REQUIRE_EQ(tagma_engine_set_admission(engine.handle(), 100, 1), TAGMA_OK);
  CHECK_EQ(append_runs(engine, r2, 1, 30), (Pairs{{25, 1}}));
  engine.check_invariants();
}

TEST(reserve_admission_in_pieces_and_on_an_empty_pool) {
  TestEngine engine(40, 1, TAGMA_POLICY_RESERVE);
  REQUIRE_EQ(tagma_engine_set_admission(engine.handle(), 100, 2), TAGMA_OK);
  std::vector<uint64_t> held;
  for (const int64_t count : {8, 6, 8, 6, 11}) {  // [1,9) [9,15) [15,23) [23,29) [29,40)
    held.push_back(engine.new_request());
    CHECK_EQ(append_runs(engine, held.back(), count, count).size(), size_t{1});
  }
  engine.release(held[1]);
  engine.release(held[3]);  // free: {9:6} {23:6}, nobody expects more
  const uint64_t r = engine.new_request();
  CHECK_EQ(append_runs(engine, r, 4, 12), (Pairs{{9, 4}}));  // 6 + 6 >= 12 in two pieces
  const uint64_t r2 = engine.new_request();
  std::vector<int32_t> runs(8);
  int64_t num_runs = -1;
  // Left: {13:2} kept for r, {23:6} open; 6 < 7.
  check_error(tagma_request_append_runs(engine.handle(), r2, 1, 7, runs.data(), 1, &num_runs), TAGMA_E_NO_SPACE,
              "tagma_request_append_runs");
  for (const uint64_t id : {held[0], held[2], held[4], r}) engine.release(id);
  // An empty pool admits a hint larger than the pool.
  CHECK_EQ(append_runs(engine, r2, 3, 1000), (Pairs{{1, 3}}));
  check_error(tagma_engine_set_admission(engine.handle(), 101, 1), TAGMA_E_INVALID_ARG, "tagma_engine_set_admission");
  check_error(tagma_engine_set_admission(engine.handle(), 50, 0), TAGMA_E_INVALID_ARG, "tagma_engine_set_admission");
  engine.check_invariants();
}

TEST(reserve_after_a_policy_switch_sees_the_requests_already_live) {
  TestEngine engine(64, 1, TAGMA_POLICY_FIRST_FIT);
  const uint64_t r1 = engine.new_request();
  CHECK_EQ(append_runs(engine, r1, 4, 20), (Pairs{{1, 4}}));  // the hint is remembered under any policy
  engine.set_policy(TAGMA_POLICY_RESERVE);
  const uint64_t r2 = engine.new_request();
  CHECK_EQ(append_runs(engine, r2, 3, 10), (Pairs{{21, 3}}));
  engine.set_policy(TAGMA_POLICY_FIRST_FIT);
  CHECK_EQ(append_runs(engine, r1, 2), (Pairs{{5, 2}}));
  engine.set_policy(TAGMA_POLICY_RESERVE);  // r1's last range now ends at 7, 14 blocks still expected
  const uint64_t r3 = engine.new_request();
  engine.release(r2);  // free: {7:57}
  CHECK_EQ(append_runs(engine, r3, 2, 2), (Pairs{{21, 2}}));
  engine.check_invariants();
}
