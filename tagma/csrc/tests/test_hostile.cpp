// Hostile values through the C ABI: huge counts and growth hints, out-of-range enums. Each case is a bug a
// differential fuzz found (signed overflow, a silently wrapped value, an engine broken by a bad argument);
// every call must end in a typed status or in the documented behaviour, never in undefined behaviour.
#include <cstdint>
#include <limits>
#include <vector>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::Pairs;
using test::require_ok;
using test::TestEngine;

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

Pairs append_runs(TestEngine& engine, uint64_t request, int64_t count, int64_t hint) {
  std::vector<int32_t> runs(static_cast<size_t>(2 * count), -1);
  int64_t num_runs = -1;
  REQUIRE_EQ(tagma_request_append_runs(engine.handle(), request, count, hint, runs.data(), count, &num_runs),
             TAGMA_OK);
  Pairs out;
  for (int64_t i = 0; i < num_runs; ++i) out.emplace_back(runs[2 * i], runs[2 * i + 1]);
  return out;
}

tagma_status batch_one(TestEngine& engine, uint64_t& request, int64_t count, int64_t hint, Pairs* runs_out) {
  std::vector<int32_t> runs(static_cast<size_t>(2 * count), -1);
  int64_t offsets[2] = {-1, -1};
  const tagma_append_batch batch{engine.handle(), &request, &count, &hint, 1, runs.data(), count, offsets};
  const tagma_status status = tagma_append_runs_batch(&batch);
  if (status == TAGMA_OK && runs_out != nullptr) {
    for (int64_t i = offsets[0]; i < offsets[1]; ++i) runs_out->emplace_back(runs[2 * i], runs[2 * i + 1]);
  }
  return status;
}

}  // namespace

// allocate.cpp: expected_blocks * admission_percent_ overflowed int64 for a hint of 2**62 (UBSan: signed
// integer overflow), wrapped to a tiny share, and admitted a request that cannot fit.
TEST(hostile_admission_refuses_a_huge_hint) {
  for (const int64_t hint : {int64_t{100}, int64_t{1000000}, int64_t{1} << 62, kMaxInt64 / 100 + 1, kMaxInt64}) {
    for (const int32_t percent : {1, 50, 100}) {
      if (hint == 100 && percent == 1) continue;  // 4 blocks wanted: they fit in the 11 open ones
      TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
      const uint64_t r1 = engine.new_request();
      CHECK_EQ(append_runs(engine, r1, 4, 20), (Pairs{{1, 4}}));  // free [5, 32): r1 keeps 16, 11 open
      REQUIRE_EQ(tagma_engine_set_admission(engine.handle(), percent, 1), TAGMA_OK);
      const uint64_t r2 = engine.new_request();
      const test::Snapshot before = engine.snapshot();
      std::vector<int32_t> runs(8);
      int64_t num_runs = -1;
      check_error(tagma_request_append_runs(engine.handle(), r2, 4, hint, runs.data(), 4, &num_runs), TAGMA_E_NO_SPACE,
                  "tagma_request_append_runs");
      CHECK_EQ(engine.snapshot(), before);
      engine.check_invariants();
    }
  }
}

// allocate.cpp: num_blocks() + max(hint, count) overflowed int64 for a hint near INT64_MAX on a request that
// holds blocks; the wrapped (negative) expectation dropped the request's reservation.
TEST(hostile_append_runs_hint_near_int64_max_is_an_unbounded_reservation) {
  for (const int64_t hint : {kMaxInt64, kMaxInt64 - 4, int64_t{1} << 62, int64_t{1000}}) {
    TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
    const uint64_t r1 = engine.new_request();
    CHECK_EQ(append_runs(engine, r1, 4, 20), (Pairs{{1, 4}}));
    CHECK_EQ(append_runs(engine, r1, 1, hint), (Pairs{{5, 1}}));  // r1 now expects more than the pool
    const uint64_t r2 = engine.new_request();
    // The whole free range [6, 32) is r1's: r2 cuts from its far end.
    CHECK_EQ(append_runs(engine, r2, 3, 3), (Pairs{{29, 3}}));
    engine.check_invariants();
  }
}

// batch.cpp: first + max(hint, counts[i]) overflowed int64 the same way.
TEST(hostile_batch_hint_near_int64_max_is_an_unbounded_reservation) {
  for (const int64_t hint : {kMaxInt64, kMaxInt64 - 4, int64_t{1} << 62}) {
    TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
    uint64_t r1 = 0;
    Pairs runs;
    REQUIRE_EQ(batch_one(engine, r1, 4, 20, &runs), TAGMA_OK);
    engine.adopt(r1);
    CHECK_EQ(runs, (Pairs{{1, 4}}));
    runs.clear();
    REQUIRE_EQ(batch_one(engine, r1, 1, hint, &runs), TAGMA_OK);
    CHECK_EQ(runs, (Pairs{{5, 1}}));
    uint64_t r2 = 0;
    runs.clear();
    REQUIRE_EQ(batch_one(engine, r2, 3, 3, &runs), TAGMA_OK);
    engine.adopt(r2);
    CHECK_EQ(runs, (Pairs{{29, 3}}));
    engine.check_invariants();
  }
}

