// Slot mapping: ranges vs the paged reference vs a direct expansion; padding; every validation error.
#include <algorithm>
#include <limits>
#include <random>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::require_ok;

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// A batch described both ways: ranges per request and a dense block table.
struct Batch {
  std::vector<int32_t> ranges;             // (physical_start, num_blocks, first_logical_block) triples
  std::vector<int32_t> req_range_offsets;  // num_reqs + 1
  std::vector<std::vector<int32_t>> blocks;  // physical ids per request, logical order
  std::vector<int32_t> query_start_loc{0};
  std::vector<int64_t> positions;
  int64_t block_size = 16;

  int64_t num_reqs() const { return static_cast<int64_t>(blocks.size()); }

  void add_request(const std::vector<std::pair<int32_t, int32_t>>& extents, const std::vector<int64_t>& tokens) {
    if (req_range_offsets.empty()) req_range_offsets.push_back(0);
    std::vector<int32_t> physical;
    for (const auto& [start, count] : extents) {
      ranges.insert(ranges.end(), {start, count, static_cast<int32_t>(physical.size())});
      for (int32_t i = 0; i < count; ++i) physical.push_back(start + i);
    }
    req_range_offsets.push_back(static_cast<int32_t>(ranges.size() / 3));
    blocks.push_back(physical);
    positions.insert(positions.end(), tokens.begin(), tokens.end());
    query_start_loc.push_back(static_cast<int32_t>(positions.size()));
  }

  std::vector<int32_t> num_blocks_per_req() const {
    std::vector<int32_t> counts;
    for (const auto& row : blocks) counts.push_back(static_cast<int32_t>(row.size()));
    return counts;
  }

  int64_t max_blocks() const {
    int64_t widest = 0;
    for (const auto& row : blocks) widest = std::max<int64_t>(widest, static_cast<int64_t>(row.size()));
    return widest;
  }

  std::vector<int32_t> block_table() const {
    std::vector<int32_t> table(static_cast<size_t>(num_reqs() * max_blocks()), 0);
    for (size_t r = 0; r < blocks.size(); ++r) {
      std::copy(blocks[r].begin(), blocks[r].end(), table.begin() + static_cast<int64_t>(r) * max_blocks());
    }
    return table;
  }

  tagma_status map_ranges(std::vector<int64_t>& out) const {
    return tagma_slot_mapping_ranges(ranges.data(), req_range_offsets.data(), num_reqs(), query_start_loc.data(),
                                     positions.data(), block_size, out.data(), static_cast<int64_t>(out.size()));
  }

  tagma_status map_paged(std::vector<int64_t>& out) const {
    const std::vector<int32_t> table = block_table();
    const std::vector<int32_t> counts = num_blocks_per_req();
    return tagma_slot_mapping_paged(table.data(), max_blocks(), counts.data(), num_reqs(), query_start_loc.data(),
                                    positions.data(), block_size, out.data(), static_cast<int64_t>(out.size()));
  }

  // The step form reads only each request's first (and last) position: positions must be consecutive runs.
  tagma_slot_mapping_batch step_batch(std::vector<int64_t>& out) const {
    tagma_slot_mapping_batch b{};
    b.ranges = ranges.data();
    b.ranges_capacity = static_cast<int64_t>(ranges.size() / 3);
    b.req_range_offsets = req_range_offsets.data();
    b.max_reqs = num_reqs();
    b.query_start_loc = query_start_loc.data();
    b.positions = positions.data();
    b.positions_capacity = static_cast<int64_t>(positions.size());
    b.out = out.data();
    b.out_len = static_cast<int64_t>(out.size());
    b.num_reqs = num_reqs();
    b.block_size = block_size;
    return b;
  }

  tagma_status map_step(std::vector<int64_t>& out) const {
    const tagma_slot_mapping_batch b = step_batch(out);
    return tagma_slot_mapping_step(&b);
  }

