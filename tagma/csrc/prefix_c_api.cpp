// The prefix index's C ABI (tagma.h, "prefix index" section).
#pragma GCC visibility push(default)
#include "tagma.h"
#pragma GCC visibility pop

#include "c_api_guard.h"

using tagma::Engine;
using tagma::require_non_null;
using tagma::with_engine;

extern "C" {

tagma_status tagma_prefix_enable(tagma_engine_handle h, int64_t block_size, int32_t eviction_mode) {
  return with_engine("tagma_prefix_enable", h,
                     [&](Engine& engine) { engine.prefix_enable(block_size, eviction_mode); });
}

tagma_status tagma_prefix_set_eviction_mode(tagma_engine_handle h, int32_t eviction_mode) {
  return with_engine("tagma_prefix_set_eviction_mode", h,
                     [&](Engine& engine) { engine.prefix_set_eviction_mode(eviction_mode); });
}

tagma_status tagma_prefix_lookup(tagma_engine_handle h, uint64_t ns, const int32_t* tokens, int64_t num_tokens,
                                 int64_t max_blocks, int32_t* ids_out, int64_t* num_hit) {
  return with_engine("tagma_prefix_lookup", h, [&](Engine& engine) {
    require_non_null(num_hit, "num_hit");
    *num_hit = engine.prefix_lookup(ns, tokens, num_tokens, max_blocks, ids_out);
  });
}

tagma_status tagma_prefix_lookup_attach(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t* tokens,
                                        int64_t num_tokens, int64_t max_blocks, int64_t* num_hit) {
  return with_engine("tagma_prefix_lookup_attach", h, [&](Engine& engine) {
    require_non_null(num_hit, "num_hit");
    *num_hit = engine.prefix_lookup_attach(ns, request, tokens, num_tokens, max_blocks);
  });
}

tagma_status tagma_prefix_insert(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t* tokens,
                                 int64_t tokens_start, int64_t num_tokens, int64_t* num_indexed) {
  return with_engine("tagma_prefix_insert", h, [&](Engine& engine) {
    const int64_t indexed = engine.prefix_insert(ns, request, tokens, tokens_start, num_tokens);
    if (num_indexed != nullptr) *num_indexed = indexed;
  });
}

tagma_status tagma_prefix_clear(tagma_engine_handle h, int64_t* num_dropped) {
  return with_engine("tagma_prefix_clear", h, [&](Engine& engine) {
    const int64_t dropped = engine.prefix_clear();
    if (num_dropped != nullptr) *num_dropped = dropped;
  });
}

tagma_status tagma_prefix_stats_get(tagma_engine_handle h, tagma_prefix_stats* out) {
  return with_engine("tagma_prefix_stats_get", h, [&](Engine& engine) {
    require_non_null(out, "out");
    *out = engine.prefix_stats();
  });
}

}  // extern "C"
