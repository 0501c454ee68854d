// Coordinate offsets: hand-computed values, bounds, layout validation, overflow.
#include <limits>
#include <string>

#include "helpers.h"
#include "test_runner.h"

using test::check_error;
using test::require_ok;

namespace {

int64_t offset_of(const tagma_coord_layout& layout, int64_t layer, int64_t block, int64_t token) {
  int64_t offset = -1;
  require_ok(tagma_coord_offset(&layout, layer, block, token, &offset), "tagma_coord_offset");
  return offset;
}

}  // namespace

TEST(coord_offset_hand_computed_values) {
  const tagma_coord_layout layout{4, 100, 16, 256};
  CHECK_EQ(offset_of(layout, 0, 0, 0), 0);
  CHECK_EQ(offset_of(layout, 0, 0, 1), 256);
  CHECK_EQ(offset_of(layout, 0, 1, 0), 16 * 256);
  CHECK_EQ(offset_of(layout, 1, 0, 0), 100 * 16 * 256);
  CHECK_EQ(offset_of(layout, 2, 37, 5), ((2 * 100 + 37) * 16 + 5) * 256);  // 972032
  CHECK_EQ(offset_of(layout, 3, 99, 15), (4 * 100 * 16 - 1) * 256);      // the last token
}

TEST(coord_offset_bounds) {
  const tagma_coord_layout layout{4, 100, 16, 256};
  int64_t offset = -1;
  check_error(tagma_coord_offset(&layout, 4, 0, 0, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  CHECK_EQ(std::string(tagma_last_error()), std::string("tagma_coord_offset: layer 4 is outside [0, num_layers 4)"));
  check_error(tagma_coord_offset(&layout, -1, 0, 0, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  check_error(tagma_coord_offset(&layout, 0, 100, 0, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  check_error(tagma_coord_offset(&layout, 0, -1, 0, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  check_error(tagma_coord_offset(&layout, 0, 0, 16, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  check_error(tagma_coord_offset(&layout, 0, 0, -1, &offset), TAGMA_E_OUT_OF_RANGE, "tagma_coord_offset");
  CHECK_EQ(offset, -1);
}

TEST(coord_offset_layout_validation) {
  int64_t offset = -1;
  for (const tagma_coord_layout& bad : {tagma_coord_layout{0, 1, 1, 1}, tagma_coord_layout{1, -1, 1, 1},
                                        tagma_coord_layout{1, 1, 0, 1}, tagma_coord_layout{1, 1, 1, -8}}) {
    check_error(tagma_coord_offset(&bad, 0, 0, 0, &offset), TAGMA_E_INVALID_ARG, "tagma_coord_offset");
  }
  const tagma_coord_layout layout{1, 1, 1, 1};
  check_error(tagma_coord_offset(nullptr, 0, 0, 0, &offset), TAGMA_E_INVALID_ARG, "tagma_coord_offset");
  check_error(tagma_coord_offset(&layout, 0, 0, 0, nullptr), TAGMA_E_INVALID_ARG, "tagma_coord_offset");
  CHECK_EQ(offset, -1);
}

TEST(coord_offset_overflow) {
  const int64_t big = int64_t{1} << 40;
  int64_t offset = -1;
  // layer * num_blocks overflows.
  const tagma_coord_layout wide{big, big, 1, 1};
  CHECK_EQ(offset_of(wide, 0, big - 1, 0), big - 1);
  check_error(tagma_coord_offset(&wide, big - 1, 0, 0, &offset), TAGMA_E_OVERFLOW, "tagma_coord_offset");
  // (layer * num_blocks + block) * block_size overflows.
  const tagma_coord_layout tall{2, big, big, 1};
  check_error(tagma_coord_offset(&tall, 1, 0, 0, &offset), TAGMA_E_OVERFLOW, "tagma_coord_offset");
  // n * bytes_per_token overflows.
  const tagma_coord_layout heavy{1, big, 1, big};
  CHECK_EQ(offset_of(heavy, 0, (int64_t{1} << 22) - 1, 0), ((int64_t{1} << 22) - 1) * big);
  check_error(tagma_coord_offset(&heavy, 0, int64_t{1} << 23, 0, &offset), TAGMA_E_OVERFLOW, "tagma_coord_offset");
  CHECK_EQ(offset, -1);
  // The largest offset that fits.
  const int64_t max = std::numeric_limits<int64_t>::max();
  const tagma_coord_layout exact{1, 1, max, 1};
  CHECK_EQ(offset_of(exact, 0, 0, max - 1), max - 1);
}
