// The C ABI: handle lookup, exception-to-status translation, thread-local error messages.
//
// tagma.h is included first under default visibility so that exactly the ABI functions are exported while
// everything else is built with -fvisibility=hidden.
#pragma GCC visibility push(default)
#include "tagma.h"
#pragma GCC visibility pop

#include <cstdio>
#include <exception>
#include <memory>
#include <new>

#include "coord.h"
#include "engine.h"
#include "abi.h"
#include "error.h"
#include "registry.h"
#include "slot_mapping.h"

namespace tagma {
namespace {

thread_local char last_error[1024] = "";

void set_last_error(const char* function, const char* message) noexcept {
  std::snprintf(last_error, sizeof(last_error), "%s: %s", function, message);
}

// Runs body; every exception becomes a status, with a message naming `function`.
template <class Body>
tagma_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return TAGMA_OK;
  } catch (const Error& error) {
    set_last_error(function, error.what());
    return error.status();
  } catch (const std::bad_alloc&) {
    set_last_error(function, "out of memory");
    return TAGMA_E_INTERNAL;
  } catch (const std::exception& error) {
    set_last_error(function, error.what());
    return TAGMA_E_INTERNAL;
  } catch (...) {
    set_last_error(function, "unknown internal error");
    return TAGMA_E_INTERNAL;
  }
}

// Runs body(engine) for a live handle. Validation errors leave the engine unchanged; an internal error
// (allocation failure, broken invariant) may not, so the engine is then marked broken and refuses every
// later call with TAGMA_E_INTERNAL rather than report numbers from an inconsistent state.
template <class Body>
tagma_status with_engine(const char* function, tagma_engine_handle handle, Body&& body) noexcept {
  return guarded(function, [&] {
    Registry::Entry& entry = Registry::instance().get(handle);
    if (entry.broken) fail(TAGMA_E_INTERNAL, "engine ", handle, " is broken by an earlier internal error");
    try {
      body(*entry.engine);
    } catch (const Error& error) {
      if (error.status() == TAGMA_E_INTERNAL) entry.broken = true;
      throw;
    } catch (...) {
      entry.broken = true;
      throw;
    }
  });
}

}  // namespace

// with_engine for ABI functions defined in other files (abi.h).
tagma_status run_with_engine(const char* function, tagma_engine_handle handle, void (*body)(Engine&, void*),
                             void* context) noexcept {
  return with_engine(function, handle, [&](Engine& engine) { body(engine, context); });
}

tagma_status run_guarded(const char* function, void (*body)(void*), void* context) noexcept {
  return guarded(function, [&] { body(context); });
}

}  // namespace tagma

using tagma::Engine;
using tagma::guarded;
using tagma::require_non_null;
using tagma::with_engine;

