// Keyed side groups: window blocks cached under chained content keys (no full-attention group), found by key
// and tokens, evicted alone, attached back; errors change nothing; random operations against a content oracle.
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
using Keys = std::vector<uint64_t>;
constexpr int64_t kBs = 2;

void enable(const TestEngine& engine, int32_t groups = 1) {
  require_ok(tagma_prefix_enable(engine.handle(), kBs, TAGMA_EVICT_LRU), "tagma_prefix_enable");
  require_ok(tagma_prefix_keyed_enable(engine.handle(), groups), "tagma_prefix_keyed_enable");
}

Keys keys_of(const TestEngine& engine, const Tokens& tokens, uint64_t ns = 0, const uint64_t* prev = nullptr) {
  const int64_t n = static_cast<int64_t>(tokens.size()) / kBs;
  Keys keys(2 * static_cast<size_t>(n), 0);
  require_ok(tagma_prefix_chain_keys(engine.handle(), ns, prev, tokens.data(), n, keys.data()),
             "tagma_prefix_chain_keys");
  return keys;
}

std::vector<int32_t> keyed_lookup(const TestEngine& engine, const Tokens& tokens, int64_t count, int32_t group = 0) {
  const Keys keys = keys_of(engine, tokens);
  std::vector<int32_t> out(static_cast<size_t>(count), -2);
  require_ok(tagma_prefix_keyed_lookup(engine.handle(), group, keys.data(), tokens.data(), count, out.data()),
             "tagma_prefix_keyed_lookup");
  return out;
}

// Caches request `side`'s blocks for logical [start, end) of `tokens`.
int64_t keyed_insert(const TestEngine& engine, uint64_t side, int64_t first, int64_t start, int64_t end,
                     const Tokens& tokens, int32_t group = 0, const uint8_t* mask = nullptr) {
  const Keys all = keys_of(engine, tokens);
  const Keys keys(all.begin() + 2 * start, all.begin() + 2 * end);
  const Tokens part(tokens.begin() + start * kBs, tokens.begin() + end * kBs);
  int64_t cached = -1;
  require_ok(tagma_prefix_keyed_insert(engine.handle(), group, side, first, start, end, keys.data(), part.data(), mask,
                                       &cached),
             "tagma_prefix_keyed_insert");
  return cached;
}

tagma_prefix_side_stats side_stats(const TestEngine& engine) {
  tagma_prefix_side_stats s{};
  require_ok(tagma_prefix_side_stats_get(engine.handle(), &s), "tagma_prefix_side_stats_get");
  return s;
}

// Every cache reference is a keyed block's.
void check_keyed_invariants(const TestEngine& engine) {
  engine.check_invariants();
  int64_t cached = 0;
  for (const int32_t refs : engine.cache_refs()) {
    CHECK(refs == 0 || refs == 1);
    cached += refs;
  }
  CHECK_EQ(side_stats(engine).cached_blocks, cached);
}

Tokens counting(int32_t from, int32_t count) {
  Tokens tokens;
  for (int32_t i = 0; i < count; ++i) tokens.push_back(from + i);
  return tokens;
}

}  // namespace

TEST(prefix_chain_keys_chain_and_depend_on_every_earlier_token) {
  TestEngine engine(9);
  enable(engine);
  const Tokens tokens = counting(7, 8);  // 4 blocks
  const Keys all = keys_of(engine, tokens);
  // in two calls, the second chained from the first's last key: the same keys
  const Keys head = keys_of(engine, Tokens(tokens.begin(), tokens.begin() + 4));
  const Keys tail = keys_of(engine, Tokens(tokens.begin() + 4, tokens.end()), 0, &head[2]);
  CHECK(Keys(all.begin(), all.begin() + 4) == head);
  CHECK(Keys(all.begin() + 4, all.end()) == tail);
  // another namespace: every key differs
  const Keys other_ns = keys_of(engine, tokens, 1);
  for (size_t i = 0; i < all.size(); ++i) CHECK(all[i] != other_ns[i]);
  // a token changed in block 1: keys 0 stay, keys 1.. change
  Tokens changed = tokens;
  changed[3] += 1;
  const Keys moved = keys_of(engine, changed);
  CHECK(moved[0] == all[0] && moved[1] == all[1]);
  for (size_t i = 2; i < all.size(); ++i) CHECK(moved[i] != all[i]);
  // the same block after different prefixes: different keys
  const Tokens a{1, 2, 5, 6};
  const Tokens b{3, 4, 5, 6};
  CHECK(keys_of(engine, a)[2] != keys_of(engine, b)[2]);
}

