// tagma_request_append_runs: the same placement as tagma_request_append, reported as runs.
#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::RangeTriple;
using test::TestEngine;

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
