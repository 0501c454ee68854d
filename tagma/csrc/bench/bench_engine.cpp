// tagma_bench: the engine's host-side operations timed natively, through the C ABI (tagma.h) only.
//
//   tagma_bench [--contexts 1024,16384,131072] [--block-size 16] [--repeats 15] [--min-batch-us 300]
//               [--max-batch 4096] [--max-batch-blocks 1048576] [--decode-batches 64,256] [--seed 1]
//
// Prints one JSON document on stdout: for every operation and context length, the cost of one operation
// (ns) in each repeat. A repeat times a batch of `batch` operations back to back and divides; the batch size
// is calibrated once (doubling) so that a batch takes at least --min-batch-us, bounded by --max-batch and,
// for operations whose setup holds blocks, by --max-batch-blocks. Setup that an operation consumes (a request
// to evict, a request whose tail is blocked) is done before the clock starts. One untimed warm-up repeat
// precedes the timed ones.
//
// Operations (n = context / block_size blocks):
//   coord_offset          tagma_coord_offset of (layer, block, token), block cycling through [0, n)
//   alloc_release         request_create + request_append(n) (ids returned) + request_release
//   grow_in_place         request_append(1) to a request of n blocks with free blocks right after it
//   grow_in_place_batch   the same through tagma_append_runs_batch (one entry of 1 block; the range
//                         manager's crossing): the native side of the binding's fixed cost per crossing
//   append_new_range      request_append(1) to a request of n blocks whose tail is taken by a neighbour
//                         (first fit): the block opens a new range
//   prefix_share_release  request_create + request_attach(n ids in use by a live request) + request_release
//   prefix_hit_release    the same on n cache-only blocks (a prefix-cache hit after the owner finished)
//   evict_range           cache_evict(n) of one released, cache-marked request's n blocks (LRU head)
//   slot_mapping_*        per call over a prefill of `context` positions (one request, one range or one
//                         range per block) and over decode batches (R requests x 1 token at position
//                         context - 1): step (tagma_slot_mapping_step, the worker's call), ranges
//                         (tagma_slot_mapping_ranges), paged (tagma_slot_mapping_paged over a dense table)
//                         and memcpy of the same output bytes (the floor).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tagma.h"

namespace {

struct Options {
  std::vector<int64_t> contexts{1024, 16384, 131072};
  std::vector<int64_t> decode_batches{64, 256};
  int64_t block_size = 16;
  int repeats = 15;
  int64_t min_batch_ns = 300000;
  int64_t max_batch = 4096;
  int64_t max_batch_blocks = int64_t{1} << 20;
  uint32_t seed = 1;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "tagma_bench: %s\n", message.c_str());
  std::exit(2);
}

void check(tagma_status status, const char* what) {
  if (status != TAGMA_OK) die(std::string(what) + " failed: " + tagma_last_error());
}

std::vector<int64_t> parse_list(const char* text) {
  std::vector<int64_t> values;
  std::string item;
  for (const char* p = text;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) values.push_back(std::strtoll(item.c_str(), nullptr, 10));
      item.clear();
      if (*p == '\0') break;
    } else {
      item.push_back(*p);
    }
  }
  return values;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) die("missing value after " + arg);
    const char* value = argv[++i];
    if (arg == "--contexts") {
      options.contexts = parse_list(value);
    } else if (arg == "--decode-batches") {
      options.decode_batches = parse_list(value);
    } else if (arg == "--block-size") {
      options.block_size = std::strtoll(value, nullptr, 10);
    } else if (arg == "--repeats") {
      options.repeats = static_cast<int>(std::strtol(value, nullptr, 10));
    } else if (arg == "--min-batch-us") {
      options.min_batch_ns = 1000 * std::strtoll(value, nullptr, 10);
    } else if (arg == "--max-batch") {
      options.max_batch = std::strtoll(value, nullptr, 10);
    } else if (arg == "--max-batch-blocks") {
      options.max_batch_blocks = std::strtoll(value, nullptr, 10);
    } else if (arg == "--seed") {
      options.seed = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
    } else {
      die("unknown option " + arg);
    }
  }
  if (options.block_size <= 0 || options.repeats <= 0 || options.max_batch <= 0) die("bad option values");
  for (const int64_t c : options.contexts) {
    if (c < options.block_size || c % options.block_size != 0) die("contexts must be multiples of block_size");
  }
  return options;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Keeps results alive so the compiler cannot drop the calls that produce them.
volatile int64_t g_sink = 0;