TEST(prefix_keyed_blocks_outlive_their_window_and_are_evicted_alone) {
  TestEngine engine(33);  // 32 usable blocks
  enable(engine);
  const Tokens tokens = counting(100, 12);  // 6 blocks
  const uint64_t window = engine.new_request();
  const std::vector<int32_t> window_blocks = engine.append(window, 6);
  CHECK_EQ(keyed_insert(engine, window, 0, 0, 6, tokens), 6);
  CHECK_EQ(keyed_insert(engine, window, 0, 0, 6, tokens), 0);  // cached already
  require_ok(tagma_request_free_front(engine.handle(), window, 4), "free_front");
  CHECK_EQ(engine.stats().cached_only_blocks, 4);
  check_keyed_invariants(engine);
  CHECK(keyed_lookup(engine, tokens, 6) == window_blocks);
  engine.release(window);
  // 26 free; 28 asked: the two oldest cache-only blocks go, nearest the window first (logical 3 and 2).
  const uint64_t other = engine.new_request();
  engine.append(other, 28);
  const std::vector<int32_t> found = keyed_lookup(engine, tokens, 6);
  CHECK_EQ(found[0], window_blocks[0]);
  CHECK_EQ(found[1], window_blocks[1]);
  CHECK_EQ(found[2], -1);
  CHECK_EQ(found[3], -1);
  CHECK_EQ(found[4], window_blocks[4]);
  CHECK_EQ(found[5], window_blocks[5]);
  CHECK_EQ(side_stats(engine).evicted_blocks, 2);
  check_keyed_invariants(engine);
  // attach the last two back to a new request
  const uint64_t fresh = engine.new_request();
  require_ok(tagma_prefix_side_attach(engine.handle(), fresh, &found[4], 2), "side attach");
  CHECK_EQ(engine.blocks(fresh), (std::vector<int32_t>{window_blocks[4], window_blocks[5]}));
  check_keyed_invariants(engine);
  // clear drops every keyed block
  engine.release(fresh);
  engine.release(other);
  int64_t dropped = -1;
  require_ok(tagma_prefix_clear(engine.handle(), &dropped), "tagma_prefix_clear");
  CHECK_EQ(dropped, 4);
  CHECK(keyed_lookup(engine, tokens, 6) == std::vector<int32_t>(6, -1));
  CHECK_EQ(side_stats(engine).cached_blocks, 0);
  check_keyed_invariants(engine);
}

// A block is cached once: a request whose blocks are keyed side blocks indexes nothing past them in the full
// group's trie (the fuzz found them counted twice, as a node and as a side block).
TEST(prefix_keyed_blocks_are_not_indexed_again_as_nodes) {
  TestEngine engine(17);
  enable(engine);
  const Tokens tokens = counting(7, 8);  // 4 blocks
  const uint64_t request = engine.new_request();
  engine.append(request, 4);
  CHECK_EQ(keyed_insert(engine, request, 0, 2, 4, tokens), 2);  // logical 2 and 3 keyed
  int64_t indexed = -1;
  require_ok(tagma_prefix_insert(engine.handle(), 0, request, tokens.data(), 0, 8, &indexed), "tagma_prefix_insert");
  CHECK_EQ(indexed, 2);  // stops at the first keyed block
  tagma_prefix_stats prefix{};
  require_ok(tagma_prefix_stats_get(engine.handle(), &prefix), "tagma_prefix_stats_get");
  CHECK_EQ(prefix.indexed_blocks, 2);
  CHECK_EQ(side_stats(engine).cached_blocks, 2);
  engine.check_invariants();
  int64_t refs = 0;
  for (const int32_t r : engine.cache_refs()) refs += r;
  CHECK_EQ(refs, 4);  // each block once
}

