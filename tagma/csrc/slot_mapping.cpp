// slot = physical_block(pos / block_size) * block_size + pos % block_size, or -1 past the request's blocks.
//
// slot_mapping_step (the worker's call) reads one first position per request and stores runs of consecutive
// slots, validating as it goes. The per-token variants below it (ranges, paged) validate all inputs before writing `out` (O(ranges + tokens), resp. O(table rows' valid
// entries + tokens)) and then produce identical output for the same block maps.
#include "slot_mapping.h"

#include <algorithm>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "error.h"

namespace tagma {

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// The ranges [begin, end) of the caller's (physical_start, num_blocks, first_logical_block) triples.
class RequestRanges {
 public:
  RequestRanges(const int32_t* ranges, int64_t begin, int64_t end) : ranges_(ranges), begin_(begin), size_(end - begin) {}

  int64_t size() const { return size_; }
  int64_t start(int64_t i) const { return field(i, 0); }
  int64_t count(int64_t i) const { return field(i, 1); }
  int64_t first(int64_t i) const { return field(i, 2); }
  int64_t num_blocks() const { return size_ == 0 ? 0 : first(size_ - 1) + count(size_ - 1); }

  // Index of the range holding `logical` in [0, num_blocks()): the cursor's range or its successor when
  // positions ascend, else a binary search.
  int64_t locate(int64_t logical, int64_t cursor) const {
    if (holds(cursor, logical)) return cursor;
    if (cursor + 1 < size_ && holds(cursor + 1, logical)) return cursor + 1;
    int64_t low = 0;  // first(low) <= logical < first(high)
    int64_t high = size_;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (first(middle) <= logical) {
        low = middle;
      } else {
        high = middle;
      }
    }
    return low;
  }

 private:
  int64_t field(int64_t i, int64_t k) const { return ranges_[3 * (begin_ + i) + k]; }
  bool holds(int64_t i, int64_t logical) const { return logical >= first(i) && logical < first(i) + count(i); }

  const int32_t* ranges_;
  int64_t begin_;
  int64_t size_;
};

// Validates the batch layout shared by both variants and returns num_tokens = query_start_loc[num_reqs].
int64_t check_tokens(int64_t num_reqs, const int32_t* query_start_loc, const int64_t* positions, int64_t block_size,
                     const int64_t* out, int64_t out_len) {
  require_positive(block_size, "block_size");
  if (num_reqs < 0) fail(TAGMA_E_INVALID_ARG, "num_reqs ", num_reqs, " must be >= 0");
  if (out_len < 0) fail(TAGMA_E_INVALID_ARG, "out_len ", out_len, " must be >= 0");
  require_non_null(query_start_loc, "query_start_loc");
  if (query_start_loc[0] != 0) fail(TAGMA_E_INVALID_ARG, "query_start_loc[0] ", query_start_loc[0], " must be 0");
  for (int64_t r = 0; r < num_reqs; ++r) {
    if (query_start_loc[r + 1] < query_start_loc[r]) {
      fail(TAGMA_E_INVALID_ARG, "query_start_loc decreases at request ", r, " (", query_start_loc[r], " > ",
           query_start_loc[r + 1], ")");
    }
  }
  const int64_t num_tokens = query_start_loc[num_reqs];
  if (num_tokens > out_len) fail(TAGMA_E_INVALID_ARG, "num_tokens ", num_tokens, " exceeds out_len ", out_len);
  if (out_len > 0) require_non_null(out, "out");
  if (num_tokens > 0) require_non_null(positions, "positions");
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (positions[t] < 0) fail(TAGMA_E_OUT_OF_RANGE, "positions[", t, "] ", positions[t], " is negative");
  }
  return num_tokens;
}

// Physical blocks must be below this for every slot of theirs to fit in int64.
int64_t block_limit(int64_t block_size) { return kMaxInt64 / block_size; }

