// tagma_append_runs_batch: one crossing for a step's appends, placed exactly as the one-by-one calls.
#include <algorithm>
#include <random>
#include <vector>

#include "helpers.h"
#include "test_runner.h"

using test::Pairs;
using test::TestEngine;

namespace {

struct Entry {
  uint64_t request;  // 0: a new request
  int64_t count;
  int64_t hint;
};

struct BatchResult {
  tagma_status status;
  std::vector<uint64_t> requests;  // after the call (new ids written back)
  std::vector<Pairs> runs;         // per entry
};

BatchResult run_batch(TestEngine& engine, const std::vector<Entry>& entries, bool with_hints = true,
                      int64_t capacity = -1) {
  const auto n = static_cast<int64_t>(entries.size());
  BatchResult result;
  std::vector<int64_t> counts;
  std::vector<int64_t> hints;
  int64_t total = 0;
  for (const Entry& e : entries) {
    result.requests.push_back(e.request);
    counts.push_back(e.count);
    hints.push_back(e.hint);
    total += std::max<int64_t>(e.count, 0);
  }
  if (capacity < 0) capacity = total;
  std::vector<int32_t> runs(static_cast<size_t>(2 * std::max<int64_t>(capacity, 1)), -1);
  std::vector<int64_t> offsets(static_cast<size_t>(n + 1), -1);
  tagma_append_batch batch{engine.handle(),  result.requests.data(), counts.data(), with_hints ? hints.data() : nullptr,
                           n,                runs.data(),            capacity,      offsets.data()};
  result.status = tagma_append_runs_batch(&batch);
  if (result.status != TAGMA_OK) return result;
  CHECK_EQ(offsets[0], 0);
  for (int64_t i = 0; i < n; ++i) {
    Pairs pairs;
    for (int64_t k = offsets[static_cast<size_t>(i)]; k < offsets[static_cast<size_t>(i + 1)]; ++k) {
      pairs.emplace_back(runs[static_cast<size_t>(2 * k)], runs[static_cast<size_t>(2 * k + 1)]);
    }
    result.runs.push_back(pairs);
  }
  for (const uint64_t request : result.requests) engine.adopt(request);
  return result;
}

Pairs append_runs_one(TestEngine& engine, uint64_t request, int64_t count, int64_t hint) {
  std::vector<int32_t> runs(static_cast<size_t>(2 * count), -1);
  int64_t num_runs = -1;
  test::require_ok(tagma_request_append_runs(engine.handle(), request, count, hint, runs.data(), count, &num_runs),
                   "tagma_request_append_runs");
  Pairs out;
  for (int64_t i = 0; i < num_runs; ++i) out.emplace_back(runs[2 * i], runs[2 * i + 1]);
  return out;
}

std::vector<int32_t> expand(const Pairs& runs) {
  std::vector<int32_t> ids;
  for (const auto& [start, count] : runs) {
    for (int32_t b = start; b < start + count; ++b) ids.push_back(b);
  }
  return ids;
}

// Drives two engines with the same random steps: `batched` through one tagma_append_runs_batch per step,
// `single` through tagma_request_create + tagma_request_append_runs per entry. Everything must agree.
void compare_with_one_by_one(int64_t num_blocks, int64_t align, int32_t policy, uint64_t seed, int steps) {
  TestEngine batched(num_blocks, align, policy);
  TestEngine single(num_blocks, align, policy);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> live;  // the same ids on both engines (ids are assigned in creation order)
  for (int step = 0; step < steps; ++step) {
    // Finished requests leave between steps (as the scheduler frees them in update_from_output).
    for (size_t k = 0; k < live.size();) {
      if (rng() % 4 == 0) {
        batched.release(live[k]);
        single.release(live[k]);
        live[k] = live.back();
        live.pop_back();
      } else {
        ++k;
      }
    }
    const tagma_stats before = batched.stats();
    int64_t room = before.free_blocks / align;  // aligned units still free
    std::vector<Entry> entries;
    const int wanted = static_cast<int>(rng() % 6);
    for (int k = 0; k < wanted && room > 0; ++k) {
      const int64_t units = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(std::min<int64_t>(room, 12)));
      const bool fresh = live.empty() || rng() % 3 == 0;
      const uint64_t request = fresh ? 0 : live[rng() % live.size()];  // may repeat an earlier entry's request
      entries.push_back(Entry{request, units * align, static_cast<int64_t>(rng() % 3) * 8});
      room -= units;
    }
    const BatchResult result = run_batch(batched, entries);
    REQUIRE_EQ(result.status, TAGMA_OK);
    for (size_t i = 0; i < entries.size(); ++i) {
      uint64_t request = entries[i].request;
      if (request == 0) {
        request = single.new_request();
        live.push_back(request);
      }
      CHECK_EQ(result.requests[i], request);
      const Pairs expected = append_runs_one(single, request, entries[i].count, entries[i].hint);
      CHECK_EQ(result.runs[i], expected);
    }
    REQUIRE(batched.snapshot() == single.snapshot());
    for (const uint64_t request : live) CHECK_EQ(batched.ranges(request), single.ranges(request));
  }
  batched.check_invariants();
  single.check_invariants();
}

}  // namespace

