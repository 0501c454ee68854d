#include "helpers.h"

#include <algorithm>
#include <cstring>

namespace test {

std::ostream& operator<<(std::ostream& out, const RangeTriple& range) {
  return out << "{" << range.start << ", " << range.count << ", " << range.first_logical << "}";
}

std::vector<double> stats_fields(const tagma_stats& s) {
  return {static_cast<double>(s.num_blocks),         static_cast<double>(s.usable_blocks),
          static_cast<double>(s.free_blocks),        static_cast<double>(s.cached_only_blocks),
          static_cast<double>(s.used_blocks),        static_cast<double>(s.free_ranges),
          static_cast<double>(s.largest_free_range), s.external_fragmentation,
          static_cast<double>(s.live_requests),      static_cast<double>(s.total_request_ranges),
          static_cast<double>(s.max_request_ranges), static_cast<double>(s.in_place_growths),
          static_cast<double>(s.new_ranges),         static_cast<double>(s.merges),
          static_cast<double>(s.evictions),          static_cast<double>(s.appended_blocks)};
}

bool Snapshot::operator==(const Snapshot& other) const {
  return stats == other.stats && free_ranges == other.free_ranges && req_refs == other.req_refs &&
         cache_refs == other.cache_refs && lru == other.lru;
}

std::ostream& operator<<(std::ostream& out, const Snapshot& snapshot) {
  return out << "stats " << show(snapshot.stats) << " free " << show(snapshot.free_ranges) << " lru "
             << show(snapshot.lru);
}

void require_ok(tagma_status status, const char* what) {
  if (status != TAGMA_OK) {
    record_failure(__FILE__, __LINE__,
                   std::string(what) + " returned " + std::to_string(status) + ": " + tagma_last_error());
    throw Abort{};
  }
}

void check_error(tagma_status status, tagma_status expected, const char* function) {
  CHECK_EQ(status, expected);
  const std::string prefix = std::string(function) + ": ";
  const std::string message = tagma_last_error();
  if (message.compare(0, prefix.size(), prefix) != 0 || message.size() <= prefix.size()) {
    record_failure(__FILE__, __LINE__, "last error \"" + message + "\" does not start with \"" + prefix + "\"");
  }
}

TestEngine::TestEngine(int64_t num_blocks, int64_t align, int32_t policy) : num_blocks_(num_blocks), align_(align) {
  require_ok(tagma_engine_create(num_blocks, align, policy, &handle_), "tagma_engine_create");
}

TestEngine::~TestEngine() { tagma_engine_destroy(handle_); }

uint64_t TestEngine::new_request() {
  uint64_t request = 0;
  require_ok(tagma_request_create(handle_, &request), "tagma_request_create");
  live_.insert(request);
  return request;
}

std::vector<int32_t> TestEngine::append(uint64_t request, int64_t count, std::vector<int32_t>* evicted) {
  std::vector<int32_t> blocks(static_cast<size_t>(count), -1);
  std::vector<int32_t> evicted_blocks(static_cast<size_t>(count), -1);
  int64_t num_evicted = -1;
  require_ok(tagma_request_append(handle_, request, count, blocks.data(), evicted_blocks.data(), &num_evicted),
             "tagma_request_append");
  evicted_blocks.resize(static_cast<size_t>(num_evicted));
  if (evicted != nullptr) *evicted = evicted_blocks;
  return blocks;
}

void TestEngine::attach(uint64_t request, const std::vector<int32_t>& blocks) {
  require_ok(tagma_request_attach(handle_, request, blocks.data(), static_cast<int64_t>(blocks.size())),
             "tagma_request_attach");
}

void TestEngine::release(uint64_t request) {
  require_ok(tagma_request_release(handle_, request), "tagma_request_release");
  live_.erase(request);
}

tagma_status TestEngine::try_release(uint64_t request) {
  const tagma_status status = tagma_request_release(handle_, request);
  if (status == TAGMA_OK) live_.erase(request);
  return status;
}

void TestEngine::set_policy(int32_t policy) { require_ok(tagma_engine_set_policy(handle_, policy), "set_policy"); }

void TestEngine::mark(const std::vector<int32_t>& blocks) {
  require_ok(tagma_cache_mark(handle_, blocks.data(), static_cast<int64_t>(blocks.size())), "tagma_cache_mark");
}

void TestEngine::unmark(const std::vector<int32_t>& blocks) {
  require_ok(tagma_cache_unmark(handle_, blocks.data(), static_cast<int64_t>(blocks.size())), "tagma_cache_unmark");
}

std::vector<int32_t> TestEngine::evict(int64_t max_blocks) {
  std::vector<int32_t> evicted(static_cast<size_t>(max_blocks), -1);
  int64_t num_evicted = -1;
  require_ok(tagma_cache_evict(handle_, max_blocks, evicted.data(), &num_evicted), "tagma_cache_evict");
  evicted.resize(static_cast<size_t>(num_evicted));
  return evicted;
}

std::vector<RangeTriple> TestEngine::ranges(uint64_t request) const {
  int64_t total = 0;
  require_ok(tagma_request_ranges(handle_, request, nullptr, 0, &total), "tagma_request_ranges");
  std::vector<int32_t> flat(static_cast<size_t>(3 * total));
  int64_t again = 0;
  require_ok(tagma_request_ranges(handle_, request, flat.data(), total, &again), "tagma_request_ranges");
  std::vector<RangeTriple> ranges;
  for (size_t i = 0; i < flat.size(); i += 3) ranges.push_back(RangeTriple{flat[i], flat[i + 1], flat[i + 2]});
  return ranges;
}

std::vector<int32_t> TestEngine::blocks(uint64_t request) const {
  std::vector<int32_t> blocks;
  for (const RangeTriple& range : ranges(request)) {
    for (int32_t i = 0; i < range.count; ++i) blocks.push_back(range.start + i);
  }
  return blocks;
}

Pairs TestEngine::free_ranges() const {
  int64_t total = 0;
  require_ok(tagma_free_ranges(handle_, nullptr, 0, &total), "tagma_free_ranges");
  std::vector<int32_t> flat(static_cast<size_t>(2 * total));
  require_ok(tagma_free_ranges(handle_, flat.data(), total, &total), "tagma_free_ranges");
  Pairs pairs;
  for (size_t i = 0; i < flat.size(); i += 2) pairs.emplace_back(flat[i], flat[i + 1]);
  return pairs;
}

std::vector<int32_t> TestEngine::lru() const {
  int64_t total = 0;
  require_ok(tagma_lru_order(handle_, nullptr, 0, &total), "tagma_lru_order");
  std::vector<int32_t> order(static_cast<size_t>(total));
  require_ok(tagma_lru_order(handle_, order.data(), total, &total), "tagma_lru_order");
  return order;
}

std::vector<int32_t> TestEngine::req_refs() const {
  std::vector<int32_t> refs(static_cast<size_t>(num_blocks_));
  require_ok(tagma_block_state(handle_, refs.data(), nullptr, num_blocks_), "tagma_block_state");
  return refs;
}

std::vector<int32_t> TestEngine::cache_refs() const {
  std::vector<int32_t> refs(static_cast<size_t>(num_blocks_));
  require_ok(tagma_block_state(handle_, nullptr, refs.data(), num_blocks_), "tagma_block_state");
  return refs;
}

tagma_stats TestEngine::stats() const {
  tagma_stats stats{};
  require_ok(tagma_engine_stats(handle_, &stats), "tagma_engine_stats");
  return stats;
}

Snapshot TestEngine::snapshot() const {
  return Snapshot{stats_fields(stats()), free_ranges(), req_refs(), cache_refs(), lru()};
}

void TestEngine::check_invariants() const {
  const tagma_stats s = stats();
  const int64_t first_usable = align_;
  const int64_t end_usable = num_blocks_ / align_ * align_;
  CHECK_EQ(s.num_blocks, num_blocks_);
  CHECK_EQ(s.usable_blocks, end_usable - first_usable);

  // Free list: sorted, coalesced, inside the usable space; blocks in it have no reference.
  const Pairs free = free_ranges();
  const std::vector<int32_t> req = req_refs();
  const std::vector<int32_t> cache = cache_refs();
  std::vector<bool> is_free(static_cast<size_t>(num_blocks_), false);
  int64_t free_blocks = 0;
  int64_t largest = 0;
  for (size_t i = 0; i < free.size(); ++i) {
    const auto [start, count] = free[i];
    CHECK(count > 0);
    CHECK(start >= first_usable && start + count <= end_usable);
    if (i > 0) CHECK(free[i - 1].first + free[i - 1].second < start);
    for (int32_t b = start; b < start + count; ++b) is_free[static_cast<size_t>(b)] = true;
    free_blocks += count;
    largest = std::max<int64_t>(largest, count);
  }
  CHECK_EQ(s.free_blocks, free_blocks);
  CHECK_EQ(s.free_ranges, static_cast<int64_t>(free.size()));
  CHECK_EQ(s.largest_free_range, largest);
  CHECK_EQ(s.external_fragmentation,
           free_blocks == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(free_blocks));

  // LRU: exactly the cache-only blocks, each once.
  const std::vector<int32_t> order = lru();
  std::vector<int32_t> sorted_lru = order;
  std::sort(sorted_lru.begin(), sorted_lru.end());
  CHECK(std::adjacent_find(sorted_lru.begin(), sorted_lru.end()) == sorted_lru.end());
  int64_t used = 0;
  int64_t cache_only = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const auto i = static_cast<size_t>(b);
    const bool usable = b >= first_usable && b < end_usable;
    if (!usable || is_free[i]) CHECK(req[i] == 0 && cache[i] == 0);
    if (usable && !is_free[i]) CHECK(req[i] > 0 || cache[i] > 0);
    const bool listed = std::binary_search(sorted_lru.begin(), sorted_lru.end(), b);
    CHECK_EQ(listed, req[i] == 0 && cache[i] > 0);
    used += req[i] > 0 ? 1 : 0;
    cache_only += req[i] == 0 && cache[i] > 0 ? 1 : 0;
  }
  CHECK_EQ(s.used_blocks, used);
  CHECK_EQ(s.cached_only_blocks, cache_only);
  CHECK_EQ(s.cached_only_blocks, static_cast<int64_t>(order.size()));
  CHECK_EQ(s.free_blocks + s.cached_only_blocks + s.used_blocks, s.usable_blocks);

