// Test helpers: an RAII engine driven through the C ABI, state snapshots and invariant checks.
#ifndef TAGMA_TEST_HELPERS_H
#define TAGMA_TEST_HELPERS_H

#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tagma.h"
#include "test_runner.h"

namespace test {

struct RangeTriple {
  int32_t start;
  int32_t count;
  int32_t first_logical;
  bool operator==(const RangeTriple& other) const {
    return start == other.start && count == other.count && first_logical == other.first_logical;
  }
};
std::ostream& operator<<(std::ostream& out, const RangeTriple& range);

using Pairs = std::vector<std::pair<int32_t, int32_t>>;

// Stats fields as numbers, in declaration order (for equality checks and printing).
std::vector<double> stats_fields(const tagma_stats& stats);

// Everything the ABI shows about an engine except per-request ranges.
struct Snapshot {
  std::vector<double> stats;
  Pairs free_ranges;
  std::vector<int32_t> req_refs;
  std::vector<int32_t> cache_refs;
  std::vector<int32_t> lru;
  bool operator==(const Snapshot& other) const;
};
std::ostream& operator<<(std::ostream& out, const Snapshot& snapshot);

// Fails the test (with tagma_last_error()) unless status is TAGMA_OK.
void require_ok(tagma_status status, const char* what);

// Checks that `status` is `expected` and that tagma_last_error() starts with "function: ".
void check_error(tagma_status status, tagma_status expected, const char* function);

class TestEngine {
 public:
  explicit TestEngine(int64_t num_blocks, int64_t align = 1, int32_t policy = TAGMA_POLICY_FIRST_FIT);
  ~TestEngine();
  TestEngine(const TestEngine&) = delete;
  TestEngine& operator=(const TestEngine&) = delete;

  tagma_engine_handle handle() const { return handle_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t align() const { return align_; }
  const std::set<uint64_t>& live_requests() const { return live_; }

  // These REQUIRE success.
  uint64_t new_request();
  std::vector<int32_t> append(uint64_t request, int64_t count, std::vector<int32_t>* evicted = nullptr);
  void attach(uint64_t request, const std::vector<int32_t>& blocks);
  void release(uint64_t request);
  // Tracks a request created outside new_request (e.g. by tagma_append_runs_batch).
  void adopt(uint64_t request) { live_.insert(request); }
  // The raw status of tagma_request_release; forgets the request on success.
  tagma_status try_release(uint64_t request);
  void set_policy(int32_t policy);
  void mark(const std::vector<int32_t>& blocks);
  void unmark(const std::vector<int32_t>& blocks);
  std::vector<int32_t> evict(int64_t max_blocks);

  std::vector<RangeTriple> ranges(uint64_t request) const;
  std::vector<int32_t> blocks(uint64_t request) const;  // physical ids in logical order
  Pairs free_ranges() const;
  std::vector<int32_t> lru() const;
  std::vector<int32_t> req_refs() const;
  std::vector<int32_t> cache_refs() const;
  tagma_stats stats() const;
  Snapshot snapshot() const;

  // Cross-checks stats, free list, LRU, reference counts and the live requests' ranges.
  void check_invariants() const;

 private:
  tagma_engine_handle handle_ = 0;
  int64_t num_blocks_;
  int64_t align_;
  std::set<uint64_t> live_;
};

}  // namespace test

#endif  // TAGMA_TEST_HELPERS_H
