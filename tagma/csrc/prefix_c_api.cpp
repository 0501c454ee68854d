// The prefix index's C ABI (tagma.h, "prefix index" section), through abi.h's status translation.
#pragma GCC visibility push(default)
#include "tagma.h"
#pragma GCC visibility pop

#include "abi.h"
#include "error.h"

using tagma::Engine;
using tagma::require_non_null;
using tagma::run_with_engine;

namespace {

struct LookupArgs {
  uint64_t ns;
  uint64_t request;
  const int32_t* tokens;
  int64_t start;
  int64_t num_tokens;
  int64_t max_blocks;
  int32_t* ids_out;
  int64_t* result;
};

}  // namespace

extern "C" {

tagma_status tagma_prefix_enable(tagma_engine_handle h, int64_t block_size, int32_t eviction_mode) {
  struct Args {
    int64_t block_size;
    int32_t mode;
  } args{block_size, eviction_mode};
  return run_with_engine(
      "tagma_prefix_enable", h,
      [](Engine& engine, void* a) {
        const auto* args_ = static_cast<Args*>(a);
        engine.prefix_enable(args_->block_size, args_->mode);
      },
      &args);
}

tagma_status tagma_prefix_set_eviction_mode(tagma_engine_handle h, int32_t eviction_mode) {
  return run_with_engine(
      "tagma_prefix_set_eviction_mode", h,
      [](Engine& engine, void* a) { engine.prefix_set_eviction_mode(*static_cast<int32_t*>(a)); }, &eviction_mode);
}

tagma_status tagma_prefix_lookup(tagma_engine_handle h, uint64_t ns, const int32_t* tokens, int64_t num_tokens,
                                 int64_t max_blocks, int32_t* ids_out, int64_t* num_hit) {
  LookupArgs args{ns, 0, tokens, 0, num_tokens, max_blocks, ids_out, num_hit};
  return run_with_engine(
      "tagma_prefix_lookup", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<LookupArgs*>(a);
        require_non_null(x->result, "num_hit");
        *x->result = engine.prefix_lookup(x->ns, x->tokens, x->num_tokens, x->max_blocks, x->ids_out);
      },
      &args);
}

tagma_status tagma_prefix_lookup_attach(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t* tokens,
                                        int64_t num_tokens, int64_t max_blocks, int64_t* num_hit) {
  LookupArgs args{ns, request, tokens, 0, num_tokens, max_blocks, nullptr, num_hit};
  return run_with_engine(
      "tagma_prefix_lookup_attach", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<LookupArgs*>(a);
        require_non_null(x->result, "num_hit");
        *x->result = engine.prefix_lookup_attach(x->ns, x->request, x->tokens, x->num_tokens, x->max_blocks);
      },
      &args);
}

tagma_status tagma_prefix_insert(tagma_engine_handle h, uint64_t ns, uint64_t request, const int32_t* tokens,
                                 int64_t tokens_start, int64_t num_tokens, int64_t* num_indexed) {
  LookupArgs args{ns, request, tokens, tokens_start, num_tokens, 0, nullptr, num_indexed};
  return run_with_engine(
      "tagma_prefix_insert", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<LookupArgs*>(a);
        const int64_t indexed = engine.prefix_insert(x->ns, x->request, x->tokens, x->start, x->num_tokens);
        if (x->result != nullptr) *x->result = indexed;
      },
      &args);
}

tagma_status tagma_prefix_clear(tagma_engine_handle h, int64_t* num_dropped) {
  return run_with_engine(
      "tagma_prefix_clear", h,
      [](Engine& engine, void* a) {
        const int64_t dropped = engine.prefix_clear();
        if (a != nullptr) *static_cast<int64_t*>(a) = dropped;
      },
      num_dropped);
}

tagma_status tagma_prefix_stats_get(tagma_engine_handle h, tagma_prefix_stats* out) {
  return run_with_engine(
      "tagma_prefix_stats_get", h,
      [](Engine& engine, void* a) {
        require_non_null(static_cast<tagma_prefix_stats*>(a), "out");
        *static_cast<tagma_prefix_stats*>(a) = engine.prefix_stats();
      },
      out);
}

tagma_status tagma_prefix_side_enable(tagma_engine_handle h, int32_t groups) {
  return run_with_engine(
      "tagma_prefix_side_enable", h,
      [](Engine& engine, void* a) { engine.prefix_side_enable(*static_cast<int32_t*>(a)); }, &groups);
}