// One benchmark: setup(batch) prepares state for `batch` operations (untimed), run(batch) performs them
// (timed), teardown() releases everything (untimed).
struct Case {
  std::function<void(int64_t)> setup;
  std::function<void(int64_t)> run;
  std::function<void()> teardown;
  int64_t blocks_per_op = 0;  // blocks the setup holds per operation (bounds the batch)
};

struct Result {
  std::string op;
  int64_t context = 0;
  int64_t blocks = 0;
  int64_t batch = 0;
  int64_t positions = 0;  // slot mapping: positions per call
  int64_t requests = 0;   // slot mapping: requests per call
  std::string layout;     // slot mapping: "one_range", "range_per_block", "decode"
  std::vector<double> ns_per_op;
};

int64_t time_batch(Case& c, int64_t batch) {
  c.setup(batch);
  const int64_t start = now_ns();
  c.run(batch);
  const int64_t elapsed = now_ns() - start;
  c.teardown();
  return elapsed;
}

Result measure(const Options& options, const std::string& op, int64_t context, Case c) {
  int64_t cap = options.max_batch;
  if (c.blocks_per_op > 0) cap = std::max<int64_t>(1, std::min(cap, options.max_batch_blocks / c.blocks_per_op));
  int64_t batch = 1;
  while (batch < cap && time_batch(c, batch) < options.min_batch_ns) batch = std::min(cap, 2 * batch);
  time_batch(c, batch);  // warm-up
  Result result;
  result.op = op;
  result.context = context;
  result.blocks = context / options.block_size;
  result.batch = batch;
  for (int r = 0; r < options.repeats; ++r) {
    result.ns_per_op.push_back(static_cast<double>(time_batch(c, batch)) / static_cast<double>(batch));
  }
  return result;
}

// ---------------------------------------------------------------------------------------- engine helpers

