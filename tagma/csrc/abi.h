// Status translation for ABI functions defined outside c_api.cpp: the same handle lookup, exception-to-status
// translation, last-error message and broken-engine marking as the functions in c_api.cpp.
#ifndef TAGMA_ABI_H
#define TAGMA_ABI_H

#include "engine.h"
#include "tagma.h"

namespace tagma {

// Runs body(engine, context) for a live handle; every exception becomes a status with a message naming
// `function`, and an internal error marks the engine broken.
tagma_status run_with_engine(const char* function, tagma_engine_handle handle, void (*body)(Engine&, void*),
                             void* context) noexcept;
// Runs body(context); every exception becomes a status with a message naming `function`.
tagma_status run_guarded(const char* function, void (*body)(void*), void* context) noexcept;

}  // namespace tagma

#endif  // TAGMA_ABI_H
