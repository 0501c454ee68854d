// tagma_fuzz: random and adversarial call sequences over the whole C ABI, checked against a reference model.
//
//   tagma_fuzz [--seed N] [--seconds S] [--iterations N] [--first-episode E] [--verbose]
// (--first-episode E starts at episode E: each episode seeds itself from the seed and its number, and also draws
// from the previous episodes' destroyed handles, so replay a finding in episode E from E-1)
//
// Episodes: an engine is created (random pool, align, policy; hostile arguments first), driven by a few hundred
// random calls, then destroyed (its stale handle is then tried). Every call gets hostile values with some
// probability: zero, negative, INT64_MAX / INT64_MIN counts, huge growth hints, stale or unknown handles,
// released or unknown request ids, out-of-range and duplicate block ids, null pointers where the ABI checks
// them, out-of-range enum values. After every call:
//   - the status is one of the TAGMA_* codes and never TAGMA_E_INTERNAL (nothing here fails to allocate);
//   - on an error, the engine's visible state (stats, free ranges, LRU, reference counts) is unchanged;
//   - the model (the live requests and the blocks each holds, in logical order) matches the engine:
//     request references per block = the live requests holding it; free + cache-only + used = usable;
//     the free list is coalesced, in the usable space, and holds exactly the unreferenced blocks; the LRU
//     holds exactly the cache-only blocks; appended blocks are in the usable space, distinct and were held
//     by no request (never double-owned); a released request's blocks lose its reference;
//   - with the prefix index: cache references are 0 or 1 and their number is the index's node count;
//     lookup ids are indexed blocks in range.
// The pure functions (slot mapping, coordinates) are checked against each other and against a 128-bit
// reference. A finding prints the seed, episode and step and aborts (a non-zero exit under any build).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tagma.h"

namespace {

constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();

uint64_t g_seed = 0;
int64_t g_episode = 0;
int64_t g_step = 0;
const char* g_call = "";
const char* g_mutation = "";  // the step's mutating call, and its status (a finding in a read names both)
tagma_status g_mutation_status = TAGMA_OK;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING (seed %" PRIu64 ", episode %" PRId64 ", step %" PRId64 ", call %s): %s\n",
               g_seed, g_episode, g_step, g_call, what.c_str());
  std::fprintf(stderr, "  last error: %s\n", tagma_last_error());
  std::fprintf(stderr, "  the step's mutating call: %s (status %d)\n", g_mutation, static_cast<int>(g_mutation_status));
  std::abort();
}

void expect(bool condition, const std::string& what) {
  if (!condition) finding(what);
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  uint64_t u64() { return gen(); }
  int64_t range(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(gen) < p; }
  // A hostile int64: the edges of the type and of small counts.
  int64_t hostile() {
    static const int64_t values[] = {0, -1, -2, kMin64, kMin64 + 1, kMax64, kMax64 - 1, int64_t{1} << 62,
                                     int64_t{1} << 40, int64_t{1} << 32, (int64_t{1} << 32) + 1,
                                     std::numeric_limits<int32_t>::max(),
                                     int64_t{std::numeric_limits<int32_t>::max()} + 1, kMax64 / 100 + 1,
                                     std::numeric_limits<int32_t>::min()};
    return values[range(0, sizeof(values) / sizeof(values[0]) - 1)];
  }
  int32_t hostile32() {
    static const int32_t values[] = {-1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                                     0, 1 << 30};
    return values[range(0, sizeof(values) / sizeof(values[0]) - 1)];
  }
};

// Per function: calls that succeeded and that failed (the coverage report).
std::map<std::string, std::pair<int64_t, int64_t>> g_coverage;

void check_status(tagma_status status) {
  auto& counts = g_coverage[g_call];
  ++(status == TAGMA_OK ? counts.first : counts.second);
  expect(status >= TAGMA_OK && status <= TAGMA_E_INTERNAL, "status " + std::to_string(status) + " is no TAGMA_* code");
  expect(status != TAGMA_E_INTERNAL, "TAGMA_E_INTERNAL");
  if (status != TAGMA_OK) {
    const std::string message = tagma_last_error();
    expect(message.rfind(g_call, 0) == 0, "last error does not name the call: " + message);
  }
}

// Everything the ABI shows about an engine (request-level state is checked against the model).
struct State {
  tagma_stats stats{};
  tagma_prefix_stats prefix{};
  tagma_prefix_side_stats side{};
  std::vector<int32_t> req_refs, cache_refs, free_ranges, lru;
  bool same_as(const State& o) const {
    return std::memcmp(&stats, &o.stats, sizeof(stats)) == 0 && req_refs == o.req_refs &&
           cache_refs == o.cache_refs && free_ranges == o.free_ranges && lru == o.lru &&
           prefix.indexed_blocks == o.prefix.indexed_blocks && prefix.namespaces == o.prefix.namespaces &&
           prefix.eviction_mode == o.prefix.eviction_mode && prefix.inserted_blocks == o.prefix.inserted_blocks &&
           prefix.evicted_blocks == o.prefix.evicted_blocks && prefix.clears == o.prefix.clears &&
           side.side_groups == o.side.side_groups && side.cached_blocks == o.side.cached_blocks &&
           side.inserted_blocks == o.side.inserted_blocks && side.evicted_blocks == o.side.evicted_blocks;
  }
};

struct Model {
  tagma_engine_handle h = 0;
  int64_t num_blocks = 0;
  int64_t align = 1;
  int64_t first_usable = 1;
  int64_t end_usable = 0;
  bool prefix = false;
  int64_t block_size = 0;
  int32_t side_groups = 0;            // the prefix index's side groups (0: not enabled)
  bool keyed = false;                 // ... enabled as keyed side groups
  std::set<uint64_t> attached;        // requests lookup_attach gave a place in the index (free_front refuses them)
  std::map<uint64_t, std::vector<int32_t>> requests;  // live: blocks in logical order
  std::map<uint64_t, int> family;                     // token family per request (prefix tokens)
  std::map<uint64_t, uint64_t> ns;                    // namespace fixed by a request's first insert/attach
  std::vector<uint64_t> released;
  std::vector<tagma_engine_handle> destroyed;
};

int32_t token_at(int family, int64_t i) {
  // Families share their first blocks (prompt templates), then diverge; a small alphabet makes collisions.
  if (i < 6) return static_cast<int32_t>(i % 3);
  return static_cast<int32_t>((family * 31 + i * 7) % 5);
}

std::vector<int32_t> tokens_of(int family, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = token_at(family, i);
  return t;
}

State read_state(const Model& m) {
  State s;
  g_call = "tagma_engine_stats";
  expect(tagma_engine_stats(m.h, &s.stats) == TAGMA_OK, "stats failed");
  const auto n = static_cast<size_t>(m.num_blocks);
  s.req_refs.assign(n, -1);
  s.cache_refs.assign(n, -1);
  g_call = "tagma_block_state";
  expect(tagma_block_state(m.h, s.req_refs.data(), s.cache_refs.data(), m.num_blocks) == TAGMA_OK, "block_state");
  int64_t total = -1;
  s.free_ranges.assign(2 * n + 2, -1);
  g_call = "tagma_free_ranges";
  expect(tagma_free_ranges(m.h, s.free_ranges.data(), m.num_blocks + 1, &total) == TAGMA_OK, "free_ranges");
  expect(total >= 0 && total <= m.num_blocks, "free range count");
  s.free_ranges.resize(static_cast<size_t>(2 * total));
  s.lru.assign(n, -1);
  g_call = "tagma_lru_order";
  expect(tagma_lru_order(m.h, s.lru.data(), m.num_blocks, &total) == TAGMA_OK, "lru_order");
  expect(total >= 0 && total <= m.num_blocks, "lru count");
  s.lru.resize(static_cast<size_t>(total));
  if (m.prefix) {
    g_call = "tagma_prefix_stats_get";
    expect(tagma_prefix_stats_get(m.h, &s.prefix) == TAGMA_OK, "prefix stats");
    g_call = "tagma_prefix_side_stats_get";
    expect(tagma_prefix_side_stats_get(m.h, &s.side) == TAGMA_OK, "side stats");
  }
  return s;
}

