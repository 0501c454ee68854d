// Byte offset of a (layer, block, token) coordinate in a KV cache layout; pure function.
#ifndef TAGMA_COORD_H
#define TAGMA_COORD_H

#include <cstdint>

#include "tagma.h"

namespace tagma {

int64_t coord_offset(const tagma_coord_layout& layout, int64_t layer, int64_t block, int64_t token);

}  // namespace tagma

#endif  // TAGMA_COORD_H
