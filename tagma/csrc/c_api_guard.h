// The C ABI's guards: exception-to-status translation, the thread-local last error, engine handle lookup.
// Shared by every translation unit that defines ABI functions (c_api.cpp, prefix_c_api.cpp).
#ifndef TAGMA_C_API_GUARD_H
#define TAGMA_C_API_GUARD_H

#include <cstdio>
#include <exception>
#include <new>

#include "engine.h"
#include "error.h"
#include "registry.h"
#include "tagma.h"

namespace tagma {

inline thread_local char last_error[1024] = "";

inline void set_last_error(const char* function, const char* message) noexcept {
  std::snprintf(last_error, sizeof(last_error), "%s: %s", function, message);
}

// Runs body; every exception becomes a status, with a message naming `function`.
template <class Body>
inline tagma_status guarded(const char* function, Body&& body) noexcept {
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
inline tagma_status with_engine(const char* function, tagma_engine_handle handle, Body&& body) noexcept {
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

}  // namespace tagma

#endif  // TAGMA_C_API_GUARD_H