// The invariants, and the model's requests against the engine's.
void check_model(const Model& m, const State& s) {
  const auto n = static_cast<size_t>(m.num_blocks);
  std::vector<int32_t> expected_refs(n, 0);
  for (const auto& [id, blocks] : m.requests) {
    std::set<int32_t> seen;
    for (const int32_t b : blocks) {
      expect(b >= m.first_usable && b < m.end_usable, "request block outside the usable space");
      expect(seen.insert(b).second, "a request holds a block twice");
      ++expected_refs[static_cast<size_t>(b)];
    }
    int64_t count = -1;
    g_call = "tagma_request_num_blocks";
    expect(tagma_request_num_blocks(m.h, id, &count) == TAGMA_OK, "num_blocks of a live request");
    expect(count == static_cast<int64_t>(blocks.size()), "request block count differs from the model");
    if (count > 0) {
      std::vector<int32_t> got(static_cast<size_t>(count), -1);
      g_call = "tagma_request_blocks";
      expect(tagma_request_blocks(m.h, id, 0, count, got.data()) == TAGMA_OK, "request_blocks");
      expect(got == blocks, "request blocks differ from the model");
    }
  }
  expect(s.req_refs == expected_refs, "request references differ from the live requests' blocks");
  int64_t used = 0, cache_only = 0, unreferenced = 0, cache_nodes = 0;
  for (size_t b = 0; b < n; ++b) {
    const auto block = static_cast<int64_t>(b);
    const bool usable = block >= m.first_usable && block < m.end_usable;
    expect(s.cache_refs[b] >= 0, "negative cache references");
    if (!usable) {
      expect(s.req_refs[b] == 0 && s.cache_refs[b] == 0, "a block outside the usable space is referenced");
      continue;
    }
    if (s.req_refs[b] > 0) ++used;
    if (s.req_refs[b] == 0 && s.cache_refs[b] > 0) ++cache_only;
    if (s.req_refs[b] == 0 && s.cache_refs[b] == 0) ++unreferenced;
    if (s.cache_refs[b] > 0) ++cache_nodes;
    if (m.prefix) expect(s.cache_refs[b] <= 1, "an indexed block with more than one cache reference");
  }
  const tagma_stats& st = s.stats;
  expect(st.num_blocks == m.num_blocks, "stats.num_blocks");
  expect(st.usable_blocks == m.end_usable - m.first_usable, "stats.usable_blocks");
  expect(st.free_blocks + st.cached_only_blocks + st.used_blocks == st.usable_blocks, "free + cached + used != usable");
  expect(st.used_blocks == used, "stats.used_blocks");
  expect(st.cached_only_blocks == cache_only, "stats.cached_only_blocks");
  expect(st.free_blocks == unreferenced, "stats.free_blocks != unreferenced blocks");
  expect(st.live_requests == static_cast<int64_t>(m.requests.size()), "stats.live_requests");
  // Free list: sorted, coalesced, exactly the unreferenced blocks.
  int64_t free_sum = 0, prev_end = -1, largest = 0;
  for (size_t i = 0; i < s.free_ranges.size(); i += 2) {
    const int64_t start = s.free_ranges[i], count = s.free_ranges[i + 1];
    expect(count > 0 && start >= m.first_usable && start + count <= m.end_usable, "free range out of bounds");
    expect(start > prev_end, "free ranges overlap, touch or are unsorted");
    for (int64_t b = start; b < start + count; ++b) {
      expect(s.req_refs[static_cast<size_t>(b)] == 0 && s.cache_refs[static_cast<size_t>(b)] == 0,
             "a referenced block in the free list");
    }
    free_sum += count;
    largest = std::max(largest, count);
    prev_end = start + count;
  }
  expect(free_sum == st.free_blocks, "free list sum != free_blocks");
  expect(static_cast<int64_t>(s.free_ranges.size() / 2) == st.free_ranges, "stats.free_ranges");
  expect(largest == st.largest_free_range, "stats.largest_free_range");
  // LRU: exactly the cache-only blocks, once each.
  std::set<int32_t> lru(s.lru.begin(), s.lru.end());
  expect(lru.size() == s.lru.size(), "a block twice in the LRU");
  expect(static_cast<int64_t>(s.lru.size()) == cache_only, "LRU size != cache-only blocks");
  for (const int32_t b : s.lru) {
    expect(b >= 0 && b < m.num_blocks && s.req_refs[static_cast<size_t>(b)] == 0 &&
               s.cache_refs[static_cast<size_t>(b)] > 0,
           "an LRU block that is not cache-only");
  }
  if (m.prefix) {
    expect(s.prefix.indexed_blocks + s.side.cached_blocks == cache_nodes,
           "indexed + side blocks != blocks with a cache reference");
    expect(s.side.side_groups == m.side_groups, "side groups differ from the model");
  }
}

// Fresh (never appended) blocks of an append: in the usable space, distinct, held by no request before.
void check_new_blocks(const Model& m, const State& before, const std::vector<int32_t>& blocks) {
  std::set<int32_t> seen;
  for (const int32_t b : blocks) {
    expect(b >= m.first_usable && b < m.end_usable, "appended block " + std::to_string(b) + " out of range");
    expect(seen.insert(b).second, "an append returned a block twice");
    expect(before.req_refs[static_cast<size_t>(b)] == 0, "appended block " + std::to_string(b) + " was in use");
  }
}

// ---- the fuzz driver

struct Fuzzer {
  Rng rng;
  Model m;
  explicit Fuzzer(uint64_t seed) : rng(seed) {}

  uint64_t pick_request(bool allow_bad = true) {
    if (allow_bad && rng.chance(0.12)) {
      switch (rng.range(0, 4)) {
        case 0: return 0;
        case 1: return ~uint64_t{0};
        case 2: return m.released.empty() ? 1 : m.released[static_cast<size_t>(rng.range(0, m.released.size() - 1))];
        case 3: return (uint64_t{1} << 32) + 1;
        default: return rng.u64();
      }
    }
    if (m.requests.empty()) return 12345678;
    auto it = m.requests.begin();
    std::advance(it, rng.range(0, static_cast<int64_t>(m.requests.size()) - 1));
    return it->first;
  }
  tagma_engine_handle pick_handle() {
    if (!rng.chance(0.04)) return m.h;
    switch (rng.range(0, 3)) {
      case 0: return 0;
      case 1: return ~tagma_engine_handle{0};
      case 2: return m.destroyed.empty() ? m.h + 100000 : m.destroyed[static_cast<size_t>(rng.range(0, m.destroyed.size() - 1))];
      default: return m.h + (tagma_engine_handle{1} << 32);
    }
  }
  int64_t pick_count(int64_t typical) {
    if (rng.chance(0.08)) return rng.hostile();
    if (rng.chance(0.05)) return m.num_blocks + rng.range(0, 3);
    return rng.range(1, std::max<int64_t>(typical, 1)) * (rng.chance(0.8) ? m.align : 1);
  }
  int64_t pick_hint() {
    if (rng.chance(0.1)) return rng.hostile();
    if (rng.chance(0.4)) return 0;
    return rng.range(1, 3 * m.num_blocks);
  }
  int32_t pick_block() {
    if (rng.chance(0.1)) return rng.hostile32();
    if (rng.chance(0.1)) return static_cast<int32_t>(m.num_blocks + rng.range(0, 2));
    return static_cast<int32_t>(rng.range(0, m.num_blocks - 1));
  }

  // Runs one mutating call: on error the state must be unchanged.
  template <class Call>
  tagma_status mutate(const char* name, const State& before, Call&& call) {
    g_call = name;
    g_mutation = name;
    const tagma_status status = call();
    g_mutation_status = status;
    g_call = name;
    check_status(status);
    if (status != TAGMA_OK) {
      const State after = read_state(m);
      if (!after.same_as(before)) finding(std::string("state changed by a failed ") + name);
    }
    g_call = name;
    return status;
  }