class Engine {
 public:
  Engine(int64_t num_blocks, int32_t policy) { check(tagma_engine_create(num_blocks, 1, policy, &handle_), "create"); }
  ~Engine() { tagma_engine_destroy(handle_); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  tagma_engine_handle handle() const { return handle_; }

  uint64_t request() {
    uint64_t id = 0;
    check(tagma_request_create(handle_, &id), "request_create");
    return id;
  }
  void append(uint64_t request, int64_t count, int32_t* out) {
    check(tagma_request_append(handle_, request, count, out, nullptr, nullptr), "request_append");
  }
  void release(uint64_t request) { check(tagma_request_release(handle_, request), "request_release"); }
  tagma_stats stats() {
    tagma_stats s{};
    check(tagma_engine_stats(handle_, &s), "stats");
    return s;
  }

 private:
  tagma_engine_handle handle_ = 0;
};

// ------------------------------------------------------------------------------------------ engine cases

std::vector<Result> engine_ops(const Options& options, int64_t context) {
  const int64_t n = context / options.block_size;
  std::vector<Result> results;
  std::vector<int32_t> ids(static_cast<size_t>(n) + 1);

  {  // coord_offset
    const tagma_coord_layout layout{32, n + 1, options.block_size, 4096};
    Case c;
    c.setup = [](int64_t) {};
    c.teardown = [] {};
    c.run = [&](int64_t batch) {
      int64_t sum = 0;
      int64_t offset = 0;
      for (int64_t i = 0; i < batch; ++i) {
        check(tagma_coord_offset(&layout, i & 31, i % n, i % layout.block_size, &offset), "coord_offset");
        sum += offset;
      }
      g_sink = g_sink + sum;
    };
    results.push_back(measure(options, "coord_offset", context, c));
  }

  {  // alloc_release
    Engine engine(2 * n + 64, TAGMA_POLICY_HEADROOM);
    Case c;
    c.setup = [](int64_t) {};
    c.teardown = [] {};
    c.run = [&](int64_t batch) {
      for (int64_t i = 0; i < batch; ++i) {
        const uint64_t r = engine.request();
        engine.append(r, n, ids.data());
        engine.release(r);
      }
      g_sink = g_sink + ids[0];
    };
    results.push_back(measure(options, "alloc_release", context, c));
  }

  {  // grow_in_place
    std::unique_ptr<Engine> engine;
    uint64_t request = 0;
    int64_t in_place_before = 0;
    int64_t batch_size = 0;
    Case c;
    c.blocks_per_op = 1;
    c.setup = [&](int64_t batch) {
      engine = std::make_unique<Engine>(n + batch + 64, TAGMA_POLICY_HEADROOM);
      request = engine->request();
      engine->append(request, n, ids.data());
      in_place_before = engine->stats().in_place_growths;
      batch_size = batch;
    };
    c.run = [&](int64_t batch) {
      int32_t block = 0;
      for (int64_t i = 0; i < batch; ++i) engine->append(request, 1, &block);
      g_sink = g_sink + block;
    };
    c.teardown = [&] {
      const tagma_stats s = engine->stats();
      if (s.in_place_growths - in_place_before != batch_size || s.max_request_ranges != 1) {
        die("grow_in_place: an append did not grow in place");
      }
      engine.reset();
    };
    results.push_back(measure(options, "grow_in_place", context, c));
  }

  {  // grow_in_place_batch
    std::unique_ptr<Engine> engine;
    uint64_t request = 0;
    int64_t in_place_before = 0;
    int64_t batch_size = 0;
    int64_t count = 1;
    int32_t runs[2] = {0, 0};
    int64_t offsets[2] = {0, 0};
    tagma_append_batch step{};
    Case c;
    c.blocks_per_op = 1;
    c.setup = [&](int64_t batch) {
      engine = std::make_unique<Engine>(n + batch + 64, TAGMA_POLICY_HEADROOM);
      request = engine->request();
      engine->append(request, n, ids.data());
      in_place_before = engine->stats().in_place_growths;
      batch_size = batch;
      step = tagma_append_batch{engine->handle(), &request, &count, nullptr, 1, runs, 1, offsets};
    };
    c.run = [&](int64_t batch) {
      for (int64_t i = 0; i < batch; ++i) check(tagma_append_runs_batch(&step), "append_runs_batch");
      g_sink = g_sink + runs[0];
    };
    c.teardown = [&] {
      const tagma_stats s = engine->stats();
      if (s.in_place_growths - in_place_before != batch_size || s.max_request_ranges != 1) {
        die("grow_in_place_batch: an append did not grow in place");
      }
      engine.reset();
    };
    results.push_back(measure(options, "grow_in_place_batch", context, c));
  }

  {  // append_new_range
    std::unique_ptr<Engine> engine;
    std::vector<uint64_t> owners;
    int64_t new_before = 0;
    int64_t batch_size = 0;
    Case c;
    c.blocks_per_op = n + 2;
    c.setup = [&](int64_t batch) {
      engine = std::make_unique<Engine>(batch * (n + 2) + 64, TAGMA_POLICY_FIRST_FIT);
      owners.clear();
      for (int64_t i = 0; i < batch; ++i) {
        const uint64_t owner = engine->request();
        engine->append(owner, n, ids.data());
        const uint64_t neighbour = engine->request();
        int32_t block = 0;
        engine->append(neighbour, 1, &block);  // takes the block right after the owner's range
        owners.push_back(owner);
      }
      new_before = engine->stats().new_ranges;
      batch_size = batch;
    };
    c.run = [&](int64_t batch) {
      int32_t block = 0;
      for (int64_t i = 0; i < batch; ++i) engine->append(owners[static_cast<size_t>(i)], 1, &block);
      g_sink = g_sink + block;
    };
    c.teardown = [&] {
      if (engine->stats().new_ranges - new_before != batch_size) die("append_new_range: an append grew in place");
      engine.reset();
    };
    results.push_back(measure(options, "append_new_range", context, c));
  }

  for (const bool cache_only : {false, true}) {  // prefix_share_release / prefix_hit_release
    Engine engine(n + 64, TAGMA_POLICY_HEADROOM);
    const uint64_t owner = engine.request();
    std::vector<int32_t> prefix(static_cast<size_t>(n));
    engine.append(owner, n, prefix.data());
    if (cache_only) {
      check(tagma_cache_mark(engine.handle(), prefix.data(), n), "cache_mark");
      engine.release(owner);
    }
    Case c;
    c.setup = [](int64_t) {};
    c.teardown = [] {};
    c.run = [&](int64_t batch) {
      for (int64_t i = 0; i < batch; ++i) {
        const uint64_t r = engine.request();
        check(tagma_request_attach(engine.handle(), r, prefix.data(), n), "request_attach");
        engine.release(r);
      }
    };
    results.push_back(measure(options, cache_only ? "prefix_hit_release" : "prefix_share_release", context, c));
  }

  {  // evict_range
    std::unique_ptr<Engine> engine;
    std::vector<int32_t> evicted(static_cast<size_t>(n));
    Case c;
    c.blocks_per_op = n;
    c.setup = [&](int64_t batch) {
      engine = std::make_unique<Engine>(batch * n + 64, TAGMA_POLICY_HEADROOM);
      for (int64_t i = 0; i < batch; ++i) {
        const uint64_t r = engine->request();
        engine->append(r, n, ids.data());
        check(tagma_cache_mark(engine->handle(), ids.data(), n), "cache_mark");
        engine->release(r);
      }
    };
    c.run = [&](int64_t batch) {
      int64_t count = 0;
      for (int64_t i = 0; i < batch; ++i) {
        check(tagma_cache_evict(engine->handle(), n, evicted.data(), &count), "cache_evict");
        if (count != n) die("evict_range: evicted fewer blocks than asked");
      }
    };
    c.teardown = [&] { engine.reset(); };
    results.push_back(measure(options, "evict_range", context, c));
  }
  return results;
}

// ------------------------------------------------------------------------------------ slot mapping cases

// One batch of the write path: ranges, the dense table of the same block maps, the tokens.
struct Batch {
  std::vector<int32_t> ranges;   // (start, count, first_logical) triples
  std::vector<int32_t> offsets;  // num_reqs + 1
  std::vector<int32_t> table;    // [num_reqs, width]
  std::vector<int32_t> num_blocks;
  int64_t width = 0;
  std::vector<int32_t> qsl;
  std::vector<int64_t> positions;
  std::vector<int64_t> out;
  std::vector<int64_t> source;  // memcpy source of the same size as out
};

void add_request(Batch& b, const std::vector<int32_t>& block_ids, int64_t first_position, int64_t num_positions) {
  const int64_t row = static_cast<int64_t>(b.num_blocks.size());
  b.num_blocks.push_back(static_cast<int32_t>(block_ids.size()));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    b.table[static_cast<size_t>(row * b.width) + i] = block_ids[i];
    const size_t r = b.ranges.size();
    if (i > 0 && b.ranges[r - 3] + b.ranges[r - 2] == block_ids[i]) {
      ++b.ranges[r - 2];
    } else {
      b.ranges.insert(b.ranges.end(), {block_ids[i], 1, static_cast<int32_t>(i)});
    }
  }
  b.offsets.push_back(static_cast<int32_t>(b.ranges.size() / 3));
  for (int64_t p = 0; p < num_positions; ++p) b.positions.push_back(first_position + p);
  b.qsl.push_back(static_cast<int32_t>(b.positions.size()));
}

