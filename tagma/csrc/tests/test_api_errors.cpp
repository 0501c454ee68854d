// Every error path of the engine ABI: status, message, and an unchanged engine afterwards.
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <thread>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::require_ok;
using test::Snapshot;
using test::TestEngine;

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// An engine (33 blocks, first fit) with live, shared, cached and released requests:
//   r1 holds [1, 7), r2 holds {1, 2} (shared) then [7, 11); blocks [11, 14) were released while cached.
struct Fixture {
  TestEngine engine{33};
  uint64_t r1 = 0;
  uint64_t r2 = 0;
  uint64_t released = 0;

  Fixture() {
    r1 = engine.new_request();
    r2 = engine.new_request();
    released = engine.new_request();
    engine.append(r1, 6);
    engine.attach(r2, {1, 2});
    engine.append(r2, 4);
    engine.append(released, 3);
    engine.mark({11, 12, 13, 3});
    engine.release(released);
  }
  tagma_engine_handle h() const { return engine.handle(); }
};

void check_message(const std::string& expected) { CHECK_EQ(std::string(tagma_last_error()), expected); }

}  // namespace

TEST(errors_fixture_is_consistent) {
  Fixture f;
  f.engine.check_invariants();
  CHECK_EQ(f.engine.lru(), (std::vector<int32_t>{13, 12, 11}));
  CHECK_EQ(f.engine.req_refs()[1], 2);
}

TEST(errors_unknown_handle_on_every_engine_function) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  int32_t i32[8] = {};
  int64_t i64[8] = {};
  uint64_t u64 = 0;
  tagma_stats stats{};
  const int32_t blocks[1] = {1};
  for (const tagma_engine_handle bad : {tagma_engine_handle{0}, f.h() + 1000, ~tagma_engine_handle{0}}) {
    check_error(tagma_engine_destroy(bad), TAGMA_E_INVALID_HANDLE, "tagma_engine_destroy");
    check_error(tagma_engine_set_policy(bad, 0), TAGMA_E_INVALID_HANDLE, "tagma_engine_set_policy");
    check_error(tagma_engine_stats(bad, &stats), TAGMA_E_INVALID_HANDLE, "tagma_engine_stats");
    check_error(tagma_request_create(bad, &u64), TAGMA_E_INVALID_HANDLE, "tagma_request_create");
    check_error(tagma_request_release(bad, f.r1), TAGMA_E_INVALID_HANDLE, "tagma_request_release");
    check_error(tagma_request_free_front(bad, f.r1, 1), TAGMA_E_INVALID_HANDLE, "tagma_request_free_front");
    check_error(tagma_request_append(bad, f.r1, 1, i32, i32, i64), TAGMA_E_INVALID_HANDLE, "tagma_request_append");
    check_error(tagma_request_attach(bad, f.r1, blocks, 1), TAGMA_E_INVALID_HANDLE, "tagma_request_attach");
    check_error(tagma_request_num_blocks(bad, f.r1, i64), TAGMA_E_INVALID_HANDLE, "tagma_request_num_blocks");
    check_error(tagma_request_num_ranges(bad, f.r1, i64), TAGMA_E_INVALID_HANDLE, "tagma_request_num_ranges");
    check_error(tagma_request_ranges(bad, f.r1, i32, 1, i64), TAGMA_E_INVALID_HANDLE, "tagma_request_ranges");
    check_error(tagma_request_block(bad, f.r1, 0, i32), TAGMA_E_INVALID_HANDLE, "tagma_request_block");
    check_error(tagma_request_blocks(bad, f.r1, 0, 1, i32), TAGMA_E_INVALID_HANDLE, "tagma_request_blocks");
    check_error(tagma_cache_mark(bad, blocks, 1), TAGMA_E_INVALID_HANDLE, "tagma_cache_mark");
    check_error(tagma_cache_unmark(bad, blocks, 1), TAGMA_E_INVALID_HANDLE, "tagma_cache_unmark");
    check_error(tagma_cache_evict(bad, 1, i32, i64), TAGMA_E_INVALID_HANDLE, "tagma_cache_evict");
    check_error(tagma_cache_clear(bad, i64), TAGMA_E_INVALID_HANDLE, "tagma_cache_clear");
    check_error(tagma_block_state(bad, nullptr, nullptr, 100), TAGMA_E_INVALID_HANDLE, "tagma_block_state");
    check_error(tagma_free_ranges(bad, i32, 1, i64), TAGMA_E_INVALID_HANDLE, "tagma_free_ranges");
    check_error(tagma_lru_order(bad, i32, 1, i64), TAGMA_E_INVALID_HANDLE, "tagma_lru_order");
    check_error(tagma_ranges_histogram(bad, i64, 1), TAGMA_E_INVALID_HANDLE, "tagma_ranges_histogram");
  }
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_destroyed_handles_are_invalid_and_never_reused) {
  tagma_engine_handle first = 0;
  require_ok(tagma_engine_create(8, 1, TAGMA_POLICY_FIRST_FIT, &first), "create");
  require_ok(tagma_engine_destroy(first), "destroy");
  check_error(tagma_engine_destroy(first), TAGMA_E_INVALID_HANDLE, "tagma_engine_destroy");
  uint64_t request = 0;
  check_error(tagma_request_create(first, &request), TAGMA_E_INVALID_HANDLE, "tagma_request_create");
  check_message("tagma_request_create: engine handle " + std::to_string(first) + " is unknown or destroyed");
  tagma_engine_handle second = 0;
  require_ok(tagma_engine_create(8, 1, TAGMA_POLICY_FIRST_FIT, &second), "create");
  CHECK(second != first);
  require_ok(tagma_engine_destroy(second), "destroy");
}

