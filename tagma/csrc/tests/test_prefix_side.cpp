// The prefix index's side groups: a window group's blocks cached at the full group's nodes, dropped on their
// own or with their node, attached back; random operations against a content oracle.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::require_ok;
using test::TestEngine;

namespace {

using Tokens = std::vector<int32_t>;
constexpr int64_t kBs = 2;

tagma_prefix_side_stats side_stats(const TestEngine& engine) {
  tagma_prefix_side_stats s{};
  require_ok(tagma_prefix_side_stats_get(engine.handle(), &s), "tagma_prefix_side_stats_get");
  return s;
}

tagma_prefix_stats prefix_stats(const TestEngine& engine) {
  tagma_prefix_stats s{};
  require_ok(tagma_prefix_stats_get(engine.handle(), &s), "tagma_prefix_stats_get");
  return s;
}

std::vector<int32_t> lookup(const TestEngine& engine, const Tokens& tokens) {
  std::vector<int32_t> ids(tokens.size() / kBs + 1, -1);
  int64_t hit = -1;
  require_ok(tagma_prefix_lookup(engine.handle(), 0, tokens.data(), static_cast<int64_t>(tokens.size()),
                                 static_cast<int64_t>(ids.size()), ids.data(), &hit),
             "tagma_prefix_lookup");
  ids.resize(static_cast<size_t>(hit));
  return ids;
}

std::vector<int32_t> side_lookup(const TestEngine& engine, const std::vector<int32_t>& nodes) {
  std::vector<int32_t> out(nodes.size(), -2);
  require_ok(tagma_prefix_side_lookup(engine.handle(), 0, nodes.data(), static_cast<int64_t>(nodes.size()),
                                      out.data()),
             "tagma_prefix_side_lookup");
  return out;
}

int64_t side_insert(const TestEngine& engine, uint64_t full, uint64_t side, int64_t first, int64_t start,
                    int64_t end, const uint8_t* mask = nullptr) {
  int64_t cached = -1;
  require_ok(tagma_prefix_side_insert(engine.handle(), full, 0, side, first, start, end, mask, &cached),
             "tagma_prefix_side_insert");
  return cached;
}

void enable(const TestEngine& engine) {
  require_ok(tagma_prefix_enable(engine.handle(), kBs, TAGMA_EVICT_LRU), "tagma_prefix_enable");
  require_ok(tagma_prefix_side_enable(engine.handle(), 1), "tagma_prefix_side_enable");
}

// Every cache reference is the index's: one per node or side block.
void check_side_invariants(const TestEngine& engine) {
  engine.check_invariants();
  int64_t cached = 0;
  for (const int32_t refs : engine.cache_refs()) {
    CHECK(refs == 0 || refs == 1);
    cached += refs;
  }
  CHECK_EQ(prefix_stats(engine).indexed_blocks + side_stats(engine).cached_blocks, cached);
}

}  // namespace

TEST(prefix_side_blocks_outlive_their_window_and_are_evicted_alone) {
  TestEngine engine(33);  // 32 usable blocks
  enable(engine);
  Tokens tokens;
  for (int32_t i = 0; i < 12; ++i) tokens.push_back(100 + i);  // 6 blocks
  const uint64_t full = engine.new_request();
  engine.append(full, 6);
  int64_t indexed = 0;
  require_ok(tagma_prefix_insert(engine.handle(), 0, full, tokens.data(), 0, 12, &indexed), "insert");
  CHECK_EQ(indexed, 6);
  const uint64_t window = engine.new_request();
  const std::vector<int32_t> window_blocks = engine.append(window, 6);
  CHECK_EQ(side_insert(engine, full, window, 0, 0, 6), 6);
  require_ok(tagma_request_free_front(engine.handle(), window, 4), "free_front");
  CHECK_EQ(engine.stats().cached_only_blocks, 4);
  check_side_invariants(engine);
  engine.release(window);
  engine.release(full);
  // 20 free; 22 asked: the two oldest cache-only blocks go. The window freed its first 4 blocks first,
  // nearest the window first (as vLLM's remove_skipped_blocks frees them): logical 3 and 2.
  const uint64_t other = engine.new_request();
  engine.append(other, 22);
  const std::vector<int32_t> found = side_lookup(engine, lookup(engine, tokens));
  CHECK_EQ(found.size(), 6u);
  CHECK_EQ(found[0], window_blocks[0]);
  CHECK_EQ(found[1], window_blocks[1]);
  CHECK_EQ(found[2], -1);
  CHECK_EQ(found[3], -1);
  CHECK_EQ(found[4], window_blocks[4]);
  CHECK_EQ(found[5], window_blocks[5]);
  CHECK_EQ(side_stats(engine).evicted_blocks, 2);
  check_side_invariants(engine);
}