  void create_engine() {
    // Hostile creation arguments first: each must fail with INVALID_ARG and create nothing.
    tagma_engine_handle h = 0;
    g_call = "tagma_engine_create";
    for (int i = 0; i < 2; ++i) {
      const int64_t nb = rng.chance(0.5) ? rng.hostile() : rng.range(2, 64);
      const int64_t al = rng.chance(0.5) ? rng.hostile() : rng.range(1, 4);
      const int32_t pol = rng.chance(0.5) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 3));
      if (nb > (int64_t{1} << 22)) continue;  // a valid huge pool would allocate gigabytes
      const tagma_status status = tagma_engine_create(nb, al, pol, rng.chance(0.1) ? nullptr : &h);
      check_status(status);
      if (status == TAGMA_OK) {
        g_call = "tagma_engine_destroy";
        check_status(tagma_engine_destroy(h));
        g_call = "tagma_engine_create";
      }
    }
    m = Model{};
    m.num_blocks = rng.chance(0.2) ? rng.range(2, 8) : rng.range(9, 200);
    m.align = rng.chance(0.75) ? 1 : rng.range(2, 4);
    while (m.num_blocks / m.align * m.align <= m.align) m.num_blocks += m.align;
    const auto policy = static_cast<int32_t>(rng.range(0, 3));
    expect(tagma_engine_create(m.num_blocks, m.align, policy, &m.h) == TAGMA_OK, "engine create");
    m.first_usable = m.align;
    m.end_usable = m.num_blocks / m.align * m.align;
  }

  void step() {
    const State before = read_state(m);
    g_mutation = "(none yet)";
    g_mutation_status = TAGMA_OK;
    const int op = static_cast<int>(rng.range(0, 25));
    switch (op) {
      case 0: case 1: {  // create
        uint64_t id = 0;
        const bool null_out = rng.chance(0.05);
        const tagma_status st = mutate("tagma_request_create", before,
                                       [&] { return tagma_request_create(pick_handle(), null_out ? nullptr : &id); });
        if (st == TAGMA_OK) {
          expect(m.requests.count(id) == 0 && id != 0, "request id reused");
          m.requests[id] = {};
          m.family[id] = static_cast<int>(rng.range(0, 3));
        }
        break;
      }
      case 2: {  // release
        const uint64_t id = pick_request();
        const tagma_engine_handle h = pick_handle();
        const tagma_status st = mutate("tagma_request_release", before, [&] { return tagma_request_release(h, id); });
        if (st == TAGMA_OK) {
          expect(h == m.h && m.requests.count(id) == 1, "release of an unknown id succeeded");
          m.requests.erase(id);
          m.released.push_back(id);
        } else {
          expect(h != m.h || m.requests.count(id) == 0, "release of a live request failed");
        }
        break;
      }
      case 3: case 4: case 5: {  // append
        const uint64_t id = pick_request();
        const int64_t count = pick_count(8);
        const bool small = count > 0 && count <= m.num_blocks;
        std::vector<int32_t> out(small ? static_cast<size_t>(count) : 0, -1), evicted(out.size(), -1);
        int64_t num_evicted = -1;
        const bool with_out = small && rng.chance(0.9);
        const tagma_status st = mutate("tagma_request_append", before, [&] {
          return tagma_request_append(pick_handle(), id, count, with_out ? out.data() : nullptr,
                                      with_out ? evicted.data() : nullptr, rng.chance(0.9) ? &num_evicted : nullptr);
        });
        if (st == TAGMA_OK) {
          expect(small, "an append of a count outside (0, num_blocks] succeeded");
          if (with_out && !m.prefix && num_evicted >= 0) {  // without the index: LRU order, exactly
            for (int64_t i = 0; i < num_evicted; ++i) {
              expect(evicted[static_cast<size_t>(i)] == before.lru[static_cast<size_t>(i)], "evicted out of LRU order");
            }
          }
          if (!with_out) out = fetch_tail(id, count);
          check_new_blocks(m, before, out);
          auto& blocks = m.requests[id];
          blocks.insert(blocks.end(), out.begin(), out.end());
        }
        break;
      }
      case 6: case 7: case 8: {  // append_runs
        const uint64_t id = pick_request();
        const int64_t count = pick_count(8);
        const int64_t hint = pick_hint();
        const bool small = count > 0 && count <= m.num_blocks;
        int64_t capacity = count;
        if (rng.chance(0.1)) capacity = small && rng.chance(0.5) ? kMax64 : (count > kMin64 ? count - 1 : count);
        std::vector<int32_t> runs(2 * static_cast<size_t>(small ? count : 1), -1);
        int64_t num_runs = -1;
        const tagma_status st = mutate("tagma_request_append_runs", before, [&] {
          return tagma_request_append_runs(pick_handle(), id, count, hint, rng.chance(0.03) ? nullptr : runs.data(),
                                           capacity, rng.chance(0.03) ? nullptr : &num_runs);
        });
        if (st == TAGMA_OK) {
          expect(small && num_runs >= 1 && num_runs <= count, "append_runs: runs");
          std::vector<int32_t> blocks;
          for (int64_t r = 0; r < num_runs; ++r) {
            expect(runs[2 * r + 1] > 0, "empty run");
            for (int32_t k = 0; k < runs[2 * r + 1]; ++k) blocks.push_back(runs[2 * r] + k);
          }
          expect(static_cast<int64_t>(blocks.size()) == count, "append_runs: runs do not sum to count");
          check_new_blocks(m, before, blocks);
          auto& held = m.requests[id];
          held.insert(held.end(), blocks.begin(), blocks.end());
        }
        break;
      }
      case 9: case 10: batch(before); break;
      case 11: attach(before); break;
      case 12: queries(); break;
      case 13: case 14: cache_ops(before); break;
      case 15: {  // policy, admission
        if (rng.chance(0.5)) {
          const int32_t policy = rng.chance(0.2) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 3));
          mutate("tagma_engine_set_policy", before, [&] { return tagma_engine_set_policy(pick_handle(), policy); });
        } else {
          const int32_t percent = rng.chance(0.2) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 100));
          const int32_t pieces = rng.chance(0.2) ? rng.hostile32() : static_cast<int32_t>(rng.range(1, 4));
          mutate("tagma_engine_set_admission", before,
                 [&] { return tagma_engine_set_admission(pick_handle(), rng.chance(0.5) ? 0 : percent, pieces); });
        }
        break;
      }
      case 16: case 17: case 18: case 19: prefix_ops(before); break;
      case 20: slot_mapping(); break;
      case 21: coord(); break;
      case 22: inspection(); break;
      case 23: {  // free_front: a sliding window's start advancing
        const uint64_t id = pick_request();
        const auto live = m.requests.find(id);
        const int64_t held = live == m.requests.end() ? 0 : static_cast<int64_t>(live->second.size());
        const int64_t count = rng.chance(0.15) ? rng.hostile() : rng.range(0, held) / m.align * m.align;
        const tagma_engine_handle h = pick_handle();
        const tagma_status st =
            mutate("tagma_request_free_front", before, [&] { return tagma_request_free_front(h, id, count); });
        if (st == TAGMA_OK) {
          expect(h == m.h && live != m.requests.end() && m.attached.count(id) == 0,
                 "free_front of an unknown id or of a request in the index");
          expect(count >= 0 && count <= held && count % m.align == 0, "free_front of a bad count succeeded");
          auto& blocks = live->second;
          blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(count));
          for (size_t i = 0; i < blocks.size(); ++i) {
            int32_t physical = -1;
            expect(tagma_request_block(m.h, id, static_cast<int64_t>(i), &physical) == TAGMA_OK &&
                       physical == blocks[i],
                   "free_front: the kept blocks moved");
          }
        } else {
          // with the index, a request its walk has reached is refused (an insert may have reached it)
          expect(h != m.h || live == m.requests.end() || m.prefix || count < 0 || count > held ||
                     count % m.align != 0,
                 "free_front of a live request's own blocks failed");
        }
        break;
      }
      default: {  // grow a live request a little (keeps the pool busy)
        if (m.requests.empty()) break;
        const uint64_t id = pick_request(false);
        const int64_t count = m.align * rng.range(1, 3);
        std::vector<int32_t> out(static_cast<size_t>(count));
        const tagma_status st = mutate("tagma_request_append", before,
                                       [&] { return tagma_request_append(m.h, id, count, out.data(), nullptr, nullptr); });
        if (st == TAGMA_OK) {
          check_new_blocks(m, before, out);
          auto& blocks = m.requests[id];
          blocks.insert(blocks.end(), out.begin(), out.end());
        } else {
          expect(st == TAGMA_E_NO_SPACE, "append of a live request failed with other than NO_SPACE");
        }
        if (rng.chance(0.3) && m.requests.size() > 4) {  // and release one, so the pool cycles
          const uint64_t victim = pick_request(false);
          g_call = "tagma_request_release";
          expect(tagma_request_release(m.h, victim) == TAGMA_OK, "release");
          m.requests.erase(victim);
          m.released.push_back(victim);
        }
      }
    }
    check_model(m, read_state(m));
  }

  std::vector<int32_t> fetch_tail(uint64_t id, int64_t count) {
    int64_t total = 0;
    g_call = "tagma_request_num_blocks";
    expect(tagma_request_num_blocks(m.h, id, &total) == TAGMA_OK, "num_blocks");
    std::vector<int32_t> out(static_cast<size_t>(count));
    g_call = "tagma_request_blocks";
    expect(tagma_request_blocks(m.h, id, total - count, count, out.data()) == TAGMA_OK, "blocks");
    return out;
  }

  void batch(const State& before) {
    int64_t n = rng.chance(0.05) ? rng.hostile() : rng.range(0, 5);
    if (n > 5) n = -n;  // a positive num_requests past the arrays is the caller's bug: the ABI cannot see it
    const auto entries = static_cast<size_t>(std::clamp<int64_t>(n, 0, 5));
    std::vector<uint64_t> requests(std::max<size_t>(entries, 1));
    std::vector<int64_t> counts(requests.size()), hints(requests.size());
    int64_t total = 0;
    bool sane = true;
    for (size_t i = 0; i < entries; ++i) {
      requests[i] = rng.chance(0.3) ? 0 : pick_request();
      counts[i] = rng.chance(0.9) ? m.align * rng.range(1, 4) : pick_count(4);
      hints[i] = pick_hint();
      if (counts[i] <= 0 || counts[i] > m.num_blocks) sane = false;
      total += std::clamp<int64_t>(counts[i], 0, m.num_blocks);
    }
    int64_t capacity = total;
    if (rng.chance(0.08)) capacity = sane && rng.chance(0.5) ? kMax64 : total - 1;
    std::vector<int32_t> runs(2 * static_cast<size_t>(std::max<int64_t>(total, 1)), -1);
    std::vector<int64_t> offsets(entries + 1, -1);
    const std::vector<uint64_t> requests_before = requests;
    tagma_append_batch b{pick_handle(), rng.chance(0.03) ? nullptr : requests.data(),
                         rng.chance(0.03) ? nullptr : counts.data(), rng.chance(0.3) ? nullptr : hints.data(), n,
                         rng.chance(0.03) ? nullptr : runs.data(), capacity,
                         rng.chance(0.03) ? nullptr : offsets.data()};
    const bool null_batch = rng.chance(0.02);
    const tagma_status st = mutate("tagma_append_runs_batch", before,
                                   [&] { return tagma_append_runs_batch(null_batch ? nullptr : &b); });
    if (st != TAGMA_OK) {
      expect(requests == requests_before, "a failed batch changed requests[]");
      return;
    }
    expect(n >= 0 && n <= 5, "batch with a bad num_requests succeeded");
    std::vector<int32_t> all;
    expect(offsets[0] == 0, "run_offsets[0]");
    for (size_t i = 0; i < entries; ++i) {
      uint64_t id = requests[i];
      if (requests_before[i] == 0) {
        expect(id != 0 && m.requests.count(id) == 0, "batch created a reused id");
        m.requests[id] = {};
        m.family[id] = static_cast<int>(rng.range(0, 3));
      } else {
        expect(id == requests_before[i], "batch rewrote an existing id");
      }
      expect(offsets[i + 1] >= offsets[i], "run_offsets decrease");
      std::vector<int32_t> blocks;
      for (int64_t r = offsets[i]; r < offsets[i + 1]; ++r) {
        expect(runs[2 * r + 1] > 0, "empty batch run");
        for (int32_t k = 0; k < runs[2 * r + 1]; ++k) blocks.push_back(runs[2 * r] + k);
      }
      expect(static_cast<int64_t>(blocks.size()) == counts[i], "batch runs do not sum to the count");
      auto& held = m.requests[id];
      held.insert(held.end(), blocks.begin(), blocks.end());
      all.insert(all.end(), blocks.begin(), blocks.end());
    }
    check_new_blocks(m, before, all);
  }

  void attach(const State& before) {
    const uint64_t id = pick_request();
    std::vector<int32_t> ids;
    const int64_t k = rng.range(1, 4);
    for (int64_t i = 0; i < k; ++i) {
      if (rng.chance(0.5) && !before.lru.empty()) {
        ids.push_back(before.lru[static_cast<size_t>(rng.range(0, before.lru.size() - 1))]);
      } else if (rng.chance(0.6) && !m.requests.empty()) {
        const auto& other = m.requests.at(pick_request(false));
        ids.push_back(other.empty() ? pick_block() : other[static_cast<size_t>(rng.range(0, other.size() - 1))]);
      } else {
        ids.push_back(pick_block());
      }
    }
    const int64_t count = rng.chance(0.05) ? rng.hostile() : static_cast<int64_t>(ids.size());
    if (count > static_cast<int64_t>(ids.size())) return;  // the ABI cannot see the buffer's length
    const tagma_status st = mutate("tagma_request_attach", before, [&] {
      return tagma_request_attach(pick_handle(), id, rng.chance(0.03) ? nullptr : ids.data(), count);
    });
    if (st == TAGMA_OK) {
      auto& held = m.requests[id];
      for (const int32_t b : ids) {
        expect(before.req_refs[static_cast<size_t>(b)] > 0 || before.cache_refs[static_cast<size_t>(b)] > 0,
               "attached a free block");
        held.push_back(b);
      }
    }
  }

  void queries() {
    const uint64_t id = pick_request();
    const tagma_engine_handle h = pick_handle();
    const bool live = h == m.h && m.requests.count(id) == 1;
    const int64_t held = live ? static_cast<int64_t>(m.requests.at(id).size()) : 0;
    int64_t v = -1;
    g_call = "tagma_request_num_ranges";
    tagma_status st = tagma_request_num_ranges(h, id, rng.chance(0.05) ? nullptr : &v);
    check_status(st);
    std::vector<int32_t> ranges(3 * static_cast<size_t>(std::max<int64_t>(held, 1)), -1);
    int64_t capacity = rng.chance(0.1) ? rng.hostile() : rng.range(0, held);
    if (capacity > held) capacity = held;  // only negative or in-bounds capacities
    g_call = "tagma_request_ranges";
    st = tagma_request_ranges(h, id, rng.chance(0.05) ? nullptr : ranges.data(), capacity, &v);
    check_status(st);
    if (st == TAGMA_OK && live) {
      expect(capacity >= 0, "negative capacity accepted");
      // The copied ranges spell the model's blocks.
      int64_t logical = 0;
      for (int64_t r = 0; r < std::min(capacity, v); ++r) {
        expect(ranges[3 * r + 2] == logical, "range first_logical");
        for (int32_t k = 0; k < ranges[3 * r + 1]; ++k) {
          expect(m.requests.at(id)[static_cast<size_t>(logical++)] == ranges[3 * r] + k, "range block");
        }
      }
    }
    const int64_t logical = rng.chance(0.2) ? rng.hostile() : rng.range(-1, held);
    int32_t block = -7;
    g_call = "tagma_request_block";
    st = tagma_request_block(h, id, logical, rng.chance(0.03) ? nullptr : &block);
    check_status(st);
    if (st == TAGMA_OK) {
      expect(live && logical >= 0 && logical < held, "request_block accepted a bad logical");
      expect(block == m.requests.at(id)[static_cast<size_t>(logical)], "request_block differs from the model");
    }
    const int64_t first = rng.chance(0.2) ? rng.hostile() : rng.range(0, held);
    const int64_t count = rng.chance(0.2) ? rng.hostile() : rng.range(0, held);
    std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(held, 1)));
    g_call = "tagma_request_blocks";
    st = tagma_request_blocks(h, id, first, count, out.data());
    check_status(st);
    if (st == TAGMA_OK) {
      expect(live && count > 0 && first >= 0 && first + count <= held, "request_blocks accepted bad bounds");
      for (int64_t i = 0; i < count; ++i) {
        expect(out[static_cast<size_t>(i)] == m.requests.at(id)[static_cast<size_t>(first + i)], "request_blocks");
      }
    }
  }

  void cache_ops(const State& before) {
    const int op = static_cast<int>(rng.range(0, 3));
    if (op <= 1) {
      std::vector<int32_t> ids;
      std::vector<int32_t> cached;
      for (size_t b = 0; b < before.cache_refs.size(); ++b) {
        if (before.cache_refs[b] > 0) cached.push_back(static_cast<int32_t>(b));
      }
      for (int64_t i = rng.range(1, 4); i > 0; --i) {
        if (op == 1 && !cached.empty() && rng.chance(0.8)) {
          ids.push_back(cached[static_cast<size_t>(rng.range(0, cached.size() - 1))]);
        } else if (rng.chance(0.7) && !m.requests.empty()) {
          const auto& held = m.requests.at(pick_request(false));
          ids.push_back(held.empty() ? pick_block() : held[static_cast<size_t>(rng.range(0, held.size() - 1))]);
        } else if (rng.chance(0.5) && !before.lru.empty()) {
          ids.push_back(before.lru[static_cast<size_t>(rng.range(0, before.lru.size() - 1))]);
        } else {
          ids.push_back(pick_block());
        }
      }
      int64_t count = rng.chance(0.05) ? rng.hostile() : static_cast<int64_t>(ids.size());
      if (count > static_cast<int64_t>(ids.size())) count = static_cast<int64_t>(ids.size());
      const int32_t* p = rng.chance(0.03) ? nullptr : ids.data();
      const tagma_status st =
          op == 0 ? mutate("tagma_cache_mark", before, [&] { return tagma_cache_mark(pick_handle(), p, count); })
                  : mutate("tagma_cache_unmark", before, [&] { return tagma_cache_unmark(pick_handle(), p, count); });
      if (st == TAGMA_OK) expect(!m.prefix, "cache mark/unmark succeeded with the prefix index");
    } else if (op == 2) {
      const int64_t max_blocks = rng.chance(0.15) ? rng.hostile() : rng.range(1, 6);
      const bool with_out = max_blocks > 0 && max_blocks <= 6 && rng.chance(0.8);
      std::vector<int32_t> out(8, -1);
      int64_t num = -1;
      const tagma_status st = mutate("tagma_cache_evict", before, [&] {
        return tagma_cache_evict(pick_handle(), max_blocks, with_out ? out.data() : nullptr,
                                 rng.chance(0.03) ? nullptr : &num);
      });
      if (st == TAGMA_OK) {
        expect(!m.prefix && num >= 0 && num <= max_blocks && num <= static_cast<int64_t>(before.lru.size()), "evict count");
        for (int64_t i = 0; with_out && i < num; ++i) {
          expect(out[static_cast<size_t>(i)] == before.lru[static_cast<size_t>(i)], "evicted out of LRU order");
        }
      }
    } else {
      int64_t dropped = -1;
      mutate("tagma_cache_clear", before,
             [&] { return tagma_cache_clear(pick_handle(), rng.chance(0.2) ? nullptr : &dropped); });
    }
  }

  void prefix_ops(const State& before) {
    const int op = static_cast<int>(rng.range(0, 10));
    if (op >= 7) {
      side_ops(before);
      return;
    }
    if (op == 0 || (!m.prefix && rng.chance(0.5))) {
      const int64_t bs = rng.chance(0.1) ? rng.hostile() : rng.range(1, 4);
      const int32_t mode = rng.chance(0.1) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 1));
      const tagma_status st = mutate("tagma_prefix_enable", before,
                                     [&] { return tagma_prefix_enable(pick_handle(), bs, mode); });
      if (st == TAGMA_OK) {
        expect(!m.prefix && m.align == 1 && bs >= 1 && bs <= 65536 && (mode == 0 || mode == 1), "prefix_enable");
        m.prefix = true;
        m.block_size = bs;
      }
      return;
    }
    const uint64_t id = pick_request();
    const int family = m.family.count(id) ? m.family.at(id) : 0;
    const uint64_t ns = rng.chance(0.05) ? rng.u64() : (m.ns.count(id) ? m.ns.at(id) : static_cast<uint64_t>(family % 2));
    const int64_t held = m.requests.count(id) ? static_cast<int64_t>(m.requests.at(id).size()) : 0;
    const int64_t bs = std::max<int64_t>(m.block_size, 1);  // without the index every call is TAGMA_E_STATE
    switch (op) {
      case 1: {
        const int32_t mode = rng.chance(0.3) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 1));
        mutate("tagma_prefix_set_eviction_mode", before,
               [&] { return tagma_prefix_set_eviction_mode(pick_handle(), mode); });
        break;
      }
      case 2: {  // lookup
        const int64_t num_tokens = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12 * bs);
        const std::vector<int32_t> tokens = tokens_of(family, std::clamp<int64_t>(num_tokens, 0, 12 * bs));
        if (num_tokens > static_cast<int64_t>(tokens.size())) return;  // the ABI cannot see the buffer's length
        const int64_t max_blocks = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12);
        std::vector<int32_t> ids(13, -1);
        const bool with_ids = max_blocks >= 0 && max_blocks <= 12;
        int64_t hit = -1;
        const tagma_status st = mutate("tagma_prefix_lookup", before, [&] {
          return tagma_prefix_lookup(pick_handle(), ns, rng.chance(0.03) ? nullptr : tokens.data(), num_tokens,
                                     max_blocks, with_ids ? ids.data() : nullptr, rng.chance(0.03) ? nullptr : &hit);
        });
        if (st == TAGMA_OK) {
          expect(hit >= 0 && hit <= max_blocks && hit * bs <= num_tokens, "lookup hit count");
          for (int64_t i = 0; with_ids && i < hit; ++i) {
            const int32_t b = ids[static_cast<size_t>(i)];
            expect(b >= 1 && b < m.num_blocks && before.cache_refs[static_cast<size_t>(b)] == 1, "lookup id not indexed");
          }
        }
        break;
      }
      case 3: {  // lookup_attach on a fresh request
        uint64_t target = id;
        if (rng.chance(0.8)) {
          g_call = "tagma_request_create";
          expect(tagma_request_create(m.h, &target) == TAGMA_OK, "create");
          m.requests[target] = {};
          m.family[target] = static_cast<int>(rng.range(0, 3));
        }
        const State now = read_state(m);
        const int fam = m.family.count(target) ? m.family.at(target) : 0;
        const int64_t num_tokens = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12 * bs);
        const std::vector<int32_t> tokens = tokens_of(fam, std::clamp<int64_t>(num_tokens, 0, 12 * bs));
        if (num_tokens > static_cast<int64_t>(tokens.size())) return;
        const int64_t max_blocks = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12);
        const uint64_t tns = rng.chance(0.05) ? rng.u64() : static_cast<uint64_t>(fam % 2);
        int64_t hit = -1;
        const tagma_status st = mutate("tagma_prefix_lookup_attach", now, [&] {
          return tagma_prefix_lookup_attach(pick_handle(), tns, target, tokens.data(), num_tokens, max_blocks,
                                            rng.chance(0.03) ? nullptr : &hit);
        });
        if (st == TAGMA_OK) {
          expect(m.requests.count(target) == 1 && m.requests.at(target).empty(), "lookup_attach on a holding request");
          expect(hit >= 0 && hit <= max_blocks, "lookup_attach hit");
          m.requests[target] = hit > 0 ? fetch_tail(target, hit) : std::vector<int32_t>{};
          m.ns[target] = tns;
          m.attached.insert(target);
          for (const int32_t b : m.requests[target]) {
            expect(now.cache_refs[static_cast<size_t>(b)] == 1, "lookup_attach attached an unindexed block");
          }
        }
        break;
      }
      case 4: case 5: {  // insert
        const int64_t len = held * bs + rng.range(0, bs);
        const std::vector<int32_t> all = tokens_of(family, len);
        int64_t start = rng.chance(0.5) ? 0 : rng.range(0, len);
        if (rng.chance(0.08)) start = rng.hostile();
        int64_t num = (start >= 0 && start <= len) ? len - start : 0;
        if (rng.chance(0.08)) num = rng.hostile();
        if (start >= 0 && start <= len && num > len - start) return;  // the ABI cannot see the buffer's length
        const int32_t* p = (start >= 0 && start <= len) ? all.data() + start : all.data();
        if (start > len && num > 0) return;  // a negative start is refused before any token is read
        int64_t indexed = -1;
        const tagma_status st = mutate("tagma_prefix_insert", before, [&] {
          return tagma_prefix_insert(pick_handle(), ns, id, rng.chance(0.03) ? nullptr : p, start, num,
                                     rng.chance(0.2) ? nullptr : &indexed);
        });
        if (st == TAGMA_OK) {
          m.ns.emplace(id, ns);
          expect(m.requests.count(id) == 1, "insert into an unknown request");
        }
        break;
      }
      default: {
        int64_t dropped = -1;
        mutate("tagma_prefix_clear", before,
               [&] { return tagma_prefix_clear(pick_handle(), rng.chance(0.3) ? nullptr : &dropped); });
      }
    }
  }

  // The prefix index's side groups: enable, insert (a side request's blocks at a full request's nodes),
  // lookup at the nodes of a walk, attach what was found to a fresh request.
  void side_ops(const State& before) {
    const int op = static_cast<int>(rng.range(0, 5));
    if (op == 0 || (m.side_groups == 0 && rng.chance(0.6))) {
      const int32_t groups = rng.chance(0.15) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 3));
      const bool keyed = rng.chance(0.5);
      const tagma_status st = mutate(keyed ? "tagma_prefix_keyed_enable" : "tagma_prefix_side_enable", before, [&] {
        return keyed ? tagma_prefix_keyed_enable(pick_handle(), groups) : tagma_prefix_side_enable(pick_handle(), groups);
      });
      if (st == TAGMA_OK) {
        expect(m.prefix && m.side_groups == 0 && groups >= 1 && groups <= 64, "side_enable");
        m.side_groups = groups;
        m.keyed = keyed;
      }
      return;
    }
    if (op >= 4) {
      keyed_ops(before, op == 4);
      return;
    }
    const int32_t group = rng.chance(0.1) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 2));
    const int64_t bs = std::max<int64_t>(m.block_size, 1);
    const int family = static_cast<int>(rng.range(0, 3));
    const std::vector<int32_t> tokens = tokens_of(family, 12 * bs);
    if (op == 1) {  // insert
      const uint64_t full = pick_request();
      const uint64_t side = pick_request();
      const int64_t first = rng.chance(0.1) ? rng.hostile() : rng.range(0, 3);
      int64_t start = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12);
      int64_t end = rng.chance(0.1) ? rng.hostile() : rng.range(0, 14);
      std::vector<uint8_t> mask(16);
      for (uint8_t& bit : mask) bit = rng.chance(0.6) ? 1 : 0;
      const bool with_mask = start >= 0 && end >= start && end - start <= 16 && rng.chance(0.5);
      int64_t cached = -1;
      const tagma_status st = mutate("tagma_prefix_side_insert", before, [&] {
        return tagma_prefix_side_insert(pick_handle(), full, group, side, first, start, end,
                                        with_mask ? mask.data() : nullptr, rng.chance(0.2) ? nullptr : &cached);
      });
      if (st == TAGMA_OK) {
        expect(m.side_groups > 0 && group >= 0 && group < m.side_groups && full != side, "side_insert succeeded");
        expect(m.requests.count(full) == 1 && m.requests.count(side) == 1, "side_insert of an unknown request");
        expect(cached == -1 || (cached >= 0 && cached <= std::max<int64_t>(end - start, 0)), "side_insert count");
      }
      return;
    }
    // lookup the nodes of a walk, then attach the side blocks found (or hostile ids) to a fresh request
    std::vector<int32_t> nodes(13, -1);
    int64_t hit = 0;
    g_call = "tagma_prefix_lookup";
    if (m.prefix) {
      expect(tagma_prefix_lookup(m.h, static_cast<uint64_t>(family % 2), tokens.data(), static_cast<int64_t>(tokens.size()),
                                 12, nodes.data(), &hit) == TAGMA_OK, "lookup for side");
    }
    nodes.resize(static_cast<size_t>(hit));
    if (rng.chance(0.1)) nodes.push_back(static_cast<int32_t>(rng.chance(0.5) ? rng.hostile32() : rng.range(0, m.num_blocks)));
    std::vector<int32_t> found(nodes.size(), -2);
    const tagma_status st = mutate("tagma_prefix_side_lookup", before, [&] {
      return tagma_prefix_side_lookup(pick_handle(), group, rng.chance(0.03) ? nullptr : nodes.data(),
                                      static_cast<int64_t>(nodes.size()), found.data());
    });
    if (st != TAGMA_OK || op == 2) {
      if (st == TAGMA_OK) {
        for (const int32_t b : found) {
          expect(b == -1 || (b >= 1 && b < m.num_blocks && before.cache_refs[static_cast<size_t>(b)] == 1),
                 "side_lookup returned an uncached block");
        }
      }
      return;
    }
    std::vector<int32_t> run;
    for (const int32_t b : found) {
      if (b >= 0) run.push_back(b);
    }
    attach_found(run, family);
  }

  // Attaches the side blocks a lookup found (plus, sometimes, a hostile id) to a fresh request (or any).
  void attach_found(std::vector<int32_t> run, int family) {
    if (rng.chance(0.1)) run.push_back(static_cast<int32_t>(rng.range(-2, m.num_blocks + 2)));
    uint64_t target = pick_request();
    if (rng.chance(0.8)) {
      g_call = "tagma_request_create";
      expect(tagma_request_create(m.h, &target) == TAGMA_OK, "create");
      m.requests[target] = {};
      m.family[target] = family;
    }
    const State now = read_state(m);
    const tagma_status attached = mutate("tagma_prefix_side_attach", now, [&] {
      return tagma_prefix_side_attach(pick_handle(), target, run.empty() ? nullptr : run.data(),
                                      static_cast<int64_t>(run.size()));
    });
    if (attached == TAGMA_OK) {
      expect(m.requests.count(target) == 1 && m.requests.at(target).empty(), "side_attach to a holding request");
      m.requests[target] = run;
      for (const int32_t b : run) expect(now.cache_refs[static_cast<size_t>(b)] == 1, "side_attach of an uncached block");
    }
  }

  // Where the keys and tokens passed to keyed_insert begin: block `start` (a hostile start reads nothing).
  static int64_t from_of(int64_t start) { return start >= 0 && start < 12 ? start : 0; }

  // Keyed side groups: chain keys, insert a request's blocks under them (`insert`), else look up and attach
  // what was found (or hostile ids) to a fresh request.
  void keyed_ops(const State& before, bool insert) {
    const int32_t group = rng.chance(0.1) ? rng.hostile32() : static_cast<int32_t>(rng.range(0, 2));
    const int64_t bs = std::max<int64_t>(m.block_size, 1);
    const int family = static_cast<int>(rng.range(0, 3));
    const uint64_t ns = static_cast<uint64_t>(family % 2);
    // every array holds more entries than any call below may read (the side request's blocks bound them)
    const int64_t entries = m.num_blocks + 16;
    std::vector<int32_t> tokens = tokens_of(family, entries * bs);
    std::vector<uint64_t> keys(2 * static_cast<size_t>(entries), 0);
    const int64_t count = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12);
    const tagma_status keyed = mutate("tagma_prefix_chain_keys", before, [&] {
      return tagma_prefix_chain_keys(pick_handle(), ns, nullptr, rng.chance(0.03) ? nullptr : tokens.data(),
                                     std::min<int64_t>(count, entries), rng.chance(0.03) ? nullptr : keys.data());
    });
    if (keyed == TAGMA_OK) expect(m.prefix && count >= 0, "chain_keys succeeded");
    if (insert) {
      const uint64_t side = pick_request();
      const int64_t first = rng.chance(0.1) ? rng.hostile() : rng.range(0, 3);
      const int64_t start = rng.chance(0.1) ? rng.hostile() : rng.range(0, 12);
      int64_t end = rng.chance(0.1) ? rng.hostile() : rng.range(0, 14);
      // A caller's arrays hold end - start entries, and the engine reads those of the side request's blocks,
      // [max(start, first), min(end, first + its blocks)) - start: a hostile end stays only where those reads
      // fit the arrays here (past them the call is the caller's overrun, not the engine's).
      const auto live = m.requests.find(side);
      if (live != m.requests.end() && start >= 0 && first >= 0 && end > start) {
        const auto held = static_cast<int64_t>(live->second.size());
        const int64_t last = end - first > held ? first + held : end;  // as the engine bounds it
        if (last > std::max(start, first) && last - start > entries - from_of(start)) end = rng.range(0, 14);
      }
      std::vector<uint8_t> mask(static_cast<size_t>(entries));
      for (uint8_t& bit : mask) bit = rng.chance(0.6) ? 1 : 0;
      // keys and tokens from block `start` on (a hostile start reads nothing: every position is refused)
      const int64_t from = from_of(start);
      int64_t cached = -1;
      const tagma_status st = mutate("tagma_prefix_keyed_insert", before, [&] {
        return tagma_prefix_keyed_insert(pick_handle(), group, side, first, start, end, keys.data() + 2 * from,
                                         tokens.data() + from * bs, rng.chance(0.5) ? mask.data() : nullptr,
                                         rng.chance(0.2) ? nullptr : &cached);
      });
      if (st == TAGMA_OK) {
        expect(m.keyed && group >= 0 && group < m.side_groups && m.requests.count(side) == 1, "keyed_insert succeeded");
        expect(cached == -1 || (cached >= 0 && cached <= std::max<int64_t>(end - start, 0)), "keyed_insert count");
      }
      return;
    }
    const int64_t lookups = keyed == TAGMA_OK ? std::min<int64_t>(count, entries) : rng.range(0, 12);
    std::vector<int32_t> found(static_cast<size_t>(entries), -2);
    const tagma_status st = mutate("tagma_prefix_keyed_lookup", before, [&] {
      return tagma_prefix_keyed_lookup(pick_handle(), group, keys.data(), tokens.data(),
                                       rng.chance(0.05) ? std::min<int64_t>(rng.hostile(), -1) : lookups,
                                       rng.chance(0.03) ? nullptr : found.data());
    });
    if (st != TAGMA_OK) return;
    std::vector<int32_t> run;
    for (int64_t i = 0; i < lookups; ++i) {
      const int32_t b = found[static_cast<size_t>(i)];
      if (b == -2) break;  // a count of 0 wrote nothing
      expect(b == -1 || (b >= 1 && b < m.num_blocks && before.cache_refs[static_cast<size_t>(b)] == 1),
             "keyed_lookup returned an uncached block");
      if (b >= 0 && std::find(run.begin(), run.end(), b) == run.end()) run.push_back(b);
    }
    attach_found(run, family);
  }

  // Slot mapping: the three functions over the live requests' ranges agree (and with a overflow-checked reference).
  void slot_mapping() {
    std::vector<int32_t> ranges, offsets{0}, qsl{0}, table, table_counts;
    std::vector<int64_t> positions;
    std::vector<std::vector<int32_t>> blocks_of;
    int64_t max_blocks = 0;
    for (const auto& [id, blocks] : m.requests) {
      if (blocks_of.size() >= 6) break;
      int64_t nr = 0;
      g_call = "tagma_request_ranges";
      std::vector<int32_t> r(3 * (blocks.size() + 1));
      expect(tagma_request_ranges(m.h, id, r.data(), static_cast<int64_t>(blocks.size()) + 1, &nr) == TAGMA_OK, "ranges");
      ranges.insert(ranges.end(), r.begin(), r.begin() + 3 * nr);
      offsets.push_back(static_cast<int32_t>(ranges.size() / 3));
      blocks_of.push_back(blocks);
      max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(blocks.size()));
    }
    const auto num_reqs = static_cast<int64_t>(blocks_of.size());
    int64_t block_size = rng.chance(0.1) ? rng.hostile() : rng.range(1, 16);
    if (rng.chance(0.05)) block_size = int64_t{1} << 58;  // slots overflow int64
    for (const auto& blocks : blocks_of) {
      const int64_t n = rng.range(0, 5);
      int64_t p0 = rng.range(0, static_cast<int64_t>(blocks.size() + 1) * std::clamp<int64_t>(block_size, 1, 16));
      if (rng.chance(0.05)) p0 = rng.chance(0.5) ? -1 : kMax64 - 2;
      for (int64_t t = 0; t < n; ++t) positions.push_back(p0 > kMax64 - t ? p0 : p0 + t);
      qsl.push_back(static_cast<int32_t>(positions.size()));
      for (int64_t i = 0; i < max_blocks; ++i) {
        table.push_back(i < static_cast<int64_t>(blocks.size()) ? blocks[static_cast<size_t>(i)] : 0);
      }
      table_counts.push_back(static_cast<int32_t>(blocks.size()));
    }
    if (rng.chance(0.05) && qsl.size() > 1) qsl[1] = -1;  // decreasing
    const auto num_tokens = static_cast<int64_t>(positions.size());
    const int64_t out_len = num_tokens + rng.range(0, 3);
    std::vector<int64_t> out_r(static_cast<size_t>(out_len) + 1, -9), out_p = out_r, out_s = out_r;
    positions.push_back(0);
    ranges.push_back(0);
    table.push_back(0);
    table_counts.push_back(0);
    g_call = "tagma_slot_mapping_ranges";
    const tagma_status sr = tagma_slot_mapping_ranges(ranges.data(), offsets.data(), num_reqs, qsl.data(),
                                                      positions.data(), block_size, out_r.data(), out_len);
    check_status(sr);
    g_call = "tagma_slot_mapping_paged";
    const tagma_status sp = tagma_slot_mapping_paged(table.data(), max_blocks, table_counts.data(), num_reqs, qsl.data(),
                                                     positions.data(), block_size, out_p.data(), out_len);
    check_status(sp);
    tagma_slot_mapping_batch b{ranges.data(), static_cast<int64_t>(ranges.size() / 3), offsets.data(), num_reqs,
                               qsl.data(), positions.data(), num_tokens, out_s.data(), out_len, num_reqs, block_size};
    g_call = "tagma_slot_mapping_step";
    const tagma_status ss = tagma_slot_mapping_step(rng.chance(0.03) ? nullptr : &b);
    check_status(ss);
    // The overflow-checked reference.
    bool valid = block_size > 0 && (qsl.size() < 2 || qsl[1] >= 0);
    std::vector<int64_t> ref(static_cast<size_t>(out_len), -1);
    for (int64_t r = 0; valid && r < num_reqs; ++r) {
      for (int32_t t = qsl[static_cast<size_t>(r)]; t < qsl[static_cast<size_t>(r) + 1]; ++t) {
        const int64_t pos = positions[static_cast<size_t>(t)];
        if (pos < 0) { valid = false; break; }
        const int64_t logical = pos / block_size;
        const auto& blocks = blocks_of[static_cast<size_t>(r)];
        if (logical >= static_cast<int64_t>(blocks.size())) continue;
        int64_t base = 0, slot = 0;
        if (__builtin_mul_overflow(int64_t{blocks[static_cast<size_t>(logical)]}, block_size, &base) ||
            __builtin_add_overflow(base, pos % block_size, &slot)) {
          valid = false;
          break;
        }
        ref[static_cast<size_t>(t)] = slot;
      }
    }
    if (sr == TAGMA_OK) {
      expect(valid, "slot_mapping_ranges accepted invalid input");
      expect(std::equal(ref.begin(), ref.end(), out_r.begin()), "slot_mapping_ranges differs from the reference");
    }
    if (sp == TAGMA_OK) {
      expect(valid, "slot_mapping_paged accepted invalid input");
      expect(std::equal(ref.begin(), ref.end(), out_p.begin()), "slot_mapping_paged differs from the reference");
    }
    if (ss == TAGMA_OK) {
      expect(valid, "slot_mapping_step accepted invalid input");
      expect(std::equal(ref.begin(), ref.end(), out_s.begin()), "slot_mapping_step differs from the reference");
    }
    if (block_size > 0 && block_size <= 16 && valid) {
      bool small_positions = true;
      for (int64_t t = 0; t < num_tokens; ++t) small_positions = small_positions && positions[static_cast<size_t>(t)] < (int64_t{1} << 40);
      if (small_positions) {
        expect(sr == TAGMA_OK && sp == TAGMA_OK, "slot mapping refused valid input");
      }
    }
  }

  void coord() {
    tagma_coord_layout layout{};
    auto field = [&](int64_t typical) { return rng.chance(0.2) ? rng.hostile() : rng.range(1, typical); };
    layout.num_layers = field(8);
    layout.num_blocks = field(1000);
    layout.block_size = field(64);
    layout.bytes_per_token = field(4096);
    const int64_t layer = rng.chance(0.2) ? rng.hostile() : rng.range(0, 8);
    const int64_t block = rng.chance(0.2) ? rng.hostile() : rng.range(0, 1000);
    const int64_t token = rng.chance(0.2) ? rng.hostile() : rng.range(0, 64);
    int64_t out = -1;
    g_call = "tagma_coord_offset";
    const tagma_status st = tagma_coord_offset(rng.chance(0.03) ? nullptr : &layout, layer, block, token, &out);
    check_status(st);
    const bool in_bounds = layout.num_layers > 0 && layout.num_blocks > 0 && layout.block_size > 0 &&
                           layout.bytes_per_token > 0 && layer >= 0 && layer < layout.num_layers && block >= 0 &&
                           block < layout.num_blocks && token >= 0 && token < layout.block_size;
    // The definition, step by step in int64 with overflow detection.
    int64_t a = 0, b = 0, c = 0, n = 0, offset = 0;
    const bool fits = !__builtin_mul_overflow(layer, layout.num_blocks, &a) && !__builtin_add_overflow(a, block, &b) &&
                      !__builtin_mul_overflow(b, layout.block_size, &c) && !__builtin_add_overflow(c, token, &n) &&
                      !__builtin_mul_overflow(n, layout.bytes_per_token, &offset);
    if (st == TAGMA_OK) {
      expect(in_bounds && fits, "coord_offset accepted an out-of-bounds or overflowing coordinate");
      expect(offset == out, "coord_offset differs from the reference");
    } else if (in_bounds && fits) {
      expect(st == TAGMA_E_INVALID_ARG, "coord_offset refused an in-bounds coordinate that fits");
    } else if (in_bounds) {
      expect(st == TAGMA_E_OVERFLOW || st == TAGMA_E_INVALID_ARG, "coord_offset overflow status");
    }
  }

  void inspection() {
    const tagma_engine_handle h = pick_handle();
    const int64_t capacity = rng.chance(0.2) ? rng.hostile() : rng.range(0, m.num_blocks);
    const bool fits = capacity >= 0 && capacity <= m.num_blocks;
    std::vector<int32_t> buf(2 * static_cast<size_t>(m.num_blocks) + 2);
    std::vector<int64_t> hist(static_cast<size_t>(m.num_blocks) + 2);
    int64_t total = -1;
    g_call = "tagma_free_ranges";
    check_status(tagma_free_ranges(h, rng.chance(0.05) ? nullptr : buf.data(), fits ? capacity : -1, &total));
    g_call = "tagma_lru_order";
    check_status(tagma_lru_order(h, buf.data(), fits ? capacity : -5, rng.chance(0.05) ? nullptr : &total));
    g_call = "tagma_ranges_histogram";
    check_status(tagma_ranges_histogram(h, rng.chance(0.05) ? nullptr : hist.data(), fits ? capacity : -1));
    g_call = "tagma_block_state";
    const int64_t cap = rng.chance(0.7) ? m.num_blocks : (fits ? capacity : m.num_blocks - 1);
    check_status(tagma_block_state(h, buf.data(), nullptr, cap));
    tagma_stats stats{};
    g_call = "tagma_engine_stats";
    check_status(tagma_engine_stats(h, rng.chance(0.1) ? nullptr : &stats));
    tagma_prefix_stats ps{};
    g_call = "tagma_prefix_stats_get";
    const tagma_status st = tagma_prefix_stats_get(h, rng.chance(0.1) ? nullptr : &ps);
    check_status(st);
    if (st == TAGMA_OK) expect(m.prefix, "prefix stats without the index");
  }

  void destroy_engine() {
    g_call = "tagma_engine_destroy";
    expect(tagma_engine_destroy(m.h) == TAGMA_OK, "destroy");
    const tagma_status again = tagma_engine_destroy(m.h);
    check_status(again);
    expect(again == TAGMA_E_INVALID_HANDLE, "double destroy");
    uint64_t id = 0;
    g_call = "tagma_request_create";
    expect(tagma_request_create(m.h, &id) == TAGMA_E_INVALID_HANDLE, "a destroyed handle still works");
    g_call = "tagma_request_release";
    expect(tagma_request_release(m.h, m.requests.empty() ? 1 : m.requests.begin()->first) == TAGMA_E_INVALID_HANDLE,
           "a destroyed handle still works");
  }
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  double seconds = 10.0;
  int64_t iterations = -1;
  int64_t first_episode = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--seed") {
      seed = std::strtoull(value(), nullptr, 0);
    } else if (arg == "--seconds") {
      seconds = std::strtod(value(), nullptr);
    } else if (arg == "--iterations") {
      iterations = std::strtoll(value(), nullptr, 0);
    } else if (arg == "--first-episode") {
      first_episode = std::strtoll(value(), nullptr, 0);
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr, "usage: tagma_fuzz [--seed N] [--seconds S] [--iterations N] [--first-episode E] [--verbose]\n");
      return 2;
    }
  }
  g_seed = seed;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<tagma_engine_handle> destroyed;
  int64_t steps = 0;
  for (g_episode = first_episode;; ++g_episode) {
    if (elapsed() >= seconds || (iterations >= 0 && steps >= iterations)) break;
    Fuzzer fuzzer(seed * 1000003 + static_cast<uint64_t>(g_episode));
    fuzzer.create_engine();
    fuzzer.m.destroyed = destroyed;
    const int64_t length = fuzzer.rng.range(50, 600);
    for (g_step = 0; g_step < length; ++g_step, ++steps) fuzzer.step();
    fuzzer.destroy_engine();
    destroyed.push_back(fuzzer.m.h);
    if (destroyed.size() > 16) destroyed.erase(destroyed.begin());
    if (verbose) std::printf("episode %" PRId64 ": %" PRId64 " steps\n", g_episode, length);
  }
  for (const auto& [name, counts] : g_coverage) {
    std::printf("  %-32s %9" PRId64 " ok %9" PRId64 " refused\n", name.c_str(), counts.first, counts.second);
  }
  std::printf("tagma_fuzz: seed %" PRIu64 ", %" PRId64 " episodes, %" PRId64 " calls checked in %.1f s, no finding\n",
              seed, g_episode, steps, elapsed());
  return 0;
}
