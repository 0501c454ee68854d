// Slot mapping (token position -> KV cache slot) over caller buffers; pure functions.
// Arguments are those of tagma_slot_mapping_ranges / tagma_slot_mapping_paged in tagma.h.
#ifndef TAGMA_SLOT_MAPPING_H
#define TAGMA_SLOT_MAPPING_H

#include <cstdint>

#include "tagma.h"

namespace tagma {

void slot_mapping_ranges(const int32_t* ranges, const int32_t* req_range_offsets, int64_t num_reqs,
                         const int32_t* query_start_loc, const int64_t* positions, int64_t block_size, int64_t* out,
                         int64_t out_len);

void slot_mapping_paged(const int32_t* block_table, int64_t max_blocks_per_req, const int32_t* num_blocks_per_req,
                        int64_t num_reqs, const int32_t* query_start_loc, const int64_t* positions,
                        int64_t block_size, int64_t* out, int64_t out_len);

// tagma_slot_mapping_step (tagma.h): from each request's first position, validation fused into the pass.
void slot_mapping_step(const tagma_slot_mapping_batch* batch);

}  // namespace tagma

#endif  // TAGMA_SLOT_MAPPING_H