TEST(append_batch_places_exactly_as_append_runs_one_by_one) {
  for (const int32_t policy : {TAGMA_POLICY_FIRST_FIT, TAGMA_POLICY_BEST_FIT, TAGMA_POLICY_HEADROOM}) {
    compare_with_one_by_one(200, 1, policy, 7 + static_cast<uint64_t>(policy), 300);
    compare_with_one_by_one(256, 4, policy, 11 + static_cast<uint64_t>(policy), 200);
  }
}

TEST(append_batch_reports_each_entry_as_runs_in_logical_order) {
  TestEngine engine(32);
  const uint64_t r1 = engine.new_request();
  const uint64_t r2 = engine.new_request();
  // r1 takes 4, r2 2 after it, r1 grows by 3 (a new range), then in place by 1; a new request takes 5.
  const BatchResult result = run_batch(engine, {{r1, 4, 0}, {r2, 2, 0}, {r1, 3, 0}, {r1, 1, 0}, {0, 5, 0}});
  REQUIRE_EQ(result.status, TAGMA_OK);
  CHECK_EQ(result.runs[0], (Pairs{{1, 4}}));
  CHECK_EQ(result.runs[1], (Pairs{{5, 2}}));
  CHECK_EQ(result.runs[2], (Pairs{{7, 3}}));
  CHECK_EQ(result.runs[3], (Pairs{{10, 1}}));
  CHECK_EQ(result.runs[4], (Pairs{{11, 5}}));
  CHECK_EQ(result.requests[0], r1);
  CHECK(result.requests[4] != 0 && result.requests[4] != r1 && result.requests[4] != r2);
  CHECK_EQ(engine.blocks(r1), (std::vector<int32_t>{1, 2, 3, 4, 7, 8, 9, 10}));
  CHECK_EQ(engine.blocks(result.requests[4]), expand(result.runs[4]));
  engine.check_invariants();
}

TEST(append_batch_splits_a_fragmented_append_into_its_pieces) {
  TestEngine engine(16);
  std::vector<uint64_t> requests;
  for (int i = 0; i < 5; ++i) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), 3);
  }
  engine.release(requests[1]);
  engine.release(requests[3]);
  engine.release(requests[4]);  // free: {4:3} {10:6}
  const BatchResult result = run_batch(engine, {{requests[0], 2, 0}, {0, 7, 0}});
  REQUIRE_EQ(result.status, TAGMA_OK);
  CHECK_EQ(result.runs[0], (Pairs{{4, 2}}));            // requests[0] ends at 4: in place
  CHECK_EQ(result.runs[1], (Pairs{{10, 6}, {6, 1}}));   // no free range holds 7: largest first
  CHECK_EQ(engine.blocks(result.requests[1]), expand(result.runs[1]));
  engine.check_invariants();
}

TEST(append_batch_of_no_entries_writes_the_first_offset_only) {
  TestEngine engine(8);
  const test::Snapshot before = engine.snapshot();
  int64_t offset = -1;
  tagma_append_batch batch{engine.handle(), nullptr, nullptr, nullptr, 0, nullptr, 0, &offset};
  CHECK_EQ(tagma_append_runs_batch(&batch), TAGMA_OK);
  CHECK_EQ(offset, 0);
  CHECK(engine.snapshot() == before);
}