void finish(Batch& b) {
  b.out.assign(b.positions.size(), 0);
  b.source.assign(b.positions.size(), 7);
}

std::vector<Result> slot_mapping_cases(const Options& options, const std::string& layout, Batch& b,
                                       int64_t context) {
  const int64_t num_reqs = static_cast<int64_t>(b.num_blocks.size());
  const int64_t tokens = static_cast<int64_t>(b.positions.size());
  const int64_t bs = options.block_size;
  std::vector<Result> results;
  auto run_ranges = [&](int64_t batch) {
    for (int64_t i = 0; i < batch; ++i) {
      check(tagma_slot_mapping_ranges(b.ranges.data(), b.offsets.data(), num_reqs, b.qsl.data(), b.positions.data(),
                                      bs, b.out.data(), tokens),
            "slot_mapping_ranges");
    }
    g_sink = g_sink + b.out[0];
  };
  auto run_paged = [&](int64_t batch) {
    for (int64_t i = 0; i < batch; ++i) {
      check(tagma_slot_mapping_paged(b.table.data(), b.width, b.num_blocks.data(), num_reqs, b.qsl.data(),
                                     b.positions.data(), bs, b.out.data(), tokens),
            "slot_mapping_paged");
    }
    g_sink = g_sink + b.out[0];
  };
  tagma_slot_mapping_batch step{b.ranges.data(), static_cast<int64_t>(b.ranges.size() / 3), b.offsets.data(),
                                num_reqs, b.qsl.data(), b.positions.data(), tokens, b.out.data(), tokens,
                                num_reqs, bs};
  auto run_step = [&](int64_t batch) {
    for (int64_t i = 0; i < batch; ++i) check(tagma_slot_mapping_step(&step), "slot_mapping_step");
    g_sink = g_sink + b.out[0];
  };
  auto run_memcpy = [&](int64_t batch) {
    for (int64_t i = 0; i < batch; ++i) {
      std::memcpy(b.out.data(), b.source.data(), static_cast<size_t>(tokens) * sizeof(int64_t));
      b.source[0] = b.out[static_cast<size_t>(tokens) - 1] + i;  // a dependency between copies
    }
    g_sink = g_sink + b.out[0];
  };
  // Both variants must agree before anything is timed.
  run_ranges(1);
  const std::vector<int64_t> expected = b.out;
  run_paged(1);
  if (b.out != expected) die("slot mapping: ranges and paged differ (" + layout + ")");
  run_step(1);
  if (b.out != expected) die("slot mapping: step and paged differ (" + layout + ")");
  const std::pair<const char*, std::function<void(int64_t)>> variants[] = {{"slot_mapping_step", run_step},
                                                                             {"slot_mapping_ranges", run_ranges},
                                                                             {"slot_mapping_paged", run_paged},
                                                                             {"memcpy", run_memcpy}};
  for (const auto& [name, run] : variants) {
    Case c;
    c.setup = [](int64_t) {};
    c.teardown = [] {};
    c.run = run;
    Result r = measure(options, name, context, c);
    r.layout = layout;
    r.positions = tokens;
    r.requests = num_reqs;
    results.push_back(r);
  }
  return results;
}