TEST(prefix_side_attach_and_errors) {
  TestEngine engine(17);
  enable(engine);
  Tokens tokens{1, 2, 3, 4};
  const uint64_t full = engine.new_request();
  const std::vector<int32_t> full_blocks = engine.append(full, 2);
  require_ok(tagma_prefix_insert(engine.handle(), 0, full, tokens.data(), 0, 4, nullptr), "insert");
  const uint64_t window = engine.new_request();
  const std::vector<int32_t> window_blocks = engine.append(window, 2);
  const uint8_t mask[2] = {0, 1};
  CHECK_EQ(side_insert(engine, full, window, 0, 0, 2, mask), 1);
  const uint64_t fresh = engine.new_request();
  const test::Snapshot before = engine.snapshot();
  check_error(tagma_prefix_side_insert(engine.handle(), full, 1, window, 0, 0, 2, nullptr, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_side_insert");
  check_error(tagma_prefix_side_insert(engine.handle(), full, 0, window, -1, 0, 2, nullptr, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_side_insert");
  check_error(tagma_prefix_side_attach(engine.handle(), fresh, full_blocks.data(), 1), TAGMA_E_STATE,
              "tagma_prefix_side_attach");
  const int32_t twice[2] = {window_blocks[1], window_blocks[1]};
  check_error(tagma_prefix_side_attach(engine.handle(), fresh, twice, 2), TAGMA_E_STATE, "tagma_prefix_side_attach");
  check_error(tagma_prefix_side_attach(engine.handle(), fresh, nullptr, 1), TAGMA_E_INVALID_ARG, "tagma_prefix_side_attach");
  const int32_t outside[1] = {999};
  check_error(tagma_prefix_side_lookup(engine.handle(), 0, outside, 1, std::vector<int32_t>(1).data()),
              TAGMA_E_OUT_OF_RANGE, "tagma_prefix_side_lookup");
  check_error(tagma_request_free_front(engine.handle(), full, 1), TAGMA_E_STATE, "tagma_request_free_front");
  check_error(tagma_prefix_side_enable(engine.handle(), 1), TAGMA_E_STATE, "tagma_prefix_side_enable");
  CHECK(engine.snapshot() == before);
  require_ok(tagma_prefix_side_attach(engine.handle(), fresh, &window_blocks[1], 1), "side attach");
  CHECK_EQ(engine.blocks(fresh), (std::vector<int32_t>{window_blocks[1]}));
  CHECK_EQ(engine.req_refs()[static_cast<size_t>(window_blocks[1])], 2);
  check_side_invariants(engine);
}

TEST(prefix_side_random_operations_keep_the_invariants_and_the_kv_they_name) {
  std::mt19937 rng(77);
  TestEngine engine(61);
  enable(engine);
  const int64_t window_blocks = 2;  // a window of 2 blocks: the side request keeps its last 2
  struct Live {
    uint64_t full;
    uint64_t side;
    int64_t dropped;
    Tokens tokens;
  };
  std::vector<Live> live;
  // What each block holds: (group, tokens up to its end). Written when a request computes the block.
  std::map<int32_t, std::pair<int, Tokens>> content;
  auto written = [&](const Live& l) {
    const std::vector<int32_t> full = engine.blocks(l.full);
    const std::vector<int32_t> side = engine.blocks(l.side);
    const int64_t n = static_cast<int64_t>(l.tokens.size()) / kBs;
    for (int64_t i = 0; i < n; ++i) {
      const Tokens prefix(l.tokens.begin(), l.tokens.begin() + (i + 1) * kBs);
      if (i < static_cast<int64_t>(full.size())) {
        auto& slot = content[full[static_cast<size_t>(i)]];
        if (engine.req_refs()[static_cast<size_t>(full[static_cast<size_t>(i)])] == 1) slot = {0, prefix};
      }
      const int64_t local = i - l.dropped;
      if (local >= 0 && local < static_cast<int64_t>(side.size())) {
        auto& slot = content[side[static_cast<size_t>(local)]];
        if (engine.req_refs()[static_cast<size_t>(side[static_cast<size_t>(local)])] == 1) slot = {1, prefix};
      }
    }
  };
  int64_t side_hits = 0;
  for (int step = 0; step < 800; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 && live.size() < 6) {
      Tokens tokens;
      const int family = static_cast<int>(rng() % 3);
      const int len = 2 + static_cast<int>(rng() % 12);
      for (int i = 0; i < len; ++i) tokens.push_back(family * 100 + (i < 6 ? i : static_cast<int>(rng() % 3)));
      const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / kBs;
      std::vector<int32_t> nodes = lookup(engine, tokens);
      if (static_cast<int64_t>(nodes.size()) > max_blocks) nodes.resize(static_cast<size_t>(max_blocks));
      const std::vector<int32_t> sides = side_lookup(engine, nodes);
      // the window's rule: the hit ends at the last run of window_blocks cached side blocks
      int64_t hit = 0;
      for (int64_t end = static_cast<int64_t>(nodes.size()); end >= window_blocks; --end) {
        if (sides[static_cast<size_t>(end - 1)] >= 0 && sides[static_cast<size_t>(end - 2)] >= 0) {
          hit = end;
          break;
        }
      }
      Live l{engine.new_request(), engine.new_request(), std::max<int64_t>(hit - window_blocks, 0), tokens};
      for (int64_t i = l.dropped; i < hit; ++i) {  // the hit's blocks hold this prompt's KV
        const Tokens prefix(tokens.begin(), tokens.begin() + (i + 1) * kBs);
        CHECK(content[nodes[static_cast<size_t>(i)]] == std::make_pair(0, prefix));
        CHECK(content[sides[static_cast<size_t>(i)]] == std::make_pair(1, prefix));
      }
      int64_t attached = -1;
      require_ok(tagma_prefix_lookup_attach(engine.handle(), 0, l.full, tokens.data(),
                                            static_cast<int64_t>(tokens.size()), hit, &attached),
                 "lookup_attach");
      CHECK_EQ(attached, hit);
      const std::vector<int32_t> run(sides.begin() + l.dropped, sides.begin() + hit);
      require_ok(tagma_prefix_side_attach(engine.handle(), l.side, run.data(), static_cast<int64_t>(run.size())),
                 "side_attach");
      side_hits += hit - l.dropped;
      const int64_t need = (static_cast<int64_t>(tokens.size()) + kBs - 1) / kBs - hit;
      const tagma_stats s = engine.stats();
      if (s.free_blocks + s.cached_only_blocks < 2 * need) {
        engine.release(l.full);
        engine.release(l.side);
        continue;
      }
      if (need > 0) {
        engine.append(l.full, need);
        engine.append(l.side, need);
      }
      written(l);
      require_ok(tagma_prefix_insert(engine.handle(), 0, l.full, tokens.data(), 0,
                                     static_cast<int64_t>(tokens.size()), nullptr),
                 "insert");
      side_insert(engine, l.full, l.side, l.dropped, hit, static_cast<int64_t>(tokens.size()) / kBs);
      live.push_back(l);
    } else if (op < 7 && !live.empty()) {  // the window moves: drop all but its last blocks
      Live& l = live[rng() % live.size()];
      const int64_t logical = l.dropped + static_cast<int64_t>(engine.blocks(l.side).size());
      const int64_t keep_from = std::max<int64_t>(logical - window_blocks, l.dropped);
      if (keep_from > l.dropped) {
        require_ok(tagma_request_free_front(engine.handle(), l.side, keep_from - l.dropped), "free_front");
        l.dropped = keep_from;
      }
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      engine.release(live[i].full);
      engine.release(live[i].side);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (step % 20 == 0) check_side_invariants(engine);
  }
  for (const Live& l : live) {
    engine.release(l.full);
    engine.release(l.side);
  }
  check_side_invariants(engine);
  CHECK_EQ(engine.stats().used_blocks, 0);
  CHECK(side_hits > 0);
  CHECK(side_stats(engine).evicted_blocks > 0);
}
