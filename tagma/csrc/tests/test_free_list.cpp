// Unit tests of the free list, its max tree and the run builder (internal C++ API).
#include <optional>

#include "error.h"
#include "free_list.h"
#include "helpers.h"
#include "max_tree.h"
#include "test_runner.h"

using tagma::FreeList;
using tagma::Policy;

namespace {

test::Pairs ranges_of(const FreeList& list) {
  test::Pairs pairs;
  for (const auto& [start, count] : list.ranges()) pairs.emplace_back(start, count);
  return pairs;
}

// A free list over [first, end) whose free ranges are exactly `free`.
FreeList make_free_list(int32_t first, int32_t end, int32_t align, const test::Pairs& free) {
  FreeList list(first, end, align);
  list.take(first, end - first);
  for (const auto& [start, count] : free) list.add(start, count);
  return list;
}

tagma_status internal_error_of(void (*operation)(FreeList&), FreeList& list) {
  try {
    operation(list);
  } catch (const tagma::Error& error) {
    return error.status();
  }
  return TAGMA_OK;
}

}  // namespace

TEST(free_list_starts_as_one_range) {
  const FreeList list(1, 16, 1);
  CHECK_EQ(ranges_of(list), (test::Pairs{{1, 15}}));
  CHECK_EQ(list.free_blocks(), 15);
  CHECK_EQ(list.num_ranges(), 1);
  CHECK_EQ(list.largest_range(), 15);
  CHECK_EQ(list.total_capacity(), 15);
}

TEST(free_list_take_splits_and_add_coalesces) {
  FreeList list(1, 16, 1);
  list.take(5, 3);
  CHECK_EQ(ranges_of(list), (test::Pairs{{1, 4}, {8, 8}}));
  list.take(1, 2);  // from the left end
  list.take(14, 2);  // from the right end
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 2}, {8, 6}}));
  list.add(5, 1);  // merges with the left neighbour only
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 3}, {8, 6}}));
  list.add(7, 1);  // merges with the right neighbour only
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 3}, {7, 7}}));
  list.add(6, 1);  // merges with both neighbours
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 11}}));
  list.add(15, 1);  // no free neighbour
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 11}, {15, 1}}));
  list.add(1, 2);
  list.add(14, 1);
  CHECK_EQ(ranges_of(list), (test::Pairs{{1, 15}}));
  CHECK_EQ(list.free_blocks(), 15);
  CHECK_EQ(list.largest_range(), 15);
}

TEST(free_list_first_fit_picks_lowest_address_that_fits) {
  const FreeList list = make_free_list(1, 41, 1, {{1, 2}, {6, 8}, {16, 5}, {24, 4}});
  CHECK_EQ(list.place(Policy::kFirstFit, 2), std::optional<int32_t>(1));
  CHECK_EQ(list.place(Policy::kFirstFit, 3), std::optional<int32_t>(6));
  CHECK_EQ(list.place(Policy::kFirstFit, 8), std::optional<int32_t>(6));
  CHECK(!list.place(Policy::kFirstFit, 9).has_value());
}

TEST(free_list_best_fit_picks_smallest_then_lowest_address) {
  const FreeList list = make_free_list(1, 41, 1, {{1, 2}, {6, 8}, {16, 5}, {24, 4}, {30, 4}});
  CHECK_EQ(list.place(Policy::kBestFit, 1), std::optional<int32_t>(1));
  CHECK_EQ(list.place(Policy::kBestFit, 3), std::optional<int32_t>(24));  // ties with 30: lowest address
  CHECK_EQ(list.place(Policy::kBestFit, 5), std::optional<int32_t>(16));
  CHECK_EQ(list.place(Policy::kBestFit, 6), std::optional<int32_t>(6));
  CHECK(!list.place(Policy::kBestFit, 9).has_value());
}

TEST(free_list_headroom_places_in_the_middle_of_the_largest) {
  const FreeList list = make_free_list(1, 41, 1, {{1, 2}, {6, 8}, {16, 5}, {24, 4}});
  CHECK_EQ(list.place(Policy::kHeadroom, 4), std::optional<int32_t>(8));  // 6 + (8 - 4) / 2
  CHECK_EQ(list.place(Policy::kHeadroom, 3), std::optional<int32_t>(8));  // 6 + (8 - 3) / 2 rounded down
  CHECK_EQ(list.place(Policy::kHeadroom, 8), std::optional<int32_t>(6));
  CHECK(!list.place(Policy::kHeadroom, 9).has_value());
}

TEST(free_list_headroom_uses_the_start_of_a_range_at_the_first_usable_block) {
  const FreeList list = make_free_list(1, 41, 1, {{1, 10}, {20, 10}});  // tie: lowest address wins
  CHECK_EQ(list.place(Policy::kHeadroom, 4), std::optional<int32_t>(1));
  const FreeList aligned = make_free_list(4, 64, 4, {{4, 16}, {40, 8}});
  CHECK_EQ(aligned.place(Policy::kHeadroom, 4), std::optional<int32_t>(4));
}

