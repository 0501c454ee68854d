// tagma_request_append_runs: the same placement as tagma_request_append, reported as runs.
#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::RangeTriple;
using test::TestEngine;

namespace {

Pairs append_runs(TestEngine& engine, uint64_t request, int64_t count) {
  std::vector<int32_t> runs(static_cast<size_t>(2 * count), -1);
  int64_t num_runs = -1;
  const tagma_status status =
      tagma_request_append_runs(engine.handle(), request, count, runs.data(), count, &num_runs);
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
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, runs.data(), 3, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 0, runs.data(), 3, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, nullptr, 4, &num_runs), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 4, runs.data(), 4, nullptr), TAGMA_E_INVALID_ARG);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r + 99, 4, runs.data(), 4, &num_runs), TAGMA_E_NOT_FOUND);
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 16, runs.data(), 16, &num_runs), TAGMA_E_NO_SPACE);
  CHECK(engine.snapshot() == before);
  // Eviction would be needed: refused, the cache-only blocks stay.
  const uint64_t owner = engine.new_request();
  const std::vector<int32_t> owned = engine.append(owner, 10);
  engine.mark(owned);
  engine.release(owner);
  const test::Snapshot cached = engine.snapshot();
  CHECK_EQ(tagma_request_append_runs(engine.handle(), r, 8, runs.data(), 8, &num_runs), TAGMA_E_STATE);
  CHECK(engine.snapshot() == cached);
  CHECK_EQ(append_runs(engine, r, 5), (Pairs{{11, 5}}));  // fits in the free blocks: fine
  engine.check_invariants();
}