std::vector<Result> slot_mapping_ops(const Options& options, int64_t context, std::mt19937& rng) {
  const int64_t n = context / options.block_size;
  std::vector<Result> results;
  for (const char* layout : {"one_range", "range_per_block"}) {
    Batch b;
    b.width = n;
    b.table.assign(static_cast<size_t>(n), 0);
    b.offsets.push_back(0);
    b.qsl.push_back(0);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      // one range: 1..n; one range per block: every other block (2, 4, 6, ...)
      ids[static_cast<size_t>(i)] = static_cast<int32_t>(std::string(layout) == "one_range" ? 1 + i : 2 + 2 * i);
    }
    add_request(b, ids, 0, context);
    finish(b);
    for (Result& r : slot_mapping_cases(options, layout, b, context)) results.push_back(r);
  }
  for (const int64_t reqs : options.decode_batches) {
    // R requests of n blocks, each in a few ranges (the shape a headroom placement leaves under decode).
    Batch b;
    b.width = n;
    b.table.assign(static_cast<size_t>(reqs * n), 0);
    b.offsets.push_back(0);
    b.qsl.push_back(0);
    int32_t next = 1;
    std::uniform_int_distribution<int64_t> pieces(1, 4);
    for (int64_t r = 0; r < reqs; ++r) {
      std::vector<int32_t> ids;
      const int64_t k = std::min<int64_t>(pieces(rng), n);
      for (int64_t piece = 0; piece < k; ++piece) {
        const int64_t len = piece + 1 == k ? n - static_cast<int64_t>(ids.size()) : n / k;
        for (int64_t i = 0; i < len; ++i) ids.push_back(next++);
        next += 3;  // a gap: the next piece is a new range
      }
      add_request(b, ids, context - 1, 1);
    }
    finish(b);
    for (Result& res : slot_mapping_cases(options, "decode", b, context)) results.push_back(res);
  }
  return results;
}

void print_json(const Options& options, const std::vector<Result>& results) {
  std::printf("{\n  \"tool\": \"tagma_bench\",\n  \"engine_version\": \"%s\",\n", tagma_version());
  std::printf("  \"block_size\": %lld,\n  \"repeats\": %d,\n  \"min_batch_ns\": %lld,\n",
              static_cast<long long>(options.block_size), options.repeats,
              static_cast<long long>(options.min_batch_ns));
  std::printf("  \"results\": [\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("    {\"op\": \"%s\", \"context_tokens\": %lld, \"blocks\": %lld, \"batch\": %lld", r.op.c_str(),
                static_cast<long long>(r.context), static_cast<long long>(r.blocks), static_cast<long long>(r.batch));
    if (!r.layout.empty()) {
      std::printf(", \"layout\": \"%s\", \"positions\": %lld, \"requests\": %lld", r.layout.c_str(),
                  static_cast<long long>(r.positions), static_cast<long long>(r.requests));
    }
    std::printf(", \"ns_per_op\": [");
    for (size_t k = 0; k < r.ns_per_op.size(); ++k) std::printf("%s%.3f", k ? ", " : "", r.ns_per_op[k]);
    std::printf("]}%s\n", i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::mt19937 rng(options.seed);
  std::vector<Result> results;
  for (const int64_t context : options.contexts) {
    for (Result& r : engine_ops(options, context)) results.push_back(r);
    for (Result& r : slot_mapping_ops(options, context, rng)) results.push_back(r);
  }
  print_json(options, results);
  return 0;
}
