#include "registry.h"

#include "error.h"

namespace tagma {

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

tagma_engine_handle Registry::add(std::unique_ptr<Engine> engine) {
  auto entry = std::make_unique<Entry>(std::move(engine));
  const std::lock_guard<std::mutex> lock(mutex_);
  const tagma_engine_handle handle = next_handle_;
  entries_.emplace(handle, std::move(entry));
  ++next_handle_;
  return handle;
}

Registry::Entry& Registry::get(tagma_engine_handle handle) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = entries_.find(handle);
  if (found == entries_.end()) fail(TAGMA_E_INVALID_HANDLE, "engine handle ", handle, " is unknown or destroyed");
  return *found->second;
}

void Registry::remove(tagma_engine_handle handle) {
  std::unique_ptr<Entry> removed;  // destroyed after the lock is released
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = entries_.find(handle);
  if (found == entries_.end()) fail(TAGMA_E_INVALID_HANDLE, "engine handle ", handle, " is unknown or destroyed");
  removed = std::move(found->second);
  entries_.erase(found);
}

}  // namespace tagma