TEST(prefix_keyed_lookup_compares_tokens_groups_and_masks) {
  TestEngine engine(33);
  enable(engine, 2);
  const Tokens tokens = counting(10, 8);
  const uint64_t g0 = engine.new_request();
  const uint64_t g1 = engine.new_request();
  const std::vector<int32_t> blocks0 = engine.append(g0, 4);
  const std::vector<int32_t> blocks1 = engine.append(g1, 3);  // logical 1..3: its block 0 was dropped
  const uint8_t mask[4] = {1, 0, 1, 1};
  CHECK_EQ(keyed_insert(engine, g0, 0, 0, 4, tokens, 0, mask), 3);
  CHECK_EQ(keyed_insert(engine, g1, 1, 0, 4, tokens, 1), 3);  // logical 0 is not the request's: skipped
  CHECK(keyed_lookup(engine, tokens, 4, 0) == (std::vector<int32_t>{blocks0[0], -1, blocks0[2], blocks0[3]}));
  CHECK(keyed_lookup(engine, tokens, 4, 1) == (std::vector<int32_t>{-1, blocks1[0], blocks1[1], blocks1[2]}));
  // the right key with other tokens (as a colliding key would come): no hit
  const Keys keys = keys_of(engine, tokens);
  Tokens wrong = tokens;
  wrong[6] += 1;
  std::vector<int32_t> out(4, -2);
  require_ok(tagma_prefix_keyed_lookup(engine.handle(), 0, keys.data(), wrong.data(), 4, out.data()), "lookup");
  CHECK(out == (std::vector<int32_t>{blocks0[0], -1, blocks0[2], -1}));
  // another request's block under a key already cached stays uncached
  const uint64_t twin = engine.new_request();
  engine.append(twin, 4);
  CHECK_EQ(keyed_insert(engine, twin, 0, 0, 4, tokens), 1);  // only logical 1 (masked out before)
  engine.release(twin);
  engine.release(g0);
  engine.release(g1);
  check_keyed_invariants(engine);
}