// allocate.cpp: append_runs sized its scratch buffer by `count` before checking that the count fits, so a
// huge count (with a matching claimed capacity) threw length_error/bad_alloc: TAGMA_E_INTERNAL and a broken
// engine (under ASan: an allocation-size-too-big abort). It is TAGMA_E_NO_SPACE, changing nothing.
TEST(hostile_append_runs_huge_count_is_no_space) {
  for (const int64_t count : {kMaxInt64, int64_t{1} << 60, int64_t{1} << 40, int64_t{32}}) {
    for (const int64_t hint : {int64_t{0}, kMaxInt64}) {
      TestEngine engine(32, 1, TAGMA_POLICY_RESERVE);
      const uint64_t r = engine.new_request();
      engine.append(r, 2);
      const test::Snapshot before = engine.snapshot();
      int32_t runs[2] = {-1, -1};
      int64_t num_runs = -1;
      check_error(tagma_request_append_runs(engine.handle(), r, count, hint, runs, count, &num_runs), TAGMA_E_NO_SPACE,
                  "tagma_request_append_runs");
      CHECK_EQ(engine.snapshot(), before);
      CHECK_EQ(append_runs(engine, r, 1, 0), (Pairs{{3, 1}}));  // not broken
      engine.check_invariants();
    }
  }
}

// Out-of-range enum values are refused, never truncated or taken modulo anything.
TEST(hostile_enum_values_are_range_checked) {
  tagma_engine_handle h = 0;
  for (const int32_t policy : {-1, 4, 1 << 30, std::numeric_limits<int32_t>::min()}) {
    check_error(tagma_engine_create(32, 1, policy, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  }
  TestEngine engine(32);
  for (const int32_t policy : {-1, 4, std::numeric_limits<int32_t>::max()}) {
    check_error(tagma_engine_set_policy(engine.handle(), policy), TAGMA_E_INVALID_ARG, "tagma_engine_set_policy");
  }
  for (const int32_t mode : {-1, 2, std::numeric_limits<int32_t>::max()}) {
    check_error(tagma_prefix_enable(engine.handle(), 4, mode), TAGMA_E_INVALID_ARG, "tagma_prefix_enable");
  }
  require_ok(tagma_prefix_enable(engine.handle(), 4, TAGMA_EVICT_LRU), "tagma_prefix_enable");
  for (const int32_t mode : {-1, 2, std::numeric_limits<int32_t>::min()}) {
    check_error(tagma_prefix_set_eviction_mode(engine.handle(), mode), TAGMA_E_INVALID_ARG,
                "tagma_prefix_set_eviction_mode");
  }
  tagma_prefix_stats stats{};
  require_ok(tagma_prefix_stats_get(engine.handle(), &stats), "tagma_prefix_stats_get");
  CHECK_EQ(stats.eviction_mode, int64_t{TAGMA_EVICT_LRU});
  for (const int32_t percent : {-1, 101, std::numeric_limits<int32_t>::max()}) {
    check_error(tagma_engine_set_admission(engine.handle(), percent, 1), TAGMA_E_INVALID_ARG,
                "tagma_engine_set_admission");
  }
  check_error(tagma_engine_set_admission(engine.handle(), 50, std::numeric_limits<int32_t>::min()),
              TAGMA_E_INVALID_ARG, "tagma_engine_set_admission");
}

// Ids and indices: huge, stale and released values are typed errors, never wrapped onto a live one.
TEST(hostile_ids_and_indices_are_validated) {
  TestEngine engine(32);
  const uint64_t r = engine.new_request();
  engine.append(r, 3);
  const uint64_t gone = engine.new_request();
  engine.release(gone);
  int32_t block = -1;
  int64_t n = -1;
  for (const uint64_t bad : {uint64_t{0}, gone, r + (uint64_t{1} << 32), ~uint64_t{0}}) {
    check_error(tagma_request_release(engine.handle(), bad), TAGMA_E_NOT_FOUND, "tagma_request_release");
    check_error(tagma_request_block(engine.handle(), bad, 0, &block), TAGMA_E_NOT_FOUND, "tagma_request_block");
    check_error(tagma_request_num_blocks(engine.handle(), bad, &n), TAGMA_E_NOT_FOUND, "tagma_request_num_blocks");
  }
  for (const int64_t logical : {int64_t{-1}, int64_t{3}, int64_t{1} << 32, kMaxInt64,
                                std::numeric_limits<int64_t>::min()}) {
    check_error(tagma_request_block(engine.handle(), r, logical, &block), TAGMA_E_OUT_OF_RANGE, "tagma_request_block");
  }
  int32_t out[4] = {};
  check_error(tagma_request_blocks(engine.handle(), r, kMaxInt64, 1, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  check_error(tagma_request_blocks(engine.handle(), r, 1, kMaxInt64, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  check_error(tagma_request_blocks(engine.handle(), r, std::numeric_limits<int64_t>::min(), 2, out),
              TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  engine.check_invariants();
}