  // Requests: ranges contiguous from logical 0, never physically adjacent; they account for req_refs.
  std::vector<int32_t> held(static_cast<size_t>(num_blocks_), 0);
  int64_t total_ranges = 0;
  int64_t max_ranges = 0;
  for (const uint64_t request : live_) {
    const std::vector<RangeTriple> request_ranges = ranges(request);
    int32_t next_logical = 0;
    for (size_t i = 0; i < request_ranges.size(); ++i) {
      const RangeTriple& range = request_ranges[i];
      CHECK(range.count > 0);
      CHECK_EQ(range.first_logical, next_logical);
      if (i > 0) CHECK(request_ranges[i - 1].start + request_ranges[i - 1].count != range.start);
      for (int32_t b = range.start; b < range.start + range.count; ++b) ++held[static_cast<size_t>(b)];
      next_logical += range.count;
    }
    int64_t num_blocks = -1;
    require_ok(tagma_request_num_blocks(handle_, request, &num_blocks), "tagma_request_num_blocks");
    CHECK_EQ(num_blocks, int64_t{next_logical});
    total_ranges += static_cast<int64_t>(request_ranges.size());
    max_ranges = std::max<int64_t>(max_ranges, static_cast<int64_t>(request_ranges.size()));
  }
  CHECK_EQ(held, req);
  CHECK_EQ(s.live_requests, static_cast<int64_t>(live_.size()));
  CHECK_EQ(s.total_request_ranges, total_ranges);
  CHECK_EQ(s.max_request_ranges, max_ranges);
}

}  // namespace test
