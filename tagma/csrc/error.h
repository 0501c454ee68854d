// Errors raised inside the engine and reported through the C ABI.
#ifndef TAGMA_ERROR_H
#define TAGMA_ERROR_H

#include <sstream>
#include <stdexcept>
#include <string>

#include "tagma.h"

namespace tagma {

// A failure with its C ABI status. The message does not name the ABI function; c_api.cpp prefixes it.
class Error : public std::runtime_error {
 public:
  Error(tagma_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  tagma_status status() const { return status_; }

 private:
  tagma_status status_;
};

// Throws Error(status, concatenation of parts).
template <class... Parts>
[[noreturn]] void fail(tagma_status status, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(status, message.str());
}

template <class T>
void require_non_null(const T* pointer, const char* name) {
  if (pointer == nullptr) fail(TAGMA_E_INVALID_ARG, name, " must not be null");
}

inline void require_positive(int64_t value, const char* name) {
  if (value <= 0) fail(TAGMA_E_INVALID_ARG, name, " ", value, " must be > 0");
}

// Validates an (out, capacity, total_out) triple of the "copy up to capacity, report the total" kind.
template <class T>
void require_output_buffer(const T* out, int64_t capacity, const int64_t* total_out, const char* total_name) {
  if (capacity < 0) fail(TAGMA_E_INVALID_ARG, "capacity ", capacity, " must be >= 0");
  if (capacity > 0) require_non_null(out, "out");
  require_non_null(total_out, total_name);
}

}  // namespace tagma

#endif  // TAGMA_ERROR_H
