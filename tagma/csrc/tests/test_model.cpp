// Random operation sequences run on the engine and on the naive reference model; after every operation the
// statuses, outputs and complete visible states must agree.
#include <algorithm>
#include <random>
#include <string>

#include "helpers.h"
#include "reference_model.h"
#include "test_runner.h"

using test::ReferenceModel;
using test::TestEngine;

namespace {

struct Scenario {
  int32_t num_blocks;
  int32_t align;
  int32_t policy;
  uint64_t seed;
};

class Driver {
 public:
  explicit Driver(const Scenario& scenario)
      : scenario_(scenario),
        engine_(scenario.num_blocks, scenario.align, scenario.policy),
        model_(scenario.num_blocks, scenario.align, scenario.policy),
        rng_(scenario.seed) {}

  void run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      random_operation();
      compare_states();
      if (step_ % 50 == 0) engine_.check_invariants();
    }
    engine_.check_invariants();
  }

 private:
  int64_t uniform(int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high)(rng_); }
  bool chance(int percent) { return uniform(0, 99) < percent; }

  // Stops the scenario at the first disagreement, naming the step and operation.
  template <class T>
  void expect_eq(const T& actual, const T& expected, const char* what) {
    if (actual == expected) return;
    test::record_failure(__FILE__, __LINE__,
                         "scenario seed " + std::to_string(scenario_.seed) + " align " +
                             std::to_string(scenario_.align) + " policy " + std::to_string(scenario_.policy) +
                             " step " + std::to_string(step_) + " (" + operation_ + "): " + what + ": engine " +
                             test::show(actual) + " model " + test::show(expected));
    throw test::Abort{};
  }

  std::vector<uint64_t> live() const {
    std::vector<uint64_t> ids;
    for (const auto& entry : model_.requests()) ids.push_back(entry.first);
    return ids;
  }

  // A live request id, or now and then a released or never-created one.
  uint64_t some_request() {
    const std::vector<uint64_t> ids = live();
    if (ids.empty() || chance(4)) return chance(50) ? 0 : static_cast<uint64_t>(uniform(1, 10000));
    return ids[static_cast<size_t>(uniform(0, static_cast<int64_t>(ids.size()) - 1))];
  }

  std::vector<int32_t> blocks_of(uint64_t request) const {
    std::vector<int32_t> blocks;
    const auto found = model_.requests().find(request);
    if (found == model_.requests().end()) return blocks;
    for (const test::RangeTriple& range : found->second) {
      for (int32_t b = range.start; b < range.start + range.count; ++b) blocks.push_back(b);
    }
    return blocks;
  }

  // Mostly valid block ids of the wanted kind, occasionally an invalid one.
  int32_t some_block(bool cached_only) {
    std::vector<int32_t> candidates;
    for (int32_t b = 1; b < scenario_.num_blocks; ++b) {
      const bool in_use = model_.req_refs()[b] > 0;
      const bool cached = model_.cache_refs()[b] > 0;
      if (cached_only ? cached : (in_use || cached)) candidates.push_back(b);
    }
    if (candidates.empty() || chance(5)) return static_cast<int32_t>(uniform(-1, scenario_.num_blocks));
    return candidates[static_cast<size_t>(uniform(0, static_cast<int64_t>(candidates.size()) - 1))];
  }

  int64_t some_count() {
    const int64_t align = scenario_.align;
    if (chance(3)) return uniform(-2, 0);
    if (chance(5)) return uniform(1, 3 * align);  // often misaligned
    if (chance(5)) return align * uniform(scenario_.num_blocks / align / 2, scenario_.num_blocks / align + 2);
    return align * uniform(1, std::max<int64_t>(1, scenario_.num_blocks / align / 10));
  }

  // Share of the block space held by requests; kept moderate so that appends mostly find room.
  double occupancy() const {
    const auto& refs = model_.req_refs();
    const auto used = std::count_if(refs.begin(), refs.end(), [](int32_t r) { return r > 0; });
    return static_cast<double>(used) / scenario_.num_blocks;
  }

  void release() {
    const uint64_t request = some_request();
    operation_ = "release " + std::to_string(request);
    expect_eq(engine_.try_release(request), model_.release(request), "status");
  }

  void random_operation() {
    if (occupancy() > 0.6 && chance(40)) return release();
    const int64_t dice = uniform(0, 99);
    if (dice < 15) {
      operation_ = "create";
      expect_eq(engine_.new_request(), model_.create_request(), "request id");
    } else if (dice < 50) {
      append();
    } else if (dice < 60) {
      attach();
    } else if (dice < 72) {
      release();
    } else if (dice < 81) {
      mark();
    } else if (dice < 88) {
      unmark();
    } else if (dice < 96) {
      evict();
    } else if (dice < 97) {
      operation_ = "clear";
      int64_t dropped = -1;
      test::require_ok(tagma_cache_clear(engine_.handle(), &dropped), "tagma_cache_clear");
      expect_eq(dropped, model_.clear(), "dropped");
    } else {
      const auto policy = static_cast<int32_t>(uniform(0, 2));
      operation_ = "policy " + std::to_string(policy);
      engine_.set_policy(policy);
      model_.set_policy(policy);
    }
  }

  void append() {
    const uint64_t request = some_request();
    const int64_t count = some_count();
    operation_ = "append " + std::to_string(count) + " to " + std::to_string(request);
    const size_t capacity = static_cast<size_t>(std::max<int64_t>(count, 1));
    std::vector<int32_t> blocks(capacity, -1);
    std::vector<int32_t> evicted(capacity, -1);
    int64_t num_evicted = -1;
    const tagma_status status = tagma_request_append(engine_.handle(), request, count, blocks.data(), evicted.data(),
                                                     &num_evicted);
    std::vector<int32_t> expected_blocks;
    std::vector<int32_t> expected_evicted;
    expect_eq(status, model_.append(request, count, &expected_blocks, &expected_evicted), "status");
    if (status != TAGMA_OK) return;
    blocks.resize(static_cast<size_t>(count));
    evicted.resize(static_cast<size_t>(num_evicted));
    expect_eq(blocks, expected_blocks, "new blocks");
    expect_eq(evicted, expected_evicted, "evicted blocks");
  }

  void attach() {
    const uint64_t request = some_request();
    std::vector<int32_t> blocks;
    if (chance(60)) {  // a prefix of another request, like a prefix-cache hit
      blocks = blocks_of(some_request());
      blocks.resize(static_cast<size_t>(uniform(0, static_cast<int64_t>(blocks.size()))));
    } else {
      for (int64_t i = uniform(1, 4); i > 0; --i) blocks.push_back(some_block(false));
    }
    if (blocks.empty()) blocks.push_back(some_block(false));
    operation_ = "attach " + test::show(blocks) + " to " + std::to_string(request);
    const tagma_status status =
        tagma_request_attach(engine_.handle(), request, blocks.data(), static_cast<int64_t>(blocks.size()));
    expect_eq(status, model_.attach(request, blocks), "status");
  }

  void mark() {
    std::vector<int32_t> blocks = chance(70) ? blocks_of(some_request()) : std::vector<int32_t>{};
    if (blocks.empty()) blocks.push_back(some_block(false));
    operation_ = "mark " + test::show(blocks);
    const tagma_status status =
        tagma_cache_mark(engine_.handle(), blocks.data(), static_cast<int64_t>(blocks.size()));
    expect_eq(status, model_.mark(blocks), "status");
  }

  void unmark() {
    std::vector<int32_t> blocks;
    for (int64_t i = uniform(1, 3); i > 0; --i) blocks.push_back(some_block(true));
    operation_ = "unmark " + test::show(blocks);
    const tagma_status status =
        tagma_cache_unmark(engine_.handle(), blocks.data(), static_cast<int64_t>(blocks.size()));
    expect_eq(status, model_.unmark(blocks), "status");
  }

  void evict() {
    const int64_t max_blocks = chance(5) ? 0 : uniform(1, 12);
    operation_ = "evict " + std::to_string(max_blocks);
    std::vector<int32_t> evicted(static_cast<size_t>(std::max<int64_t>(max_blocks, 1)), -1);
    int64_t num_evicted = -1;
    const tagma_status status = tagma_cache_evict(engine_.handle(), max_blocks, evicted.data(), &num_evicted);
    std::vector<int32_t> expected;
    expect_eq(status, model_.evict(max_blocks, &expected), "status");
    if (status != TAGMA_OK) return;
    evicted.resize(static_cast<size_t>(num_evicted));
    expect_eq(evicted, expected, "evicted blocks");
  }

  void compare_states() {
    expect_eq(engine_.req_refs(), model_.req_refs(), "request references");
    expect_eq(engine_.cache_refs(), model_.cache_refs(), "cache references");
    expect_eq(engine_.free_ranges(), model_.free_ranges(), "free ranges");
    expect_eq(engine_.lru(), model_.lru(), "lru order");
    for (const auto& [request, ranges] : model_.requests()) expect_eq(engine_.ranges(request), ranges, "ranges");
    const tagma_stats s = engine_.stats();
    const std::vector<int64_t> counters{s.in_place_growths, s.new_ranges, s.merges, s.evictions, s.appended_blocks};
    expect_eq(counters, model_.counters(), "counters");
    expect_eq(s.live_requests, static_cast<int64_t>(model_.requests().size()), "live requests");
  }

  Scenario scenario_;
  TestEngine engine_;
  ReferenceModel model_;
  std::mt19937_64 rng_;
  int step_ = 0;
  std::string operation_;
};

void run_scenarios(int32_t align, int steps) {
  uint64_t seed = 1000 + static_cast<uint64_t>(align);
  for (const int32_t num_blocks : {24, 97, 300}) {
    for (const int32_t policy : {TAGMA_POLICY_FIRST_FIT, TAGMA_POLICY_BEST_FIT, TAGMA_POLICY_HEADROOM}) {
      Driver(Scenario{num_blocks, align, policy, seed++}).run(steps);
    }
  }
}

}  // namespace

TEST(model_random_operations_align_1) { run_scenarios(1, 1500); }

TEST(model_random_operations_align_2) { run_scenarios(2, 1500); }

TEST(model_random_operations_align_4) { run_scenarios(4, 1500); }