extern "C" {

const char* tagma_last_error(void) { return tagma::last_error; }

const char* tagma_version(void) { return TAGMA_VERSION_STRING; }

tagma_status tagma_engine_create(int64_t num_blocks, int64_t align, int32_t policy, tagma_engine_handle* out) {
  return guarded("tagma_engine_create", [&] {
    require_non_null(out, "out");
    *out = tagma::Registry::instance().add(std::make_unique<Engine>(num_blocks, align, policy));
  });
}

tagma_status tagma_engine_destroy(tagma_engine_handle h) {
  return guarded("tagma_engine_destroy", [&] { tagma::Registry::instance().remove(h); });
}

tagma_status tagma_engine_set_admission(tagma_engine_handle h, int32_t percent, int32_t pieces) {
  return with_engine("tagma_engine_set_admission", h,
                     [&](Engine& engine) { engine.set_admission(percent, pieces); });
}

tagma_status tagma_engine_set_policy(tagma_engine_handle h, int32_t policy) {
  return with_engine("tagma_engine_set_policy", h, [&](Engine& engine) { engine.set_policy(policy); });
}

tagma_status tagma_engine_stats(tagma_engine_handle h, tagma_stats* out) {
  return with_engine("tagma_engine_stats", h, [&](Engine& engine) {
    require_non_null(out, "out");
    *out = engine.stats();
  });
}

tagma_status tagma_request_create(tagma_engine_handle h, uint64_t* out_request) {
  return with_engine("tagma_request_create", h, [&](Engine& engine) {
    require_non_null(out_request, "out_request");
    *out_request = engine.create_request();
  });
}

tagma_status tagma_request_release(tagma_engine_handle h, uint64_t request) {
  return with_engine("tagma_request_release", h, [&](Engine& engine) { engine.release_request(request); });
}

tagma_status tagma_request_free_front(tagma_engine_handle h, uint64_t request, int64_t count) {
  return with_engine("tagma_request_free_front", h, [&](Engine& engine) { engine.free_front(request, count); });
}

tagma_status tagma_request_append(tagma_engine_handle h, uint64_t request, int64_t count, int32_t* new_blocks_out,
                                  int32_t* evicted_out, int64_t* num_evicted) {
  return with_engine("tagma_request_append", h, [&](Engine& engine) {
    engine.append(request, count, new_blocks_out, evicted_out, num_evicted);
  });
}

tagma_status tagma_request_attach(tagma_engine_handle h, uint64_t request, const int32_t* block_ids, int64_t count) {
  return with_engine("tagma_request_attach", h, [&](Engine& engine) { engine.attach(request, block_ids, count); });
}

tagma_status tagma_request_num_blocks(tagma_engine_handle h, uint64_t request, int64_t* out) {
  return with_engine("tagma_request_num_blocks", h, [&](Engine& engine) {
    require_non_null(out, "out");
    *out = engine.request_num_blocks(request);
  });
}

tagma_status tagma_request_num_ranges(tagma_engine_handle h, uint64_t request, int64_t* out) {
  return with_engine("tagma_request_num_ranges", h, [&](Engine& engine) {
    require_non_null(out, "out");
    *out = engine.request_num_ranges(request);
  });
}

tagma_status tagma_request_ranges(tagma_engine_handle h, uint64_t request, int32_t* out, int64_t capacity,
                                  int64_t* num_ranges) {
  return with_engine("tagma_request_ranges", h,
                     [&](Engine& engine) { engine.request_ranges(request, out, capacity, num_ranges); });
}

tagma_status tagma_request_block(tagma_engine_handle h, uint64_t request, int64_t logical, int32_t* out) {
  return with_engine("tagma_request_block", h, [&](Engine& engine) {
    require_non_null(out, "out");
    *out = engine.request_block(request, logical);
  });
}

tagma_status tagma_request_blocks(tagma_engine_handle h, uint64_t request, int64_t first, int64_t count,
                                  int32_t* out) {
  return with_engine("tagma_request_blocks", h,
                     [&](Engine& engine) { engine.request_blocks(request, first, count, out); });
}

tagma_status tagma_cache_mark(tagma_engine_handle h, const int32_t* block_ids, int64_t count) {
  return with_engine("tagma_cache_mark", h, [&](Engine& engine) { engine.cache_mark(block_ids, count); });
}

tagma_status tagma_cache_unmark(tagma_engine_handle h, const int32_t* block_ids, int64_t count) {
  return with_engine("tagma_cache_unmark", h, [&](Engine& engine) { engine.cache_unmark(block_ids, count); });
}

tagma_status tagma_cache_evict(tagma_engine_handle h, int64_t max_blocks, int32_t* out, int64_t* num_evicted) {
  return with_engine("tagma_cache_evict", h, [&](Engine& engine) {
    require_non_null(num_evicted, "num_evicted");
    *num_evicted = engine.cache_evict(max_blocks, out);
  });
}

tagma_status tagma_cache_clear(tagma_engine_handle h, int64_t* num_dropped) {
  return with_engine("tagma_cache_clear", h, [&](Engine& engine) {
    const int64_t dropped = engine.cache_clear();
    if (num_dropped != nullptr) *num_dropped = dropped;
  });
}

tagma_status tagma_block_state(tagma_engine_handle h, int32_t* req_refs, int32_t* cache_refs, int64_t capacity) {
  return with_engine("tagma_block_state", h,
                     [&](Engine& engine) { engine.block_state(req_refs, cache_refs, capacity); });
}

tagma_status tagma_free_ranges(tagma_engine_handle h, int32_t* out, int64_t capacity, int64_t* num_ranges) {
  return with_engine("tagma_free_ranges", h, [&](Engine& engine) { engine.free_ranges(out, capacity, num_ranges); });
}

tagma_status tagma_lru_order(tagma_engine_handle h, int32_t* out, int64_t capacity, int64_t* num_blocks) {
  return with_engine("tagma_lru_order", h, [&](Engine& engine) { engine.lru_order(out, capacity, num_blocks); });
}

tagma_status tagma_ranges_histogram(tagma_engine_handle h, int64_t* out, int64_t capacity) {
  return with_engine("tagma_ranges_histogram", h, [&](Engine& engine) { engine.ranges_histogram(out, capacity); });
}

tagma_status tagma_slot_mapping_ranges(const int32_t* ranges, const int32_t* req_range_offsets, int64_t num_reqs,
                                       const int32_t* query_start_loc, const int64_t* positions, int64_t block_size,
                                       int64_t* out, int64_t out_len) {
  return guarded("tagma_slot_mapping_ranges", [&] {
    tagma::slot_mapping_ranges(ranges, req_range_offsets, num_reqs, query_start_loc, positions, block_size, out,
                               out_len);
  });
}

tagma_status tagma_slot_mapping_paged(const int32_t* block_table, int64_t max_blocks_per_req,
                                      const int32_t* num_blocks_per_req, int64_t num_reqs,
                                      const int32_t* query_start_loc, const int64_t* positions, int64_t block_size,
                                      int64_t* out, int64_t out_len) {
  return guarded("tagma_slot_mapping_paged", [&] {
    tagma::slot_mapping_paged(block_table, max_blocks_per_req, num_blocks_per_req, num_reqs, query_start_loc,
                              positions, block_size, out, out_len);
  });
}

tagma_status tagma_slot_mapping_step(const tagma_slot_mapping_batch* batch) {
  return guarded("tagma_slot_mapping_step", [&] { tagma::slot_mapping_step(batch); });
}

tagma_status tagma_coord_offset(const tagma_coord_layout* layout, int64_t layer, int64_t block, int64_t token,
                                int64_t* out_offset) {
  return guarded("tagma_coord_offset", [&] {
    require_non_null(layout, "layout");
    require_non_null(out_offset, "out_offset");
    *out_offset = tagma::coord_offset(*layout, layer, block, token);
  });
}

// ---- range manager

tagma_status tagma_request_append_runs(tagma_engine_handle h, uint64_t request, int64_t count, int64_t hint,
                                       int32_t* runs_out, int64_t capacity, int64_t* num_runs) {
  return with_engine("tagma_request_append_runs", h, [&](Engine& engine) {
    require_non_null(num_runs, "num_runs");
    *num_runs = engine.append_runs(request, count, hint, runs_out, capacity);
  });
}

}  // extern "C"