TEST(prefix_keyed_errors_change_nothing) {
  TestEngine engine(17);
  require_ok(tagma_prefix_enable(engine.handle(), kBs, TAGMA_EVICT_LRU), "tagma_prefix_enable");
  const Tokens tokens = counting(1, 4);
  const Keys keys(4, 1);
  std::vector<int32_t> out(2, -2);
  const uint64_t r = engine.new_request();
  engine.append(r, 2);
  check_error(tagma_prefix_keyed_lookup(engine.handle(), 0, keys.data(), tokens.data(), 2, out.data()),
              TAGMA_E_STATE, "tagma_prefix_keyed_lookup");
  check_error(tagma_prefix_keyed_insert(engine.handle(), 0, r, 0, 0, 2, keys.data(), tokens.data(), nullptr, nullptr),
              TAGMA_E_STATE, "tagma_prefix_keyed_insert");
  check_error(tagma_prefix_keyed_enable(engine.handle(), 0), TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_enable");
  check_error(tagma_prefix_keyed_enable(engine.handle(), 65), TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_enable");
  require_ok(tagma_prefix_keyed_enable(engine.handle(), 1), "tagma_prefix_keyed_enable");
  CHECK_EQ(keyed_insert(engine, r, 0, 0, 2, tokens), 2);
  const test::Snapshot before = engine.snapshot();
  check_error(tagma_prefix_keyed_enable(engine.handle(), 1), TAGMA_E_STATE, "tagma_prefix_keyed_enable");
  check_error(tagma_prefix_side_enable(engine.handle(), 1), TAGMA_E_STATE, "tagma_prefix_side_enable");
  check_error(tagma_prefix_keyed_lookup(engine.handle(), 1, keys.data(), tokens.data(), 2, out.data()),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_lookup");
  check_error(tagma_prefix_keyed_lookup(engine.handle(), 0, keys.data(), tokens.data(), -1, out.data()),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_lookup");
  check_error(tagma_prefix_keyed_lookup(engine.handle(), 0, nullptr, tokens.data(), 2, out.data()),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_lookup");
  check_error(tagma_prefix_keyed_lookup(engine.handle(), 0, keys.data(), nullptr, 2, out.data()),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_lookup");
  check_error(tagma_prefix_keyed_insert(engine.handle(), 0, r, -1, 0, 2, keys.data(), tokens.data(), nullptr, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_insert");
  check_error(tagma_prefix_keyed_insert(engine.handle(), 0, r, 0, 2, 1, keys.data(), tokens.data(), nullptr, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_insert");
  check_error(tagma_prefix_keyed_insert(engine.handle(), 0, 999, 0, 0, 2, keys.data(), tokens.data(), nullptr, nullptr),
              TAGMA_E_NOT_FOUND, "tagma_prefix_keyed_insert");
  check_error(tagma_prefix_keyed_insert(engine.handle(), 0, r, 0, 0, 2, nullptr, tokens.data(), nullptr, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_keyed_insert");
  check_error(tagma_prefix_chain_keys(engine.handle(), 0, nullptr, tokens.data(), -1, nullptr),
              TAGMA_E_INVALID_ARG, "tagma_prefix_chain_keys");
  check_error(tagma_prefix_chain_keys(engine.handle(), 0, nullptr, nullptr, 2, std::vector<uint64_t>(4).data()),
              TAGMA_E_INVALID_ARG, "tagma_prefix_chain_keys");
  CHECK(engine.snapshot() == before);
  engine.release(r);
}

TEST(prefix_keyed_random_operations_keep_the_invariants_and_the_kv_they_name) {
  std::mt19937 rng(91);
  TestEngine engine(41);
  enable(engine);
  const int64_t window_blocks = 2;  // the request keeps its last 2 blocks
  struct Live {
    uint64_t request;
    int64_t dropped;
    Tokens tokens;
  };
  std::vector<Live> live;
  std::map<int32_t, Tokens> content;  // what each block holds: the tokens up to its end
  int64_t hits = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 && live.size() < 6) {
      Tokens tokens;
      const int family = static_cast<int>(rng() % 3);
      const int len = 2 + static_cast<int>(rng() % 14);
      for (int i = 0; i < len; ++i) tokens.push_back(family * 100 + (i < 6 ? i : static_cast<int>(rng() % 3)));
      const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / kBs;
      const std::vector<int32_t> found = max_blocks > 0 ? keyed_lookup(engine, tokens, max_blocks)
                                                        : std::vector<int32_t>{};
      int64_t hit = 0;  // the window's rule: the hit ends at the last run of window_blocks cached blocks
      for (int64_t end = max_blocks; end >= window_blocks; --end) {
        if (found[static_cast<size_t>(end - 1)] >= 0 && found[static_cast<size_t>(end - 2)] >= 0) {
          hit = end;
          break;
        }
      }
      Live l{engine.new_request(), std::max<int64_t>(hit - window_blocks, 0), tokens};
      for (int64_t i = l.dropped; i < hit; ++i) {  // the hit's blocks hold this prompt's KV
        CHECK(content[found[static_cast<size_t>(i)]] == Tokens(tokens.begin(), tokens.begin() + (i + 1) * kBs));
      }
      const std::vector<int32_t> run(found.begin() + l.dropped, found.begin() + hit);
      require_ok(tagma_prefix_side_attach(engine.handle(), l.request, run.data(), static_cast<int64_t>(run.size())),
                 "side_attach");
      hits += hit - l.dropped;
      const int64_t need = (static_cast<int64_t>(tokens.size()) + kBs - 1) / kBs - hit;
      const tagma_stats s = engine.stats();
      if (s.free_blocks + s.cached_only_blocks < need) {
        engine.release(l.request);
        continue;
      }
      if (need > 0) engine.append(l.request, need);
      const std::vector<int32_t> own = engine.blocks(l.request);
      for (int64_t i = hit; i < static_cast<int64_t>(tokens.size()) / kBs; ++i) {
        content[own[static_cast<size_t>(i - l.dropped)]] = Tokens(tokens.begin(), tokens.begin() + (i + 1) * kBs);
      }
      keyed_insert(engine, l.request, l.dropped, hit, static_cast<int64_t>(tokens.size()) / kBs, tokens);
      live.push_back(l);
    } else if (op < 7 && !live.empty()) {  // the window moves: drop all but its last blocks
      Live& l = live[rng() % live.size()];
      const int64_t logical = l.dropped + static_cast<int64_t>(engine.blocks(l.request).size());
      const int64_t keep_from = std::max<int64_t>(logical - window_blocks, l.dropped);
      if (keep_from > l.dropped) {
        require_ok(tagma_request_free_front(engine.handle(), l.request, keep_from - l.dropped), "free_front");
        l.dropped = keep_from;
      }
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      engine.release(live[i].request);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (step % 20 == 0) check_keyed_invariants(engine);
  }
  for (const Live& l : live) engine.release(l.request);
  check_keyed_invariants(engine);
  CHECK_EQ(engine.stats().used_blocks, 0);
  CHECK(hits > 0);
  CHECK(side_stats(engine).evicted_blocks > 0);
}