  // Straight from the definition.
  std::vector<int64_t> expected(int64_t out_len) const {
    std::vector<int64_t> out(static_cast<size_t>(out_len), -1);
    for (size_t r = 0; r < blocks.size(); ++r) {
      for (int32_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t) {
        const int64_t pos = positions[static_cast<size_t>(t)];
        const auto logical = static_cast<size_t>(pos / block_size);
        if (logical < blocks[r].size()) out[static_cast<size_t>(t)] = blocks[r][logical] * block_size + pos % block_size;
      }
    }
    return out;
  }
};

Batch hand_made_batch() {
  Batch batch;
  batch.block_size = 4;
  batch.add_request({{10, 2}, {3, 1}}, {0, 5, 8, 11, 12, 30});  // logical 0,1 -> 10,11; 2 -> 3; 3.. past
  batch.add_request({}, {0, 7});                                 // no blocks
  batch.add_request({{20, 3}}, {9, 1});
  return batch;
}

}  // namespace

TEST(slot_mapping_hand_computed_values) {
  const Batch batch = hand_made_batch();
  std::vector<int64_t> out(12, 99);
  require_ok(batch.map_ranges(out), "ranges");
  // Request 0: pos 0 -> 10*4+0; 5 -> 11*4+1; 8 -> 3*4+0; 11 -> 3*4+3; 12, 30 past. Request 1: no blocks.
  // Request 2: 9 -> 22*4+1; 1 -> 20*4+1. Then padding.
  const std::vector<int64_t> expected{40, 45, 12, 15, -1, -1, -1, -1, 89, 81, -1, -1};
  CHECK_EQ(out, expected);
  std::vector<int64_t> paged(12, 99);
  require_ok(batch.map_paged(paged), "paged");
  CHECK_EQ(paged, expected);
}

TEST(slot_mapping_with_exact_out_len_and_empty_batch) {
  const Batch batch = hand_made_batch();
  std::vector<int64_t> out(10, 99);
  require_ok(batch.map_ranges(out), "ranges");
  CHECK_EQ(out, batch.expected(10));
  const int32_t zero[1] = {0};
  require_ok(tagma_slot_mapping_ranges(nullptr, zero, 0, zero, nullptr, 16, nullptr, 0), "empty ranges");
  require_ok(tagma_slot_mapping_paged(nullptr, 0, nullptr, 0, zero, nullptr, 16, nullptr, 0), "empty paged");
  std::vector<int64_t> padding(3, 5);
  require_ok(tagma_slot_mapping_ranges(nullptr, zero, 0, zero, nullptr, 16, padding.data(), 3), "padding only");
  CHECK_EQ(padding, (std::vector<int64_t>{-1, -1, -1}));
}

TEST(slot_mapping_ranges_matches_paged_on_random_batches) {
  std::mt19937_64 rng(20240611);
  for (int iteration = 0; iteration < 300; ++iteration) {
    Batch batch;
    batch.block_size = std::uniform_int_distribution<int64_t>(1, 32)(rng);
    const int num_reqs = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int r = 0; r < num_reqs; ++r) {
      std::vector<std::pair<int32_t, int32_t>> extents;
      const int num_ranges = std::uniform_int_distribution<int>(0, 6)(rng);
      for (int i = 0; i < num_ranges; ++i) {
        extents.emplace_back(std::uniform_int_distribution<int32_t>(0, 5000)(rng),
                             std::uniform_int_distribution<int32_t>(1, 9)(rng));
      }
      int64_t num_blocks = 0;
      for (const auto& extent : extents) num_blocks += extent.second;
      const int64_t span = (num_blocks + 2) * batch.block_size;  // includes positions past the blocks
      std::vector<int64_t> tokens(static_cast<size_t>(std::uniform_int_distribution<int>(0, 40)(rng)));
      for (int64_t& pos : tokens) pos = std::uniform_int_distribution<int64_t>(0, span)(rng);
      if (rng() % 2 == 0) std::sort(tokens.begin(), tokens.end());  // the usual ascending case
      batch.add_request(extents, tokens);
    }
    if (num_reqs == 0) batch.req_range_offsets.push_back(0);
    const int64_t out_len = batch.query_start_loc.back() + static_cast<int64_t>(rng() % 5);
    std::vector<int64_t> by_ranges(static_cast<size_t>(out_len), 7);
    std::vector<int64_t> by_table(static_cast<size_t>(out_len), 8);
    require_ok(batch.map_ranges(by_ranges), "ranges");
    require_ok(batch.map_paged(by_table), "paged");
    CHECK_EQ(by_ranges, by_table);
    CHECK_EQ(by_ranges, batch.expected(out_len));
  }
}

