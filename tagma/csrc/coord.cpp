#include "coord.h"

#include "error.h"

namespace tagma {

namespace {

void check_index(int64_t value, int64_t bound, const char* name, const char* bound_name) {
  if (value < 0 || value >= bound) {
    fail(TAGMA_E_OUT_OF_RANGE, name, " ", value, " is outside [0, ", bound_name, " ", bound, ")");
  }
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) fail(TAGMA_E_OVERFLOW, what, ": ", a, " * ", b, " overflows int64");
  return result;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) fail(TAGMA_E_OVERFLOW, what, ": ", a, " + ", b, " overflows int64");
  return result;
}

}  // namespace

// n = (layer * num_blocks + block) * block_size + token; offset = n * bytes_per_token.
int64_t coord_offset(const tagma_coord_layout& layout, int64_t layer, int64_t block, int64_t token) {
  require_positive(layout.num_layers, "layout.num_layers");
  require_positive(layout.num_blocks, "layout.num_blocks");
  require_positive(layout.block_size, "layout.block_size");
  require_positive(layout.bytes_per_token, "layout.bytes_per_token");
  check_index(layer, layout.num_layers, "layer", "num_layers");
  check_index(block, layout.num_blocks, "block", "num_blocks");
  check_index(token, layout.block_size, "token", "block_size");

  const int64_t layer_block = checked_add(checked_mul(layer, layout.num_blocks, "layer * num_blocks"), block,
                                          "layer * num_blocks + block");
  const int64_t n = checked_add(checked_mul(layer_block, layout.block_size, "(layer * num_blocks + block) * block_size"),
                                token, "token index n");
  return checked_mul(n, layout.bytes_per_token, "n * bytes_per_token");
}

}  // namespace tagma