TEST(free_list_headroom_middle_is_rounded_down_to_alignment) {
  // [12, 36): (24 - 4) / 2 = 10 -> 22 -> 20.
  const FreeList list = make_free_list(4, 64, 4, {{12, 24}});
  CHECK_EQ(list.place(Policy::kHeadroom, 4), std::optional<int32_t>(20));
  // Unaligned [9, 22): the middle 9 + (13 - 8) / 2 = 11 rounds down to 8, before the first aligned block 12.
  const FreeList unaligned = make_free_list(4, 64, 4, {{9, 13}});
  CHECK_EQ(unaligned.place(Policy::kHeadroom, 8), std::optional<int32_t>(12));
}

TEST(free_list_capacity_counts_aligned_blocks_only) {
  const FreeList list = make_free_list(4, 64, 4, {{5, 9}, {17, 3}, {24, 8}, {41, 10}});
  CHECK_EQ(list.capacity(5, 9), 4);    // [8, 12)
  CHECK_EQ(list.capacity(17, 3), 0);   // no aligned block
  CHECK_EQ(list.capacity(24, 8), 8);
  CHECK_EQ(list.capacity(41, 10), 4);  // [44, 48)
  CHECK_EQ(list.total_capacity(), 16);
  CHECK_EQ(list.free_blocks(), 30);
  CHECK_EQ(list.place(Policy::kFirstFit, 4), std::optional<int32_t>(8));
  CHECK_EQ(list.place(Policy::kFirstFit, 8), std::optional<int32_t>(24));
  CHECK_EQ(list.place(Policy::kBestFit, 4), std::optional<int32_t>(8));
  CHECK(!list.place(Policy::kBestFit, 12).has_value());
  const tagma::FreeRange largest = list.largest_by_capacity();
  CHECK_EQ(largest.start, 24);
  CHECK_EQ(largest.count, 8);
}

TEST(free_list_run_at_reports_only_ranges_starting_there) {
  const FreeList list = make_free_list(1, 41, 1, {{6, 8}});
  CHECK_EQ(list.run_at(6), 8);
  CHECK_EQ(list.run_at(7), 0);
  CHECK_EQ(list.run_at(14), 0);
}

TEST(free_list_rejects_double_free_and_taking_used_blocks) {
  FreeList list = make_free_list(1, 41, 1, {{6, 8}});
  CHECK_EQ(internal_error_of([](FreeList& l) { l.add(13, 2); }, list), TAGMA_E_INTERNAL);  // overlaps [6, 14)
  CHECK_EQ(internal_error_of([](FreeList& l) { l.add(4, 3); }, list), TAGMA_E_INTERNAL);
  CHECK_EQ(internal_error_of([](FreeList& l) { l.add(0, 1); }, list), TAGMA_E_INTERNAL);   // null block
  CHECK_EQ(internal_error_of([](FreeList& l) { l.add(40, 2); }, list), TAGMA_E_INTERNAL);  // past the end
  CHECK_EQ(internal_error_of([](FreeList& l) { l.take(12, 3); }, list), TAGMA_E_INTERNAL);
  CHECK_EQ(internal_error_of([](FreeList& l) { l.take(2, 1); }, list), TAGMA_E_INTERNAL);
  CHECK_EQ(ranges_of(list), (test::Pairs{{6, 8}}));
}

TEST(max_tree_finds_leftmost_index_at_least) {
  tagma::MaxTree tree(10);
  CHECK_EQ(tree.leftmost_at_least(1), -1);
  tree.set(7, 5);
  tree.set(2, 3);
  tree.set(9, 8);
  CHECK_EQ(tree.leftmost_at_least(1), 2);
  CHECK_EQ(tree.leftmost_at_least(4), 7);
  CHECK_EQ(tree.leftmost_at_least(6), 9);
  CHECK_EQ(tree.leftmost_at_least(9), -1);
  tree.set(7, 0);
  CHECK_EQ(tree.leftmost_at_least(4), 9);
  tree.set(9, 0);
  CHECK_EQ(tree.leftmost_at_least(4), -1);
  CHECK_EQ(tree.leftmost_at_least(3), 2);
}

TEST(free_run_builder_adds_one_range_per_run) {
  FreeList list = make_free_list(1, 41, 1, {});
  tagma::FreeRunBuilder freed(list);
  for (const int32_t block : {9, 8, 7, 20, 21, 22, 5, 3}) freed.add(block);
  freed.flush();
  CHECK_EQ(ranges_of(list), (test::Pairs{{3, 1}, {5, 1}, {7, 3}, {20, 3}}));
}