TEST(slot_mapping_of_engine_ranges_matches_its_block_table) {
  test::TestEngine engine(201);
  std::vector<uint64_t> requests;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 30; ++i) {
    requests.push_back(engine.new_request());
    engine.append(requests.back(), std::uniform_int_distribution<int64_t>(1, 5)(rng));
    if (i % 3 == 0) engine.release(requests[static_cast<size_t>(i / 2)]);
  }
  Batch batch;
  for (const uint64_t r : engine.live_requests()) {
    std::vector<std::pair<int32_t, int32_t>> extents;
    for (const test::RangeTriple& range : engine.ranges(r)) extents.emplace_back(range.start, range.count);
    std::vector<int64_t> tokens;
    for (int64_t pos = 0; pos < static_cast<int64_t>(engine.blocks(r).size()) * batch.block_size + 3; pos += 5) {
      tokens.push_back(pos);
    }
    batch.add_request(extents, tokens);
    CHECK_EQ(batch.blocks.back(), engine.blocks(r));
  }
  std::vector<int64_t> by_ranges(static_cast<size_t>(batch.query_start_loc.back() + 4), 0);
  std::vector<int64_t> by_table(by_ranges.size(), 1);
  require_ok(batch.map_ranges(by_ranges), "ranges");
  require_ok(batch.map_paged(by_table), "paged");
  CHECK_EQ(by_ranges, by_table);
}

