// slot = physical_block(pos / block_size) * block_size + pos % block_size, or -1 past the request's blocks.
//
// Both variants validate all inputs before writing `out` (O(ranges + tokens), resp. O(table rows' valid
// entries + tokens)) and then produce identical output for the same block maps.
#include "slot_mapping.h"

#include <algorithm>
#include <limits>

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

}  // namespace tagma
