// Engine construction, request bookkeeping, queries and inspection.
#include "engine.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "error.h"
#include "prefix_index.h"  // complete type for the constructors and the destructor

namespace tagma {

Geometry Geometry::validate(int64_t num_blocks, int64_t align) {
  if (num_blocks < 2) fail(TAGMA_E_INVALID_ARG, "num_blocks ", num_blocks, " must be >= 2");
  if (num_blocks > std::numeric_limits<int32_t>::max()) {
    fail(TAGMA_E_INVALID_ARG, "num_blocks ", num_blocks, " exceeds the int32 block id space");
  }
  require_positive(align, "align");
  const int64_t end_usable = align_down(num_blocks, align);
  if (end_usable <= align) {
    fail(TAGMA_E_INVALID_ARG, "align ", align, " leaves no usable block among num_blocks ", num_blocks);
  }
  return Geometry{static_cast<int32_t>(num_blocks), static_cast<int32_t>(align), static_cast<int32_t>(align),
                  static_cast<int32_t>(end_usable)};
}

Engine::Engine(int64_t num_blocks, int64_t align, int32_t policy)
    : Engine(Geometry::validate(num_blocks, align), parse_policy(policy)) {}

Engine::Engine(const Geometry& geometry, Policy policy)
    : geometry_(geometry),
      policy_(policy),
      req_refs_(static_cast<size_t>(geometry.num_blocks), 0),
      cache_refs_(static_cast<size_t>(geometry.num_blocks), 0),
      free_list_(geometry.first_usable, geometry.end_usable, geometry.align),
      lru_(geometry.num_blocks) {}

Engine::~Engine() = default;

void Engine::set_policy(int32_t policy) {
  const Policy parsed = parse_policy(policy);
  if (parsed == Policy::kReserve && !tracks_frontiers()) frontiers_ = live_frontiers();  // it was not kept
  policy_ = parsed;
}

// frontiers_ as the live requests make it (it is not kept while no placement reads it).
std::unordered_map<int32_t, uint64_t> Engine::live_frontiers() const {
  std::unordered_map<int32_t, uint64_t> frontiers;
  for (const auto& [id, request] : requests_) {
    if (!request.ranges().empty()) frontiers[request.ranges().back().end()] = id;
  }
  return frontiers;
}

void Engine::set_admission(int32_t percent, int32_t pieces) {
  if (percent < 0 || percent > 100) fail(TAGMA_E_INVALID_ARG, "admission percent ", percent, " is outside [0, 100]");
  if (pieces < 1) fail(TAGMA_E_INVALID_ARG, "admission pieces ", pieces, " must be >= 1");
  admission_percent_ = percent;
  admission_pieces_ = pieces;
}

tagma_stats Engine::stats() const {
  tagma_stats s{};
  s.num_blocks = geometry_.num_blocks;
  s.usable_blocks = geometry_.end_usable - geometry_.first_usable;
  s.free_blocks = free_list_.free_blocks();
  s.cached_only_blocks = lru_.size();
  s.used_blocks = used_blocks_;
  s.free_ranges = free_list_.num_ranges();
  s.largest_free_range = free_list_.largest_range();
  s.external_fragmentation =
      s.free_blocks == 0 ? 0.0
                         : 1.0 - static_cast<double>(s.largest_free_range) / static_cast<double>(s.free_blocks);
  s.live_requests = static_cast<int64_t>(requests_.size());
  s.total_request_ranges = range_counts_.total_ranges();
  s.max_request_ranges = range_counts_.max_ranges();
  s.in_place_growths = counters_.in_place_growths;
  s.new_ranges = counters_.new_ranges;
  s.merges = counters_.merges;
  s.evictions = counters_.evictions;
  s.appended_blocks = counters_.appended_blocks;
  return s;
}

uint64_t Engine::create_request() {
  const uint64_t id = next_request_id_;
  requests_.emplace(id, Request{});
  range_counts_.add(0);
  ++next_request_id_;
  return id;
}

const Request& Engine::find_request(uint64_t id) const {
  const auto found = requests_.find(id);
  if (found == requests_.end()) fail(TAGMA_E_NOT_FOUND, "request ", id, " is unknown or released");
  return found->second;
}

Request& Engine::find_request(uint64_t id) { return const_cast<Request&>(std::as_const(*this).find_request(id)); }

void Engine::check_block_id(int32_t block, int64_t index) const {
  if (block < 0 || block >= geometry_.num_blocks) {
    fail(TAGMA_E_OUT_OF_RANGE, "block id ", block, " at index ", index, " is outside [0, ", geometry_.num_blocks,
         ")");
  }
}

void Engine::check_not_free(int32_t block, int64_t index) const {
  if (block == 0) fail(TAGMA_E_STATE, "block 0 at index ", index, " is the null block");
  if (req_refs_[static_cast<size_t>(block)] == 0 && cache_refs_[static_cast<size_t>(block)] == 0) {
    fail(TAGMA_E_STATE, "block ", block, " at index ", index, " is free");
  }
}

int64_t Engine::request_num_blocks(uint64_t id) const { return find_request(id).num_blocks(); }

int64_t Engine::request_num_ranges(uint64_t id) const { return find_request(id).num_ranges(); }

void Engine::request_ranges(uint64_t id, int32_t* out, int64_t capacity, int64_t* num_ranges) const {
  const Request& request = find_request(id);
  require_output_buffer(out, capacity, num_ranges, "num_ranges");
  const auto copied = static_cast<size_t>(std::min(capacity, request.num_ranges()));
  for (size_t i = 0; i < copied; ++i) {
    const Range& range = request.ranges()[i];
    out[3 * i] = range.start;
    out[3 * i + 1] = range.count;
    out[3 * i + 2] = range.first_logical;
  }
  *num_ranges = request.num_ranges();
}

int32_t Engine::request_block(uint64_t id, int64_t logical) const {
  const Request& request = find_request(id);
  if (logical < 0 || logical >= request.num_blocks()) {
    fail(TAGMA_E_OUT_OF_RANGE, "logical block ", logical, " is outside [0, ", request.num_blocks(), ") of request ",
         id);
  }
  return request.physical(logical);
}

void Engine::request_blocks(uint64_t id, int64_t first, int64_t count, int32_t* out) const {
  const Request& request = find_request(id);
  require_positive(count, "count");
  require_non_null(out, "out");
  if (first < 0 || first > request.num_blocks() - count) {
    fail(TAGMA_E_OUT_OF_RANGE, "count ", count, " logical blocks from ", first, " are not inside [0, ",
         request.num_blocks(), ") of request ", id);
  }
  // Walk the ranges from the one holding `first`; no per-block search.
  size_t index = request.range_index(first);
  for (int64_t logical = first; logical < first + count; ++logical) {
    const Range* range = &request.ranges()[index];
    if (logical >= int64_t{range->first_logical} + range->count) range = &request.ranges()[++index];
    *out++ = static_cast<int32_t>(range->start + (logical - range->first_logical));
  }
}

void Engine::block_state(int32_t* req_refs, int32_t* cache_refs, int64_t capacity) const {
  if (capacity < geometry_.num_blocks) {
    fail(TAGMA_E_INVALID_ARG, "capacity ", capacity, " is less than num_blocks ", geometry_.num_blocks);
  }
  if (req_refs != nullptr) std::copy(req_refs_.begin(), req_refs_.end(), req_refs);
  if (cache_refs != nullptr) std::copy(cache_refs_.begin(), cache_refs_.end(), cache_refs);
}

void Engine::free_ranges(int32_t* out, int64_t capacity, int64_t* num_ranges) const {
  require_output_buffer(out, capacity, num_ranges, "num_ranges");
  int64_t written = 0;
  for (const auto& [start, count] : free_list_.ranges()) {
    if (written == capacity) break;
    out[2 * written] = start;
    out[2 * written + 1] = count;
    ++written;
  }
  *num_ranges = free_list_.num_ranges();
}

void Engine::lru_order(int32_t* out, int64_t capacity, int64_t* num_blocks) const {
  require_output_buffer(out, capacity, num_blocks, "num_blocks");
  int64_t written = 0;
  for (int32_t block = lru_.size() > 0 ? lru_.front() : -1; block >= 0 && written < capacity;
       block = lru_.next(block)) {
    out[written++] = block;
  }
  *num_blocks = lru_.size();
}

void Engine::ranges_histogram(int64_t* out, int64_t capacity) const {
  require_positive(capacity, "capacity");
  require_non_null(out, "out");
  std::fill(out, out + capacity, 0);
  for (const auto& [ranges, requests] : range_counts_.requests_by_ranges()) out[std::min(ranges, capacity - 1)] += requests;
}

}  // namespace tagma