TEST(slot_mapping_validation_errors_leave_out_untouched) {
  const Batch good = hand_made_batch();
  const auto ranges_error = [](const Batch& batch, int64_t out_len, tagma_status expected) {
    std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(out_len, 1)), 77);
    check_error(tagma_slot_mapping_ranges(batch.ranges.data(), batch.req_range_offsets.data(), batch.num_reqs(),
                                          batch.query_start_loc.data(), batch.positions.data(), batch.block_size,
                                          out.data(), out_len),
                expected, "tagma_slot_mapping_ranges");
    CHECK(std::all_of(out.begin(), out.end(), [](int64_t v) { return v == 77; }));
  };
  ranges_error(good, 9, TAGMA_E_INVALID_ARG);  // 10 tokens > out_len 9
  ranges_error(good, -1, TAGMA_E_INVALID_ARG);
  Batch bad = good;
  bad.block_size = 0;
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.positions[3] = -1;
  ranges_error(bad, 12, TAGMA_E_OUT_OF_RANGE);
  bad = good;
  bad.ranges[5] = 1;  // second range of request 0 claims logical 1: not contiguous
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.ranges[2] = 1;  // first range must start at logical 0
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.ranges[1] = 0;  // empty range
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.ranges[0] = -10;  // negative physical start
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.block_size = kMaxInt64 / 20;  // block 20 * block_size overflows
  ranges_error(bad, 12, TAGMA_E_OVERFLOW);
  bad = good;
  bad.query_start_loc[0] = 1;
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.query_start_loc[2] = 1;  // decreasing
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);
  bad = good;
  bad.req_range_offsets[2] = 0;  // decreasing
  ranges_error(bad, 12, TAGMA_E_INVALID_ARG);

  std::vector<int64_t> out(12, 77);
  const auto& g = good;
  check_error(tagma_slot_mapping_ranges(nullptr, g.req_range_offsets.data(), 3, g.query_start_loc.data(),
                                        g.positions.data(), 4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  check_error(tagma_slot_mapping_ranges(g.ranges.data(), nullptr, 3, g.query_start_loc.data(), g.positions.data(), 4,
                                        out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  check_error(tagma_slot_mapping_ranges(g.ranges.data(), g.req_range_offsets.data(), 3, nullptr, g.positions.data(),
                                        4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  check_error(tagma_slot_mapping_ranges(g.ranges.data(), g.req_range_offsets.data(), 3, g.query_start_loc.data(),
                                        nullptr, 4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  check_error(tagma_slot_mapping_ranges(g.ranges.data(), g.req_range_offsets.data(), 3, g.query_start_loc.data(),
                                        g.positions.data(), 4, nullptr, 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  check_error(tagma_slot_mapping_ranges(g.ranges.data(), g.req_range_offsets.data(), -1, g.query_start_loc.data(),
                                        g.positions.data(), 4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_ranges");
  CHECK(std::all_of(out.begin(), out.end(), [](int64_t v) { return v == 77; }));
}

TEST(slot_mapping_paged_validation_errors_leave_out_untouched) {
  const Batch good = hand_made_batch();
  const std::vector<int32_t> table = good.block_table();  // 3 x 3
  const std::vector<int32_t> counts = good.num_blocks_per_req();
  const auto paged_error = [&](const std::vector<int32_t>& t, int64_t max_blocks, const std::vector<int32_t>& c,
                               int64_t block_size, int64_t out_len, tagma_status expected) {
    std::vector<int64_t> out(12, 77);
    check_error(tagma_slot_mapping_paged(t.data(), max_blocks, c.data(), good.num_reqs(),
                                         good.query_start_loc.data(), good.positions.data(), block_size, out.data(),
                                         out_len),
                expected, "tagma_slot_mapping_paged");
    CHECK(std::all_of(out.begin(), out.end(), [](int64_t v) { return v == 77; }));
  };
  paged_error(table, 3, counts, 4, 9, TAGMA_E_INVALID_ARG);   // out too short
  paged_error(table, 3, counts, -4, 12, TAGMA_E_INVALID_ARG);  // block size
  paged_error(table, -1, counts, 4, 12, TAGMA_E_INVALID_ARG);  // max_blocks_per_req
  std::vector<int32_t> bad_counts = counts;
  bad_counts[2] = 4;  // more than max_blocks_per_req
  paged_error(table, 3, bad_counts, 4, 12, TAGMA_E_INVALID_ARG);
  bad_counts[2] = -1;
  paged_error(table, 3, bad_counts, 4, 12, TAGMA_E_INVALID_ARG);
  std::vector<int32_t> bad_table = table;
  bad_table[1] = -2;  // a valid entry with a negative block
  paged_error(bad_table, 3, counts, 4, 12, TAGMA_E_INVALID_ARG);
  paged_error(table, 3, counts, kMaxInt64 / 20, 12, TAGMA_E_OVERFLOW);
  bad_table = table;
  bad_table[5] = -2;  // beyond request 1's zero blocks: ignored
  std::vector<int64_t> out(12, 77);
  require_ok(tagma_slot_mapping_paged(bad_table.data(), 3, counts.data(), 3, good.query_start_loc.data(),
                                      good.positions.data(), 4, out.data(), 12),
             "paged ignores entries past num_blocks_per_req");
  check_error(tagma_slot_mapping_paged(table.data(), kMaxInt64, counts.data(), 3, good.query_start_loc.data(),
                                       good.positions.data(), 4, out.data(), 12),
              TAGMA_E_OVERFLOW, "tagma_slot_mapping_paged");
  check_error(tagma_slot_mapping_paged(nullptr, 3, counts.data(), 3, good.query_start_loc.data(),
                                       good.positions.data(), 4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_paged");
  check_error(tagma_slot_mapping_paged(table.data(), 3, nullptr, 3, good.query_start_loc.data(),
                                       good.positions.data(), 4, out.data(), 12),
              TAGMA_E_INVALID_ARG, "tagma_slot_mapping_paged");
  std::vector<int64_t> negative = good.positions;
  negative[0] = -5;
  check_error(tagma_slot_mapping_paged(table.data(), 3, counts.data(), 3, good.query_start_loc.data(),
                                       negative.data(), 4, out.data(), 12),
              TAGMA_E_OUT_OF_RANGE, "tagma_slot_mapping_paged");
}

TEST(slot_mapping_largest_representable_slot) {
  // One block at the highest physical id p whose slots fit: (p + 1) * block_size <= INT64_MAX.
  const int64_t block_size = int64_t{1} << 32;
  const auto physical = static_cast<int32_t>(kMaxInt64 / block_size - 1);
  const int32_t ranges[3] = {physical, 1, 0};
  const int32_t offsets[2] = {0, 1};
  const int32_t query_start_loc[2] = {0, 1};
  const int64_t positions[1] = {block_size - 1};
  int64_t out[1] = {0};
  require_ok(tagma_slot_mapping_ranges(ranges, offsets, 1, query_start_loc, positions, block_size, out, 1), "max");
  CHECK_EQ(out[0], (int64_t{physical} + 1) * block_size - 1);
  const int32_t too_far[3] = {physical + 1, 1, 0};
  check_error(tagma_slot_mapping_ranges(too_far, offsets, 1, query_start_loc, positions, block_size, out, 1),
              TAGMA_E_OVERFLOW, "tagma_slot_mapping_ranges");
}

// ------------------------------------------------------------------------------------------ the step form

namespace {

std::vector<int64_t> run(int64_t first, int64_t count) {
  std::vector<int64_t> tokens(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) tokens[static_cast<size_t>(k)] = first + k;
  return tokens;
}

// A batch of consecutive runs, the shape vLLM schedules: prefill chunks, decode tokens, runs past the blocks.
Batch random_run_batch(std::mt19937_64& rng, int64_t block_size) {
  Batch batch;
  batch.block_size = block_size;
  batch.req_range_offsets.push_back(0);
  const int num_reqs = std::uniform_int_distribution<int>(0, 10)(rng);
  for (int r = 0; r < num_reqs; ++r) {
    std::vector<std::pair<int32_t, int32_t>> extents;
    const int num_ranges = std::uniform_int_distribution<int>(0, 7)(rng);
    for (int i = 0; i < num_ranges; ++i) {
      extents.emplace_back(std::uniform_int_distribution<int32_t>(0, 100000)(rng),
                           std::uniform_int_distribution<int32_t>(1, 9)(rng));
    }
    int64_t num_blocks = 0;
    for (const auto& extent : extents) num_blocks += extent.second;
    const int64_t capacity = num_blocks * block_size;
    const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
    int64_t first = 0;
    int64_t count = 0;
    if (kind == 0) {  // decode: one token at the last position
      count = capacity > 0 ? 1 : 0;
      first = capacity > 0 ? std::uniform_int_distribution<int64_t>(0, capacity - 1)(rng) : 0;
    } else if (kind == 1) {  // a chunk of a prefill, anywhere inside the blocks
      first = std::uniform_int_distribution<int64_t>(0, capacity)(rng);
      count = std::uniform_int_distribution<int64_t>(0, capacity - first)(rng);
    } else if (kind == 2) {  // a whole prefill from 0
      count = std::uniform_int_distribution<int64_t>(0, capacity)(rng);
    } else {  // running past the blocks (those positions get -1)
      first = std::uniform_int_distribution<int64_t>(0, capacity + 2 * block_size)(rng);
      count = std::uniform_int_distribution<int64_t>(0, 3 * block_size)(rng);
    }
    batch.add_request(extents, run(first, count));
  }
  return batch;
}

void check_step_error(const tagma_slot_mapping_batch& b, tagma_status expected) {
  check_error(tagma_slot_mapping_step(&b), expected, "tagma_slot_mapping_step");
}

}  // namespace

TEST(slot_mapping_step_hand_computed_values) {
  Batch batch;
  batch.block_size = 4;
  batch.add_request({{10, 2}, {3, 1}}, run(2, 9));  // 2..10: 10*4+2 .. 11*4+3, then 3*4+0 .. 3*4+2
  batch.add_request({}, run(0, 2));                  // no blocks: -1
  batch.add_request({{20, 3}}, run(11, 1));          // decode at 11: 22*4+3
  batch.add_request({{7, 1}}, run(3, 3));            // 3 -> 7*4+3, then 4, 5 past the block
  std::vector<int64_t> out(18, 99);
  require_ok(batch.map_step(out), "step");
  const std::vector<int64_t> expected{42, 43, 44, 45, 46, 47, 12, 13, 14, -1, -1, 91, 31, -1, -1, -1, -1, -1};
  CHECK_EQ(out, expected);
  CHECK_EQ(out, batch.expected(18));
}

TEST(slot_mapping_step_matches_the_per_token_form_on_random_runs) {
  std::mt19937_64 rng(99);
  for (int iteration = 0; iteration < 600; ++iteration) {
    const int64_t block_sizes[] = {1, 2, 3, 16, 128, 5, 7, 64};
    const Batch batch = random_run_batch(rng, block_sizes[iteration % 8]);
    const int64_t out_len = batch.query_start_loc.back() + static_cast<int64_t>(rng() % 6);
    std::vector<int64_t> by_step(static_cast<size_t>(out_len), 7);
    std::vector<int64_t> by_ranges(static_cast<size_t>(out_len), 8);
    require_ok(batch.map_step(by_step), "step");
    require_ok(batch.map_ranges(by_ranges), "ranges");
    CHECK_EQ(by_step, by_ranges);
    CHECK_EQ(by_step, batch.expected(out_len));
  }
}

TEST(slot_mapping_step_of_engine_ranges_matches_its_block_table) {
  test::TestEngine engine(401);
  std::mt19937_64 rng(11);
  std::vector<uint64_t> requests;
  for (int i = 0; i < 40; ++i) {  // interleaved growth: several ranges per request
    if (requests.size() < 12) requests.push_back(engine.new_request());
    engine.append(requests[static_cast<size_t>(rng() % requests.size())], std::uniform_int_distribution<int64_t>(1, 3)(rng));
  }
  for (const int64_t block_size : {int64_t{16}, int64_t{128}}) {
    Batch batch;
    batch.block_size = block_size;
    for (const uint64_t r : engine.live_requests()) {
      std::vector<std::pair<int32_t, int32_t>> extents;
      for (const test::RangeTriple& range : engine.ranges(r)) extents.emplace_back(range.start, range.count);
      const auto capacity = static_cast<int64_t>(engine.blocks(r).size()) * block_size;
      batch.add_request(extents, run(capacity / 3, capacity - capacity / 3));  // a chunk to the end
    }
    std::vector<int64_t> by_step(static_cast<size_t>(batch.query_start_loc.back() + 3), 0);
    std::vector<int64_t> by_table(by_step.size(), 1);
    require_ok(batch.map_step(by_step), "step");
    require_ok(batch.map_paged(by_table), "paged");
    CHECK_EQ(by_step, by_table);
  }
}

TEST(slot_mapping_step_padding_and_empty_batches) {
  const int32_t zero[1] = {0};
  std::vector<int64_t> out(5, 3);
  tagma_slot_mapping_batch b{};
  b.req_range_offsets = zero;
  b.query_start_loc = zero;
  b.out = out.data();
  b.out_len = 5;
  b.block_size = 16;
  require_ok(tagma_slot_mapping_step(&b), "padding only");
  CHECK_EQ(out, (std::vector<int64_t>{-1, -1, -1, -1, -1}));
  b.out = nullptr;
  b.out_len = 0;
  require_ok(tagma_slot_mapping_step(&b), "nothing at all");
  // Requests with no tokens read no positions and no ranges.
  const int32_t offsets[3] = {0, 0, 0};
  const int32_t qsl[3] = {0, 0, 0};
  b.req_range_offsets = offsets;
  b.query_start_loc = qsl;
  b.num_reqs = 2;
  b.max_reqs = 2;
  require_ok(tagma_slot_mapping_step(&b), "two empty requests");
  // A request that owns no ranges (its offsets past 0, no ranges array at all): every token is -1.
  const int32_t no_ranges[2] = {3, 3};
  const int32_t two_tokens[2] = {0, 2};
  const int64_t positions[2] = {40, 41};
  std::vector<int64_t> three(3, 9);
  tagma_slot_mapping_batch none{nullptr, 0, no_ranges, 1, two_tokens, positions, 2, three.data(), 3, 1, 16};
  check_error(tagma_slot_mapping_step(&none), TAGMA_E_INVALID_ARG, "tagma_slot_mapping_step");  // 3 > capacity 0
  none.ranges_capacity = 3;
  require_ok(tagma_slot_mapping_step(&none), "a request without ranges");
  CHECK_EQ(three, (std::vector<int64_t>{-1, -1, -1}));
}

TEST(slot_mapping_step_long_runs_cross_ranges) {
  // 1,000 one-block ranges at every other block, then one 5,000-block range: a 128K-ish prefill crosses all.
  Batch batch;
  batch.block_size = 16;
  std::vector<std::pair<int32_t, int32_t>> extents;
  for (int32_t i = 0; i < 1000; ++i) extents.emplace_back(1 + 2 * i, 1);
  extents.emplace_back(5000, 5000);
  batch.add_request(extents, run(0, 6000 * 16 + 5));  // 5 past the end
  batch.add_request({{3, 2}}, run(17, 1));
  std::vector<int64_t> out(static_cast<size_t>(batch.query_start_loc.back() + 7), 0);
  require_ok(batch.map_step(out), "step");
  CHECK_EQ(out, batch.expected(static_cast<int64_t>(out.size())));
}

TEST(slot_mapping_step_validation_errors) {
  Batch good;
  good.block_size = 4;
  good.add_request({{10, 2}, {3, 1}}, run(2, 9));
  good.add_request({}, run(0, 2));
  good.add_request({{20, 3}}, run(11, 1));
  std::vector<int64_t> out(14, 77);
  const tagma_slot_mapping_batch base = good.step_batch(out);
  require_ok(tagma_slot_mapping_step(&base), "good");

  check_error(tagma_slot_mapping_step(nullptr), TAGMA_E_INVALID_ARG, "tagma_slot_mapping_step");
  tagma_slot_mapping_batch b = base;
  b.block_size = 0;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.num_reqs = -1;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.num_reqs = 4;  // > max_reqs
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.out_len = -1;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.out_len = 11;  // 12 tokens
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.ranges_capacity = 2;  // request 0 owns 2, request 2 needs a third
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.ranges_capacity = -1;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.positions_capacity = 11;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.positions_capacity = -3;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.out = nullptr;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.query_start_loc = nullptr;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.req_range_offsets = nullptr;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.positions = nullptr;
  check_step_error(b, TAGMA_E_INVALID_ARG);
  b = base;
  b.ranges = nullptr;
  check_step_error(b, TAGMA_E_INVALID_ARG);

  const auto with = [&](auto edit, tagma_status expected) {
    Batch bad = good;
    edit(bad);
    std::vector<int64_t> scratch(14, 77);
    const tagma_slot_mapping_batch e = bad.step_batch(scratch);
    check_step_error(e, expected);
  };
  with([](Batch& x) { x.query_start_loc[0] = 1; }, TAGMA_E_INVALID_ARG);
  with([](Batch& x) { x.query_start_loc[2] = 8; }, TAGMA_E_INVALID_ARG);  // 9 > 8: decreasing
  with([](Batch& x) { x.req_range_offsets[0] = -1; }, TAGMA_E_INVALID_ARG);
  with([](Batch& x) { x.req_range_offsets[2] = 1; }, TAGMA_E_INVALID_ARG);  // 2 > 1: decreasing
  with([](Batch& x) { x.positions[0] = 3; }, TAGMA_E_INVALID_ARG);          // not consecutive (last - first)
  with([](Batch& x) { x.positions[11] = -1; }, TAGMA_E_OUT_OF_RANGE);       // first position negative
  with([](Batch& x) { x.positions[8] = 11; }, TAGMA_E_INVALID_ARG);         // last not first + n - 1
  with([](Batch& x) { x.ranges[2] = 1; }, TAGMA_E_INVALID_ARG);             // first range not at logical 0
  with([](Batch& x) { x.ranges[5] = 1; }, TAGMA_E_INVALID_ARG);             // second range claims logical 1
  with([](Batch& x) { x.ranges[4] = 0; }, TAGMA_E_INVALID_ARG);             // empty range touched
  with([](Batch& x) { x.ranges[1] = -2; }, TAGMA_E_INVALID_ARG);            // negative count
  with([](Batch& x) { x.ranges[3] = -5; }, TAGMA_E_INVALID_ARG);            // negative physical start
  with([](Batch& x) { x.ranges[8] = 7; }, TAGMA_E_INVALID_ARG);             // request 2's range at logical 7
  with([](Batch& x) { x.block_size = kMaxInt64 / 20; }, TAGMA_E_OVERFLOW);  // block 20's slots overflow
  with(
      [](Batch& x) {  // a gap: range 1 starts at logical 3 while range 0 ends at 2; the run starts in the gap
        x.ranges[5] = 3;
        for (int64_t k = 0; k < 9; ++k) x.positions[static_cast<size_t>(k)] = 8 + k;
      },
      TAGMA_E_INVALID_ARG);
}

TEST(slot_mapping_step_error_messages_name_the_request) {
  Batch bad;
  bad.block_size = 4;
  bad.add_request({{5, 1}}, run(0, 1));
  bad.add_request({{6, 1}}, {0, 2});  // two tokens at 0 and 2
  std::vector<int64_t> out(3, 0);
  check_error(bad.map_step(out), TAGMA_E_INVALID_ARG, "tagma_slot_mapping_step");
  const std::string message = tagma_last_error();
  CHECK(message.find("tagma_slot_mapping_step") != std::string::npos);
  CHECK(message.find("request 1") != std::string::npos);
  CHECK(message.find("not consecutive") != std::string::npos);
}

TEST(slot_mapping_step_largest_representable_slot) {
  const int64_t block_size = int64_t{1} << 32;
  const auto physical = static_cast<int32_t>(kMaxInt64 / block_size - 1);
  const int32_t ranges[3] = {physical, 1, 0};
  const int32_t offsets[2] = {0, 1};
  const int32_t qsl[2] = {0, 2};
  const int64_t positions[2] = {block_size - 2, block_size - 1};
  int64_t out[2] = {0, 0};
  tagma_slot_mapping_batch b{ranges, 1, offsets, 1, qsl, positions, 2, out, 2, 1, block_size};
  require_ok(tagma_slot_mapping_step(&b), "max");
  CHECK_EQ(out[1], (int64_t{physical} + 1) * block_size - 1);
  const int32_t too_far[3] = {physical + 1, 1, 0};
  b.ranges = too_far;
  check_error(tagma_slot_mapping_step(&b), TAGMA_E_OVERFLOW, "tagma_slot_mapping_step");
}