void check_ranges(const int32_t* ranges, const int32_t* req_range_offsets, int64_t num_reqs, int64_t block_size) {
  require_non_null(req_range_offsets, "req_range_offsets");
  if (req_range_offsets[0] < 0) {
    fail(TAGMA_E_INVALID_ARG, "req_range_offsets[0] ", req_range_offsets[0], " must be >= 0");
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    if (req_range_offsets[r + 1] < req_range_offsets[r]) {
      fail(TAGMA_E_INVALID_ARG, "req_range_offsets decreases at request ", r);
    }
  }
  if (req_range_offsets[num_reqs] > req_range_offsets[0]) require_non_null(ranges, "ranges");
  for (int64_t r = 0; r < num_reqs; ++r) {
    const RequestRanges request(ranges, req_range_offsets[r], req_range_offsets[r + 1]);
    int64_t next_logical = 0;
    for (int64_t i = 0; i < request.size(); ++i) {
      if (request.count(i) <= 0) {
        fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", r, " has num_blocks ", request.count(i));
      }
      if (request.start(i) < 0) {
        fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", r, " has negative physical_start ", request.start(i));
      }
      if (request.first(i) != next_logical) {
        fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", r, " starts at logical block ", request.first(i),
             ", expected ", next_logical, " (ranges must be contiguous from 0)");
      }
      if (request.start(i) + request.count(i) > block_limit(block_size)) {
        fail(TAGMA_E_OVERFLOW, "slots of range ", i, " of request ", r, " overflow int64 with block_size ", block_size);
      }
      next_logical += request.count(i);
    }
  }
}

void check_block_table(const int32_t* block_table, int64_t max_blocks_per_req, const int32_t* num_blocks_per_req,
                       int64_t num_reqs, int64_t block_size) {
  if (max_blocks_per_req < 0) {
    fail(TAGMA_E_INVALID_ARG, "max_blocks_per_req ", max_blocks_per_req, " must be >= 0");
  }
  if (num_reqs > 0) require_non_null(num_blocks_per_req, "num_blocks_per_req");
  int64_t table_size = 0;
  if (__builtin_mul_overflow(num_reqs, max_blocks_per_req, &table_size)) {
    fail(TAGMA_E_OVERFLOW, "num_reqs ", num_reqs, " * max_blocks_per_req ", max_blocks_per_req, " overflows int64");
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int32_t num_blocks = num_blocks_per_req[r];
    if (num_blocks < 0 || num_blocks > max_blocks_per_req) {
      fail(TAGMA_E_INVALID_ARG, "num_blocks_per_req[", r, "] ", num_blocks, " is outside [0, max_blocks_per_req ",
           max_blocks_per_req, "]");
    }
    if (num_blocks > 0) require_non_null(block_table, "block_table");
    for (int32_t i = 0; i < num_blocks; ++i) {
      const int32_t block = block_table[r * max_blocks_per_req + i];
      if (block < 0) fail(TAGMA_E_INVALID_ARG, "block_table[", r, "][", i, "] ", block, " is negative");
      if (block >= block_limit(block_size)) {
        fail(TAGMA_E_OVERFLOW, "slots of block_table[", r, "][", i, "] ", block, " overflow int64 with block_size ",
             block_size);
      }
    }
  }
}

// vLLM pads the slot mapping past the last token with -1.
void fill_padding(int64_t* out, int64_t num_tokens, int64_t out_len) { std::fill(out + num_tokens, out + out_len, -1); }

}  // namespace

void slot_mapping_ranges(const int32_t* ranges, const int32_t* req_range_offsets, int64_t num_reqs,
                         const int32_t* query_start_loc, const int64_t* positions, int64_t block_size, int64_t* out,
                         int64_t out_len) {
  const int64_t num_tokens = check_tokens(num_reqs, query_start_loc, positions, block_size, out, out_len);
  check_ranges(ranges, req_range_offsets, num_reqs, block_size);
  for (int64_t r = 0; r < num_reqs; ++r) {
    const RequestRanges request(ranges, req_range_offsets[r], req_range_offsets[r + 1]);
    const int64_t num_blocks = request.num_blocks();
    int64_t cursor = 0;
    for (int64_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t) {
      const int64_t logical = positions[t] / block_size;
      if (logical >= num_blocks) {
        out[t] = -1;
        continue;
      }
      cursor = request.locate(logical, cursor);
      const int64_t physical = request.start(cursor) + (logical - request.first(cursor));
      out[t] = physical * block_size + positions[t] % block_size;
    }
  }
  if (out_len > 0) fill_padding(out, num_tokens, out_len);
}

void slot_mapping_paged(const int32_t* block_table, int64_t max_blocks_per_req, const int32_t* num_blocks_per_req,
                        int64_t num_reqs, const int32_t* query_start_loc, const int64_t* positions,
                        int64_t block_size, int64_t* out, int64_t out_len) {
  const int64_t num_tokens = check_tokens(num_reqs, query_start_loc, positions, block_size, out, out_len);
  check_block_table(block_table, max_blocks_per_req, num_blocks_per_req, num_reqs, block_size);
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t) {
      const int64_t logical = positions[t] / block_size;
      if (logical >= num_blocks_per_req[r]) {
        out[t] = -1;
        continue;
      }
      const int64_t physical = block_table[r * max_blocks_per_req + logical];
      out[t] = physical * block_size + positions[t] % block_size;
    }
  }
  if (out_len > 0) fill_padding(out, num_tokens, out_len);
}

