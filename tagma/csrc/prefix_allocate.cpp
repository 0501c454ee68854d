// Allocation while the prefix index is enabled: the index's eviction mode picks which cache-only blocks
// make room.
//
// LRU: vLLM's order. LRU victims (with their subtrees) are evicted until enough blocks are free, then the
// blocks are placed as without the index (allocate_free).
//
// CONTIGUOUS: once the pool has cycled (never-used blocks were fewer than an append) cache-only blocks are
// placeable space. The request's last range grows in place over the blocks right after it that no
// request uses, evicting the cached ones among them (unless they were cached recently: older_cached_run).
// What remains becomes a new range in space no request uses, evicting only the cached blocks it covers
// (place_over_cache). Before the pool has cycled the same placement uses free blocks only and evicts
// nothing.
#include <algorithm>
#include <optional>

#include "engine.h"
#include "error.h"
#include "prefix_index.h"

namespace tagma {

// Evicts cached block `block`: a side block alone; a node with its subtree and the side blocks cached at
// them. Cache-only blocks become free (into `freed`), blocks in use only lose their cache reference.
// Returns the number of blocks freed.
int64_t Engine::prefix_evict(int32_t block, FreeRunBuilder& freed) {
  PrefixIndex& index = *prefix_;
  int64_t freed_blocks = 0;
  if (index.side_owner(block) != PrefixIndex::kNone) {
    index.remove_side(block);
    ++index.counters.side_evicted_blocks;
    freed_blocks = uncache(block, freed);
    index.counters.evicted_blocks += freed_blocks;
    return freed_blocks;
  }
  const int32_t groups = index.side_groups();
  index.remove_subtree(block, [&](int32_t node) {
    for (int32_t group = 0; group < groups; ++group) {
      const int32_t side = index.side(node, group);
      if (side == PrefixIndex::kNone) continue;
      index.remove_side(side);
      ++index.counters.side_evicted_blocks;
      freed_blocks += uncache(side, freed);
    }
    if (node != block) ++index.counters.subtree_blocks;
    freed_blocks += uncache(node, freed);
  });
  index.counters.evicted_blocks += freed_blocks;
  return freed_blocks;
}

int64_t Engine::uncache(int32_t block, FreeRunBuilder& freed) {
  const auto b = static_cast<size_t>(block);
  cache_refs_[b] = 0;
  if (req_refs_[b] != 0) return 0;
  lru_.remove(block);
  freed.add(block);
  prefix_evicted_.push_back(block);
  return 1;
}

// Evicts LRU victims (with their subtrees) until `count` blocks are free. Returns the blocks freed.
int64_t Engine::evict_lru_until_free(int64_t count) {
  const int64_t need = count - free_list_.free_blocks();  // the builder adds to the free list as it goes
  FreeRunBuilder freed(free_list_);
  int64_t done = 0;
  while (done < need) done += prefix_evict(lru_.front(), freed);
  freed.flush();
  return done;
}

// Evicts the cached blocks of [start, start + count), where no request uses any block, so that the whole
// window is free. Returns the blocks freed (subtrees included).
int64_t Engine::evict_unused(int32_t start, int32_t count) {
  FreeRunBuilder freed(free_list_);
  int64_t evicted = 0;
  for (int32_t block = start; block < start + count; ++block) {
    if (lru_.contains(block)) evicted += prefix_evict(block, freed);
  }
  freed.flush();
  return evicted;
}

// Where a new range of `count` blocks goes in CONTIGUOUS mode, for request `id`, which expects `want` >=
// count blocks from here (its growth hint), among free blocks and, when `over_cached`, cached ones too;
// nullopt when no run of that space holds `count`.
// Candidates, in order: the largest free range (no eviction); over cached blocks too, the unused runs
// of the next LRU victims (kAnchorRuns distinct runs at most: cached blocks LRU evicts next) and the
// largest unused run. The first that holds the new range wins (place_in_run), tried in passes: `want` past
// the left neighbour's reservation (its remaining expected blocks), `want` in the middle of the slack, then
// `count` the same two ways.
std::optional<int32_t> Engine::place_over_cache(uint64_t id, int32_t count, int64_t want,
                                                bool over_cached) const {
  constexpr int kAnchorRuns = 16;
  constexpr int kAnchorVictims = 256;
  const int64_t wants[2] = {want, count};
  for (const int64_t wanted : wants) {
    for (const bool respect_reservation : {true, false}) {
      std::optional<int32_t> start;
      if (free_list_.total_capacity() > 0) {
        start = place_in_run(id, free_list_.largest_by_capacity(), -1, wanted, respect_reservation);
        if (start) return start;
      }
      if (!over_cached) continue;  // no eviction: free ranges only
      int runs = 0;
      int32_t last_run = -1;
      int victims = 0;
      for (int32_t victim = lru_.size() > 0 ? lru_.front() : -1;
           victim >= 0 && runs < kAnchorRuns && victims < kAnchorVictims; victim = lru_.next(victim), ++victims) {
        const FreeRange run = unused_->range_holding(victim);
        if (run.start == last_run) continue;  // a chain's blocks enter the LRU together: one try per run
        last_run = run.start;
        ++runs;
        start = place_in_run(id, run, victim, wanted, respect_reservation);
        if (start) return start;
      }
      if (unused_->total_capacity() > 0) {
        start = place_in_run(id, unused_->largest_by_capacity(), -1, wanted, respect_reservation);
        if (start) return start;
      }
    }
    if (want == count) break;
  }
  return std::nullopt;
}

// Where a new range that wants `want` blocks (its own and its room to grow) starts in `run` (free or unused
// blocks; the block before it is in use or the run starts the usable space), or nullopt when it does not
// fit:
//   respecting the reservation: past the left neighbour's remaining expected blocks, `want` must fit in the
//   rest of the run, and the range starts anywhere from there to the latest start that leaves `want`;
//   otherwise: `want` must fit in the run, and the range starts no earlier than the middle of the slack
//   (the left neighbour keeps half of it) and no later than leaves `want`.
// Within those bounds, a range anchored at a cached `victim` takes the `want` blocks that end at it (or
// holds it within them; nullopt when the bounds leave the victim out: the run is not tried): a
// released request's blocks enter the LRU tail last block first, so the victim ends a cached chain, the
// blocks before it are what LRU evicts next, and evicting the range's first block evicts the chain from
// there on (its subtree): the range's room to grow becomes free while the chain's prefix stays cached.
// Without a victim, respecting the reservation: right where it ends, so the rest of the run stays one run
// for the next range (a middle start halves the largest run at every admission, and a batch of admissions
// after it is left only runs too short for their hints); ignoring it, the middle of the bounds.
std::optional<int32_t> Engine::place_in_run(uint64_t id, FreeRange run, int32_t victim, int64_t want,
                                            bool respect_reservation) const {
  const int64_t end = int64_t{run.start} + run.count;
  const int64_t latest = end - want;
  int64_t earliest = run.start;
  if (respect_reservation) {
    earliest += std::min<int64_t>(reserved_at(run.start, id), run.count);
  } else if (run.start != geometry_.first_usable) {
    earliest += (run.count - want) / 2;
  }
  if (latest < earliest) return std::nullopt;
  if (victim < 0) {
    return static_cast<int32_t>(respect_reservation ? earliest : earliest + (latest - earliest) / 2);
  }
  const int64_t start = std::clamp(int64_t{victim} - want + 1, earliest, latest);
  if (victim < start || victim >= start + want) return std::nullopt;  // the bounds left the victim out
  return static_cast<int32_t>(start);
}

// How many of the `count` unused blocks right after `request`'s last range may be evicted for its in-place
// growth: up to the first cached block that entered the LRU in its newer half, unless the block lies in
// the request's room, i.e. within its remaining expected blocks and cached before its last range was
// placed (the placement chose that room, over those blocks). Evicting a block evicts its subtree, so a
// chain freed recently (a preempted request's blocks, which come back soon) is not cut at its head for a
// neighbour's growth: the neighbour takes a new range over older cached blocks instead. The room is
// exempt because the LRU's halves move as its old blocks are evicted: a room placed over the oldest
// blocks reads as "newer half" once enough older ones are gone.
int32_t Engine::older_cached_run(const Request& request, int32_t count) const {
  const int32_t start = request.ranges().back().end();
  const int64_t room = request.remaining_expected();
  for (int32_t block = start; block < start + count; ++block) {
    if (!lru_.contains(block) || lru_.older_half(block)) continue;
    const bool in_room = block - start < room && lru_.stamp(block) < request.placed_at();
    if (!in_room) return block - start;
  }
  return count;
}

// Requires free + cache-only blocks >= count (align is 1 with the index).
void Engine::prefix_allocate(uint64_t id, Request& request, int64_t count, int32_t* new_blocks_out) {
  PrefixIndex& index = *prefix_;
  prefix_evicted_.clear();
  if (index.mode() == EvictionMode::kLru) {
    counters_.evictions += evict_lru_until_free(count);
    allocate_free(id, request, count, new_blocks_out);
    return;
  }
  // Once the never-used blocks do not cover an append (the pool has cycled: vLLM's would evict now too)
  // cached blocks are placeable space, from then on for good: placement over cached blocks skips some
  // never-used ones, and the few left would keep every small append (a decode's one block) off cached
  // space, so that no request could grow in place over the cached blocks after it. Before, only free
  // blocks are space, and nothing is evicted: while vLLM's pool hands out never-used blocks, the cache
  // keeps what vLLM's keeps.
  if (never_used_ < count) pool_cycled_ = true;
  const FreeList& space = pool_cycled_ ? *unused_ : free_list_;
  const int64_t ranges_before = request.num_ranges();
  const int32_t end_before = request.ranges().empty() ? -1 : request.ranges().back().end();
  int64_t evicted = 0;
  auto rest = static_cast<int32_t>(count);
  if (end_before >= 0) {  // in place, over the space right after the last range
    int32_t room = std::min(rest, space.run_at(end_before));
    if (pool_cycled_) room = older_cached_run(request, room);
    if (room > 0) {
      const int64_t in_place = evict_unused(end_before, room);
      index.counters.in_place_evictions += in_place;
      evicted += in_place;
      take_blocks(request, end_before, room, new_blocks_out);
      ++counters_.in_place_growths;
      rest -= room;
    }
  }
  const int64_t grown = count - rest;
  while (rest > 0) {
    const int64_t want = std::max<int64_t>(rest, std::min<int64_t>(growth_hint_ - grown, geometry_.num_blocks));
    std::optional<int32_t> start = place_over_cache(id, rest, want, pool_cycled_);
    int32_t piece = rest;
    if (!start) {  // no run of the space holds the rest: the largest runs, one piece each
      const FreeRange largest = space.largest_by_capacity();
      start = largest.start;
      piece = largest.count;
    }
    const int64_t window = evict_unused(*start, piece);
    if (window > 0) ++index.counters.window_evictions;
    evicted += window;
    add_new_range(request, *start, piece, new_blocks_out);
    request.set_placed_at(lru_.clock());
    rest -= piece;
  }
  counters_.evictions += evicted;
  counters_.appended_blocks += count;
  range_counts_.change(ranges_before, request.num_ranges());
  update_frontier(id, request, end_before);
}

}  // namespace tagma