TEST(append_batch_validates_every_entry_before_changing_anything) {
  TestEngine engine(16, 1, TAGMA_POLICY_FIRST_FIT);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);
  const test::Snapshot before = engine.snapshot();
  const char* name = "tagma_append_runs_batch";

  test::check_error(tagma_append_runs_batch(nullptr), TAGMA_E_INVALID_ARG, name);
  // Each bad batch starts with a valid entry that creates a request: it must not be created either.
  CHECK_EQ(run_batch(engine, {{0, 2, 0}, {r, 0, 0}}).status, TAGMA_E_INVALID_ARG);
  CHECK_EQ(run_batch(engine, {{0, 2, 0}, {r, -3, 0}}).status, TAGMA_E_INVALID_ARG);
  CHECK_EQ(run_batch(engine, {{0, 2, 0}, {r, 1, -1}}).status, TAGMA_E_INVALID_ARG);
  const BatchResult unknown = run_batch(engine, {{0, 2, 0}, {r + 99, 1, 0}});
  test::check_error(unknown.status, TAGMA_E_NOT_FOUND, name);
  CHECK_EQ(unknown.requests[0], uint64_t{0});  // not written back
  CHECK_EQ(run_batch(engine, {{0, 2, 0}, {r, 3, 0}}, true, 4).status, TAGMA_E_INVALID_ARG);  // capacity < 5
  test::check_error(run_batch(engine, {{0, 8, 0}, {r, 6, 0}}).status, TAGMA_E_NO_SPACE, name);  // 14 > 13 free
  CHECK(engine.snapshot() == before);

  std::vector<uint64_t> requests{0};
  std::vector<int64_t> counts{1};
  std::vector<int32_t> runs(2);
  std::vector<int64_t> offsets(2);
  tagma_append_batch batch{engine.handle(), requests.data(), counts.data(), nullptr, 1, runs.data(), 1, offsets.data()};
  batch.num_requests = -1;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_ARG, name);
  batch.num_requests = 1;
  batch.run_offsets = nullptr;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_ARG, name);
  batch.run_offsets = offsets.data();
  batch.runs_out = nullptr;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_ARG, name);
  batch.runs_out = runs.data();
  batch.counts = nullptr;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_ARG, name);
  batch.counts = counts.data();
  batch.requests = nullptr;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_ARG, name);
  batch.requests = requests.data();
  batch.engine = engine.handle() + 1000;
  test::check_error(tagma_append_runs_batch(&batch), TAGMA_E_INVALID_HANDLE, name);
  CHECK(engine.snapshot() == before);

  // The next request id is the one a failed batch would have created: nothing was created.
  const BatchResult ok = run_batch(engine, {{0, 2, 0}});
  REQUIRE_EQ(ok.status, TAGMA_OK);
  CHECK_EQ(ok.requests[0], r + 1);
  engine.check_invariants();
}

TEST(append_batch_never_evicts) {
  TestEngine engine(16);
  const uint64_t owner = engine.new_request();
  const std::vector<int32_t> owned = engine.append(owner, 10);
  engine.mark(owned);
  engine.release(owner);  // 10 cache-only, 5 free
  const uint64_t r = engine.new_request();
  const test::Snapshot cached = engine.snapshot();
  test::check_error(run_batch(engine, {{r, 3, 0}, {0, 3, 0}}).status, TAGMA_E_STATE, "tagma_append_runs_batch");
  CHECK(engine.snapshot() == cached);
  const BatchResult fits = run_batch(engine, {{r, 3, 0}, {0, 2, 0}});
  REQUIRE_EQ(fits.status, TAGMA_OK);
  CHECK_EQ(engine.lru().size(), size_t{10});
  engine.check_invariants();
}

TEST(append_batch_misaligned_count_changes_nothing) {
  TestEngine engine(32, 4);
  const test::Snapshot before = engine.snapshot();
  test::check_error(run_batch(engine, {{0, 4, 0}, {0, 6, 0}}).status, TAGMA_E_MISALIGNED, "tagma_append_runs_batch");
  CHECK(engine.snapshot() == before);
  const BatchResult ok = run_batch(engine, {{0, 4, 0}, {0, 8, 0}});
  REQUIRE_EQ(ok.status, TAGMA_OK);
  CHECK_EQ(ok.runs[0], (Pairs{{4, 4}}));
  CHECK_EQ(ok.runs[1], (Pairs{{8, 8}}));
  engine.check_invariants();
}