// ------------------------------------------------------------------------------ the step form (hot path)

namespace {

// Stores value, value + 1, ..., value + count - 1 at out: the inner loop of the step form. Four 16-byte
// stores per iteration where SSE2 exists (x86-64 always): GCC does not vectorize the plain loop at -O2.
inline void store_consecutive(int64_t* out, int64_t value, int64_t count) {
  int64_t k = 0;
#if defined(__SSE2__)
  if (count >= 8) {
    __m128i a = _mm_set_epi64x(value + 1, value);
    __m128i b = _mm_set_epi64x(value + 3, value + 2);
    __m128i c = _mm_set_epi64x(value + 5, value + 4);
    __m128i d = _mm_set_epi64x(value + 7, value + 6);
    const __m128i eight = _mm_set1_epi64x(8);
    for (; k + 8 <= count; k += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 2), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 4), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 6), d);
      a = _mm_add_epi64(a, eight);
      b = _mm_add_epi64(b, eight);
      c = _mm_add_epi64(c, eight);
      d = _mm_add_epi64(d, eight);
    }
  }
#endif
  for (; k < count; ++k) out[k] = value + k;
}

// -1 in every entry (all bits set): vLLM's PAD_SLOT_ID.
inline void store_padding(int64_t* out, int64_t count) {
  if (count > 0) std::memset(out, 0xff, static_cast<size_t>(count) * sizeof(int64_t));
}

struct StepRange {
  int64_t start;
  int64_t count;
  int64_t first;
};

inline StepRange step_range(const int32_t* ranges, int64_t i) {
  return {ranges[3 * i], ranges[3 * i + 1], ranges[3 * i + 2]};
}

// One request's run of n tokens at positions p0 .. p0 + n - 1 through its ranges [0, num_ranges).
void fill_request(const int32_t* ranges, int64_t num_ranges, int64_t p0, int64_t n, int64_t* out,
                  int64_t block_size, int64_t block_limit, int64_t request) {
  if (num_ranges == 0) {
    store_padding(out, n);
    return;
  }
  if (ranges[2] != 0) {
    fail(TAGMA_E_INVALID_ARG, "range 0 of request ", request, " starts at logical block ", ranges[2],
         ", expected 0 (ranges must be contiguous from 0)");
  }
  // first * block_size <= p0, without overflow (block_limit = INT64_MAX / block_size).
  const auto starts_by = [&](int64_t first) { return first <= 0 || (first <= block_limit && first * block_size <= p0); };
  int64_t i = num_ranges - 1;  // decode writes into the last range: try it first
  if (!starts_by(ranges[3 * i + 2])) {
    int64_t low = 0;  // starts_by(first(low)) and !starts_by(first(high))
    int64_t high = i;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (starts_by(ranges[3 * middle + 2])) {
        low = middle;
      } else {
        high = middle;
      }
    }
    i = low;
  }
  int64_t expected_first = ranges[3 * i + 2];
  int64_t p = p0;
  int64_t t = 0;
  while (t < n) {
    if (i == num_ranges) {
      store_padding(out + t, n - t);  // past the request's blocks
      return;
    }
    const StepRange g = step_range(ranges, i);
    if (g.count <= 0) fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", request, " has num_blocks ", g.count);
    if (g.start < 0) {
      fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", request, " has negative physical_start ", g.start);
    }
    if (g.first != expected_first || g.first < 0) {
      fail(TAGMA_E_INVALID_ARG, "range ", i, " of request ", request, " starts at logical block ", g.first,
           ", expected ", expected_first, " (ranges must be contiguous from 0)");
    }
    if (g.start + g.count > block_limit || g.first + g.count > block_limit) {
      fail(TAGMA_E_OVERFLOW, "slots of range ", i, " of request ", request, " overflow int64 with block_size ",
           block_size);
    }
    const int64_t end = (g.first + g.count) * block_size;  // first position past the range
    if (end <= p) {
      if (i + 1 < num_ranges) {
        fail(TAGMA_E_INVALID_ARG, "ranges of request ", request, " are not ordered and contiguous: range ", i,
             " ends at logical block ", g.first + g.count, " before position ", p, " and range ", i + 1,
             " starts at logical block ", ranges[3 * (i + 1) + 2]);
      }
      store_padding(out + t, n - t);
      return;
    }
    const int64_t take = std::min(n - t, end - p);
    store_consecutive(out + t, (g.start - g.first) * block_size + p, take);
    t += take;
    p += take;
    expected_first = g.first + g.count;
    ++i;
  }
}

}  // namespace