TEST(errors_engine_create_arguments) {
  const tagma_engine_handle untouched = 777;
  tagma_engine_handle h = untouched;
  check_error(tagma_engine_create(1, 1, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_message("tagma_engine_create: num_blocks 1 must be >= 2");
  check_error(tagma_engine_create(-5, 1, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_error(tagma_engine_create(int64_t{1} << 31, 1, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_error(tagma_engine_create(16, 0, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_message("tagma_engine_create: align 0 must be > 0");
  check_error(tagma_engine_create(16, -2, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_error(tagma_engine_create(10, 6, 0, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");  // usable [6, 6)
  check_error(tagma_engine_create(16, 1, 4, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_error(tagma_engine_create(16, 1, -1, &h), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  check_error(tagma_engine_create(16, 1, 0, nullptr), TAGMA_E_INVALID_ARG, "tagma_engine_create");
  CHECK_EQ(h, untouched);
  require_ok(tagma_engine_create(10, 5, 0, &h), "create with one aligned chunk");  // usable [5, 10)
  tagma_stats stats{};
  require_ok(tagma_engine_stats(h, &stats), "stats");
  CHECK_EQ(stats.usable_blocks, 5);
  require_ok(tagma_engine_destroy(h), "destroy");
}

TEST(errors_set_policy_unknown) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  check_error(tagma_engine_set_policy(f.h(), 4), TAGMA_E_INVALID_ARG, "tagma_engine_set_policy");
  check_error(tagma_engine_set_policy(f.h(), -1), TAGMA_E_INVALID_ARG, "tagma_engine_set_policy");
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_unknown_or_released_request) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  int32_t i32[8] = {};
  int64_t i64[8] = {};
  const int32_t cached[1] = {11};
  for (const uint64_t bad : {f.released, uint64_t{999}, uint64_t{0}}) {
    check_error(tagma_request_release(f.h(), bad), TAGMA_E_NOT_FOUND, "tagma_request_release");
    check_error(tagma_request_append(f.h(), bad, 1, i32, i32, i64), TAGMA_E_NOT_FOUND, "tagma_request_append");
    check_error(tagma_request_attach(f.h(), bad, cached, 1), TAGMA_E_NOT_FOUND, "tagma_request_attach");
    check_error(tagma_request_num_blocks(f.h(), bad, i64), TAGMA_E_NOT_FOUND, "tagma_request_num_blocks");
    check_error(tagma_request_num_ranges(f.h(), bad, i64), TAGMA_E_NOT_FOUND, "tagma_request_num_ranges");
    check_error(tagma_request_ranges(f.h(), bad, i32, 1, i64), TAGMA_E_NOT_FOUND, "tagma_request_ranges");
    check_error(tagma_request_block(f.h(), bad, 0, i32), TAGMA_E_NOT_FOUND, "tagma_request_block");
    check_error(tagma_request_blocks(f.h(), bad, 0, 1, i32), TAGMA_E_NOT_FOUND, "tagma_request_blocks");
  }
  check_error(tagma_request_release(f.h(), 999), TAGMA_E_NOT_FOUND, "tagma_request_release");
  check_message("tagma_request_release: request 999 is unknown or released");
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_double_release) {
  Fixture f;
  f.engine.release(f.r2);
  const Snapshot before = f.engine.snapshot();
  check_error(tagma_request_release(f.h(), f.r2), TAGMA_E_NOT_FOUND, "tagma_request_release");
  CHECK_EQ(f.engine.snapshot(), before);
  CHECK_EQ(f.engine.req_refs()[1], 1);  // the shared block lost exactly one reference
}

TEST(errors_append_counts) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  int32_t out[4] = {-1, -1, -1, -1};
  int64_t num_evicted = -1;
  check_error(tagma_request_append(f.h(), f.r1, 0, out, out, &num_evicted), TAGMA_E_INVALID_ARG,
              "tagma_request_append");
  check_message("tagma_request_append: count 0 must be > 0");
  check_error(tagma_request_append(f.h(), f.r1, -4, out, out, &num_evicted), TAGMA_E_INVALID_ARG,
              "tagma_request_append");
  check_error(tagma_request_append(f.h(), f.r1, 33, out, out, &num_evicted), TAGMA_E_NO_SPACE,
              "tagma_request_append");
  check_error(tagma_request_append(f.h(), f.r1, kMaxInt64, out, out, &num_evicted), TAGMA_E_NO_SPACE,
              "tagma_request_append");
  CHECK_EQ(out[0], -1);
  CHECK_EQ(num_evicted, -1);
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_append_misaligned) {
  TestEngine engine(64, 4);
  const uint64_t r = engine.new_request();
  engine.append(r, 8);
  const Snapshot before = engine.snapshot();
  check_error(tagma_request_append(engine.handle(), r, 6, nullptr, nullptr, nullptr), TAGMA_E_MISALIGNED,
              "tagma_request_append");
  check_message("tagma_request_append: count 6 is not a multiple of align 4");
  check_error(tagma_request_append(engine.handle(), r, 1, nullptr, nullptr, nullptr), TAGMA_E_MISALIGNED,
              "tagma_request_append");
  CHECK_EQ(engine.snapshot(), before);
}

TEST(errors_attach_blocks) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  const auto attach = [&](std::vector<int32_t> blocks, tagma_status expected) {
    check_error(tagma_request_attach(f.h(), f.r1, blocks.data(), static_cast<int64_t>(blocks.size())), expected,
                "tagma_request_attach");
  };
  attach({11, 20}, TAGMA_E_STATE);  // 20 is free
  check_message("tagma_request_attach: block 20 at index 1 is free");
  attach({0}, TAGMA_E_STATE);  // null block
  check_message("tagma_request_attach: block 0 at index 0 is the null block");
  attach({-1}, TAGMA_E_OUT_OF_RANGE);
  attach({11, 33}, TAGMA_E_OUT_OF_RANGE);
  check_message("tagma_request_attach: block id 33 at index 1 is outside [0, 33)");
  attach({11, 12, 11}, TAGMA_E_STATE);  // listed twice
  attach({12, 2}, TAGMA_E_STATE);       // r1 already holds block 2
  check_message("tagma_request_attach: block 2 is already held by the request");
  attach({7, 11, 6}, TAGMA_E_STATE);  // r1 holds 6
  check_error(tagma_request_attach(f.h(), f.r1, nullptr, 1), TAGMA_E_INVALID_ARG, "tagma_request_attach");
  const int32_t one[1] = {11};
  check_error(tagma_request_attach(f.h(), f.r1, one, 0), TAGMA_E_INVALID_ARG, "tagma_request_attach");
  check_error(tagma_request_attach(f.h(), f.r1, one, -1), TAGMA_E_INVALID_ARG, "tagma_request_attach");
  CHECK_EQ(f.engine.snapshot(), before);
  CHECK_EQ(f.engine.ranges(f.r1).size(), 1u);
}

TEST(errors_cache_mark) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  const auto mark = [&](std::vector<int32_t> blocks, tagma_status expected) {
    check_error(tagma_cache_mark(f.h(), blocks.data(), static_cast<int64_t>(blocks.size())), expected,
                "tagma_cache_mark");
  };
  mark({1, 2, 20}, TAGMA_E_STATE);  // 20 is free: 1 and 2 are not marked either
  mark({0}, TAGMA_E_STATE);
  mark({1, -3}, TAGMA_E_OUT_OF_RANGE);
  mark({1, 1000}, TAGMA_E_OUT_OF_RANGE);
  check_error(tagma_cache_mark(f.h(), nullptr, 2), TAGMA_E_INVALID_ARG, "tagma_cache_mark");
  const int32_t one[1] = {1};
  check_error(tagma_cache_mark(f.h(), one, 0), TAGMA_E_INVALID_ARG, "tagma_cache_mark");
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_cache_unmark) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  const auto unmark = [&](std::vector<int32_t> blocks, tagma_status expected) {
    check_error(tagma_cache_unmark(f.h(), blocks.data(), static_cast<int64_t>(blocks.size())), expected,
                "tagma_cache_unmark");
  };
  unmark({11, 1}, TAGMA_E_STATE);  // block 1 is in use but not cached
  check_message("tagma_cache_unmark: block 1 at index 1 has no cache reference");
  unmark({12, 20}, TAGMA_E_STATE);      // free
  unmark({0}, TAGMA_E_STATE);           // null block
  unmark({3, 13, 3}, TAGMA_E_STATE);    // block 3 has one cache reference, listed twice
  unmark({11, 33}, TAGMA_E_OUT_OF_RANGE);
  check_error(tagma_cache_unmark(f.h(), nullptr, 1), TAGMA_E_INVALID_ARG, "tagma_cache_unmark");
  const int32_t one[1] = {11};
  check_error(tagma_cache_unmark(f.h(), one, -2), TAGMA_E_INVALID_ARG, "tagma_cache_unmark");
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_cache_evict_and_clear) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  int32_t out[4] = {};
  int64_t num = -1;
  check_error(tagma_cache_evict(f.h(), 0, out, &num), TAGMA_E_INVALID_ARG, "tagma_cache_evict");
  check_message("tagma_cache_evict: max_blocks 0 must be > 0");
  check_error(tagma_cache_evict(f.h(), -1, out, &num), TAGMA_E_INVALID_ARG, "tagma_cache_evict");
  check_error(tagma_cache_evict(f.h(), 2, out, nullptr), TAGMA_E_INVALID_ARG, "tagma_cache_evict");
  CHECK_EQ(num, -1);
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_request_queries) {
  Fixture f;  // r1 holds 6 blocks
  const Snapshot before = f.engine.snapshot();
  int32_t out[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  int64_t total = -1;
  check_error(tagma_request_block(f.h(), f.r1, -1, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_block");
  check_error(tagma_request_block(f.h(), f.r1, 6, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_block");
  check_message("tagma_request_block: logical block 6 is outside [0, 6) of request " + std::to_string(f.r1));
  check_error(tagma_request_block(f.h(), f.r1, 0, nullptr), TAGMA_E_INVALID_ARG, "tagma_request_block");
  check_error(tagma_request_blocks(f.h(), f.r1, -1, 2, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  check_error(tagma_request_blocks(f.h(), f.r1, 5, 2, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  check_error(tagma_request_blocks(f.h(), f.r1, 1, kMaxInt64, out), TAGMA_E_OUT_OF_RANGE, "tagma_request_blocks");
  check_error(tagma_request_blocks(f.h(), f.r1, 0, 0, out), TAGMA_E_INVALID_ARG, "tagma_request_blocks");
  check_error(tagma_request_blocks(f.h(), f.r1, 0, 2, nullptr), TAGMA_E_INVALID_ARG, "tagma_request_blocks");
  check_error(tagma_request_num_blocks(f.h(), f.r1, nullptr), TAGMA_E_INVALID_ARG, "tagma_request_num_blocks");
  check_error(tagma_request_num_ranges(f.h(), f.r1, nullptr), TAGMA_E_INVALID_ARG, "tagma_request_num_ranges");
  check_error(tagma_request_ranges(f.h(), f.r1, out, -1, &total), TAGMA_E_INVALID_ARG, "tagma_request_ranges");
  check_error(tagma_request_ranges(f.h(), f.r1, nullptr, 1, &total), TAGMA_E_INVALID_ARG, "tagma_request_ranges");
  check_error(tagma_request_ranges(f.h(), f.r1, out, 1, nullptr), TAGMA_E_INVALID_ARG, "tagma_request_ranges");
  CHECK_EQ(out[0], -1);
  CHECK_EQ(total, -1);
  CHECK_EQ(f.engine.snapshot(), before);
}

TEST(errors_inspection_arguments) {
  Fixture f;
  const Snapshot before = f.engine.snapshot();
  std::vector<int32_t> refs(33, -1);
  int32_t out[4] = {};
  int64_t total = -1;
  int64_t histogram[2] = {};
  check_error(tagma_block_state(f.h(), refs.data(), nullptr, 32), TAGMA_E_INVALID_ARG, "tagma_block_state");
  check_error(tagma_free_ranges(f.h(), out, -1, &total), TAGMA_E_INVALID_ARG, "tagma_free_ranges");
  check_error(tagma_free_ranges(f.h(), nullptr, 2, &total), TAGMA_E_INVALID_ARG, "tagma_free_ranges");
  check_error(tagma_free_ranges(f.h(), out, 2, nullptr), TAGMA_E_INVALID_ARG, "tagma_free_ranges");
  check_error(tagma_lru_order(f.h(), out, -1, &total), TAGMA_E_INVALID_ARG, "tagma_lru_order");
  check_error(tagma_lru_order(f.h(), nullptr, 2, &total), TAGMA_E_INVALID_ARG, "tagma_lru_order");
  check_error(tagma_lru_order(f.h(), out, 2, nullptr), TAGMA_E_INVALID_ARG, "tagma_lru_order");
  check_error(tagma_ranges_histogram(f.h(), histogram, 0), TAGMA_E_INVALID_ARG, "tagma_ranges_histogram");
  check_error(tagma_ranges_histogram(f.h(), nullptr, 2), TAGMA_E_INVALID_ARG, "tagma_ranges_histogram");
  check_error(tagma_engine_stats(f.h(), nullptr), TAGMA_E_INVALID_ARG, "tagma_engine_stats");
  check_error(tagma_request_create(f.h(), nullptr), TAGMA_E_INVALID_ARG, "tagma_request_create");
  CHECK_EQ(refs[0], -1);
  CHECK_EQ(total, -1);
  CHECK_EQ(f.engine.snapshot(), before);
  CHECK_EQ(f.engine.stats().live_requests, 2);
}

TEST(errors_last_error_is_thread_local) {
  Fixture f;
  check_error(tagma_request_release(f.h(), 4242), TAGMA_E_NOT_FOUND, "tagma_request_release");
  std::string other_thread_message;
  std::thread other([&] {
    tagma_engine_set_policy(f.h(), 9);
    other_thread_message = tagma_last_error();
  });
  other.join();
  CHECK_EQ(other_thread_message, std::string("tagma_engine_set_policy: policy 9 is unknown (0 first fit, 1 best fit, "
                                             "2 headroom, 3 reserve)"));
  check_message("tagma_request_release: request 4242 is unknown or released");
}

TEST(engines_can_be_created_and_used_from_many_threads) {
  std::vector<std::vector<tagma_engine_handle>> handles(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < handles.size(); ++t) {
    threads.emplace_back([&handles, t] {
      for (int i = 0; i < 50; ++i) {
        tagma_engine_handle h = 0;
        if (tagma_engine_create(64, 1, TAGMA_POLICY_BEST_FIT, &h) != TAGMA_OK) return;
        uint64_t request = 0;
        tagma_request_create(h, &request);
        tagma_request_append(h, request, 10, nullptr, nullptr, nullptr);
        handles[t].push_back(h);
        if (i % 2 == 0) tagma_engine_destroy(h);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<tagma_engine_handle> unique;
  for (size_t t = 0; t < handles.size(); ++t) {
    CHECK_EQ(handles[t].size(), 50u);
    for (size_t i = 0; i < handles[t].size(); ++i) {
      unique.insert(handles[t][i]);
      if (i % 2 == 1) require_ok(tagma_engine_destroy(handles[t][i]), "destroy");
    }
  }
  CHECK_EQ(unique.size(), 200u);
}

TEST(version_is_reported) { CHECK_EQ(std::string(tagma_version()), std::string("0.1.0")); }