tagma_status tagma_prefix_side_insert(tagma_engine_handle h, uint64_t full_request, int32_t group,
                                      uint64_t side_request, int64_t side_first_logical, int64_t start, int64_t end,
                                      const uint8_t* mask, int64_t* num_cached) {
  struct Args {
    uint64_t full;
    int32_t group;
    uint64_t side;
    int64_t first;
    int64_t start;
    int64_t end;
    const uint8_t* mask;
    int64_t* result;
  } args{full_request, group, side_request, side_first_logical, start, end, mask, num_cached};
  return run_with_engine(
      "tagma_prefix_side_insert", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        const int64_t cached = engine.prefix_side_insert(x->full, x->group, x->side, x->first, x->start, x->end, x->mask);
        if (x->result != nullptr) *x->result = cached;
      },
      &args);
}

tagma_status tagma_prefix_side_lookup(tagma_engine_handle h, int32_t group, const int32_t* nodes, int64_t count,
                                      int32_t* out) {
  struct Args {
    int32_t group;
    const int32_t* nodes;
    int64_t count;
    int32_t* out;
  } args{group, nodes, count, out};
  return run_with_engine(
      "tagma_prefix_side_lookup", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        engine.prefix_side_lookup(x->group, x->nodes, x->count, x->out);
      },
      &args);
}

tagma_status tagma_prefix_side_attach(tagma_engine_handle h, uint64_t request, const int32_t* blocks, int64_t count) {
  struct Args {
    uint64_t request;
    const int32_t* blocks;
    int64_t count;
  } args{request, blocks, count};
  return run_with_engine(
      "tagma_prefix_side_attach", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        engine.prefix_side_attach(x->request, x->blocks, x->count);
      },
      &args);
}

tagma_status tagma_prefix_side_stats_get(tagma_engine_handle h, tagma_prefix_side_stats* out) {
  return run_with_engine(
      "tagma_prefix_side_stats_get", h,
      [](Engine& engine, void* a) {
        require_non_null(static_cast<tagma_prefix_side_stats*>(a), "out");
        *static_cast<tagma_prefix_side_stats*>(a) = engine.prefix_side_stats();
      },
      out);
}

tagma_status tagma_prefix_keyed_enable(tagma_engine_handle h, int32_t groups) {
  return run_with_engine(
      "tagma_prefix_keyed_enable", h,
      [](Engine& engine, void* a) { engine.prefix_keyed_enable(*static_cast<int32_t*>(a)); }, &groups);
}

tagma_status tagma_prefix_chain_keys(tagma_engine_handle h, uint64_t ns, const uint64_t* prev, const int32_t* tokens,
                                     int64_t num_blocks, uint64_t* keys) {
  struct Args {
    uint64_t ns;
    const uint64_t* prev;
    const int32_t* tokens;
    int64_t num_blocks;
    uint64_t* keys;
  } args{ns, prev, tokens, num_blocks, keys};
  return run_with_engine(
      "tagma_prefix_chain_keys", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        engine.prefix_chain_keys(x->ns, x->prev, x->tokens, x->num_blocks, x->keys);
      },
      &args);
}

tagma_status tagma_prefix_keyed_insert(tagma_engine_handle h, int32_t group, uint64_t side_request,
                                       int64_t side_first_logical, int64_t start, int64_t end, const uint64_t* keys,
                                       const int32_t* tokens, const uint8_t* mask, int64_t* num_cached) {
  struct Args {
    int32_t group;
    uint64_t side;
    int64_t first;
    int64_t start;
    int64_t end;
    const uint64_t* keys;
    const int32_t* tokens;
    const uint8_t* mask;
    int64_t* result;
  } args{group, side_request, side_first_logical, start, end, keys, tokens, mask, num_cached};
  return run_with_engine(
      "tagma_prefix_keyed_insert", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        const int64_t cached =
            engine.prefix_keyed_insert(x->group, x->side, x->first, x->start, x->end, x->keys, x->tokens, x->mask);
        if (x->result != nullptr) *x->result = cached;
      },
      &args);
}

tagma_status tagma_prefix_keyed_lookup(tagma_engine_handle h, int32_t group, const uint64_t* keys,
                                       const int32_t* tokens, int64_t count, int32_t* out) {
  struct Args {
    int32_t group;
    const uint64_t* keys;
    const int32_t* tokens;
    int64_t count;
    int32_t* out;
  } args{group, keys, tokens, count, out};
  return run_with_engine(
      "tagma_prefix_keyed_lookup", h,
      [](Engine& engine, void* a) {
        const auto* x = static_cast<Args*>(a);
        engine.prefix_keyed_lookup(x->group, x->keys, x->tokens, x->count, x->out);
      },
      &args);
}

}  // extern "C"