void slot_mapping_step(const tagma_slot_mapping_batch* batch) {
  require_non_null(batch, "batch");
  const tagma_slot_mapping_batch& b = *batch;
  require_positive(b.block_size, "block_size");
  if (b.num_reqs < 0 || b.num_reqs > b.max_reqs) {
    fail(TAGMA_E_INVALID_ARG, "num_reqs ", b.num_reqs, " is outside [0, max_reqs ", b.max_reqs, "]");
  }
  if (b.out_len < 0) fail(TAGMA_E_INVALID_ARG, "out_len ", b.out_len, " must be >= 0");
  if (b.ranges_capacity < 0) fail(TAGMA_E_INVALID_ARG, "ranges_capacity ", b.ranges_capacity, " must be >= 0");
  if (b.positions_capacity < 0) {
    fail(TAGMA_E_INVALID_ARG, "positions_capacity ", b.positions_capacity, " must be >= 0");
  }
  if (b.out_len > 0) require_non_null(b.out, "out");
  require_non_null(b.query_start_loc, "query_start_loc");
  require_non_null(b.req_range_offsets, "req_range_offsets");
  const int32_t* qsl = b.query_start_loc;
  const int32_t* offsets = b.req_range_offsets;
  if (qsl[0] != 0) fail(TAGMA_E_INVALID_ARG, "query_start_loc[0] ", qsl[0], " must be 0");
  if (offsets[0] < 0) fail(TAGMA_E_INVALID_ARG, "req_range_offsets[0] ", offsets[0], " must be >= 0");
  const int64_t block_limit = kMaxInt64 / b.block_size;
  for (int64_t r = 0; r < b.num_reqs; ++r) {
    const int64_t t0 = qsl[r];
    const int64_t t1 = qsl[r + 1];
    if (t1 < t0) fail(TAGMA_E_INVALID_ARG, "query_start_loc decreases at request ", r, " (", t0, " > ", t1, ")");
    if (t1 > b.out_len) {
      fail(TAGMA_E_INVALID_ARG, "query_start_loc[", r + 1, "] ", t1, " exceeds out_len ", b.out_len);
    }
    const int64_t first_range = offsets[r];
    const int64_t end_range = offsets[r + 1];
    if (end_range < first_range) {
      fail(TAGMA_E_INVALID_ARG, "req_range_offsets decreases at request ", r, " (", first_range, " > ", end_range,
           ")");
    }
    if (end_range > b.ranges_capacity) {
      fail(TAGMA_E_INVALID_ARG, "req_range_offsets[", r + 1, "] ", end_range, " exceeds ranges_capacity ",
           b.ranges_capacity);
    }
    const int64_t n = t1 - t0;
    if (n == 0) continue;
    if (t1 > b.positions_capacity) {
      fail(TAGMA_E_INVALID_ARG, "query_start_loc[", r + 1, "] ", t1, " exceeds positions_capacity ",
           b.positions_capacity);
    }
    require_non_null(b.positions, "positions");
    if (end_range > first_range) require_non_null(b.ranges, "ranges");
    const int64_t p0 = b.positions[t0];
    const int64_t last = b.positions[t1 - 1];
    if (p0 < 0) fail(TAGMA_E_OUT_OF_RANGE, "positions[", t0, "] ", p0, " (first of request ", r, ") is negative");
    if (last < p0 || last - p0 != n - 1) {
      fail(TAGMA_E_INVALID_ARG, "positions of request ", r, " are not consecutive: its ", n, " tokens run from ",
           p0, " to ", last);
    }
    const int32_t* own = end_range > first_range ? b.ranges + 3 * first_range : nullptr;  // ranges may be null
    fill_request(own, end_range - first_range, p0, n, b.out + t0, b.block_size, block_limit, r);
  }
  const int64_t num_tokens = qsl[b.num_reqs];  // <= out_len: checked above (0 when num_reqs == 0)
  store_padding(b.out + num_tokens, b.out_len - num_tokens);
}

}  // namespace tagma
