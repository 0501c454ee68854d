// Live engines by opaque handle: a mutex-guarded map; handles are never reused.
#ifndef TAGMA_REGISTRY_H
#define TAGMA_REGISTRY_H

#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine.h"
#include "tagma.h"

namespace tagma {

class Registry {
 public:
  struct Entry {
    explicit Entry(std::unique_ptr<Engine> owned) : engine(std::move(owned)) {}
    std::unique_ptr<Engine> engine;
    bool broken = false;  // an internal error may have left the engine inconsistent; refuse further calls
  };

  static Registry& instance();

  tagma_engine_handle add(std::unique_ptr<Engine> engine);
  // Throws TAGMA_E_INVALID_HANDLE for an unknown or destroyed handle. The entry stays valid until remove().
  Entry& get(tagma_engine_handle handle);
  // Throws TAGMA_E_INVALID_HANDLE for an unknown or destroyed handle.
  void remove(tagma_engine_handle handle);

 private:
  std::mutex mutex_;
  std::unordered_map<tagma_engine_handle, std::unique_ptr<Entry>> entries_;
  tagma_engine_handle next_handle_ = 1;
};

}  // namespace tagma

#endif  // TAGMA_REGISTRY_H
