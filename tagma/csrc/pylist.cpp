// Token ids from Python to int32, read in C through the CPython API (libtagma_pylist.so, loaded with
// ctypes.PyDLL so that the GIL is held and a raised exception propagates). Kept out of libtagma so that
// the engine itself never links Python.
//
// vLLM hands token ids over as Python lists of ints (Request.prompt_token_ids; all_token_ids is a
// ConstantList whose `_x` is the list). Converting 128K of them with array.array('i', lst) costs tens of ns
// per token; this reads the list's items in place.
#include <Python.h>

#include <cstdint>
#include <new>
#include <vector>

#include "tagma.h"  // types only: the engine's functions are called through pointers the binding passes

namespace {

// int32 value of a Python int, or false (an exception set) when it is not an int or does not fit.
inline bool token_value(PyObject* item, int64_t index, int32_t* out) {
  if (!PyLong_Check(item)) {
    PyErr_Format(PyExc_TypeError, "token id at index %lld is a %s, not an int", static_cast<long long>(index),
                 Py_TYPE(item)->tp_name);
    return false;
  }
#if PY_VERSION_HEX >= 0x030C0000
  if (PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(item))) {
    const Py_ssize_t value = PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(item));
    if (value >= INT32_MIN && value <= INT32_MAX) {
      *out = static_cast<int32_t>(value);
      return true;
    }
  }
#else
  // CPython <= 3.11: ob_size is the signed number of 30-bit digits; ids below 2**30 have at most one.
  const Py_ssize_t digits = Py_SIZE(item);
  if (digits == 0 || digits == 1 || digits == -1) {
    const auto digit = static_cast<int64_t>(reinterpret_cast<PyLongObject*>(item)->ob_digit[0]);
    *out = static_cast<int32_t>(digits < 0 ? -digit : digit);  // |value| < 2**30
    return true;
  }
#endif
  const long value = PyLong_AsLong(item);
  if (value < INT32_MIN || value > INT32_MAX || (value == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "token id at index %lld does not fit int32", static_cast<long long>(index));
    return false;
  }
  *out = static_cast<int32_t>(value);
  return true;
}

}  // namespace

extern "C" {

// Writes int32(seq[start + i]) into out[i] for i in [0, min(stop, len(seq)) - start) and returns that
// count; seq is a list, a tuple, or an object whose `_x` attribute is a list (vLLM's ConstantList).
// capacity must be >= the count. On error: -1 with a Python exception set (TypeError for a non-int item or
// another sequence type, OverflowError outside int32, ValueError for bad bounds).
__attribute__((visibility("default"))) int64_t tagma_py_tokens_into(PyObject* seq, int64_t start, int64_t stop,
                                                                     int32_t* out, int64_t capacity) {
  PyObject* owned = nullptr;
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
    owned = PyObject_GetAttrString(seq, "_x");
    if (owned == nullptr || !PyList_Check(owned)) {
      Py_XDECREF(owned);
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "token ids must be a list, a tuple or a ConstantList, not %s",
                   Py_TYPE(seq)->tp_name);
      return -1;
    }
    seq = owned;
  }
  PyObject** items = PyList_Check(seq) ? reinterpret_cast<PyListObject*>(seq)->ob_item
                                       : reinterpret_cast<PyTupleObject*>(seq)->ob_item;
  const int64_t size = Py_SIZE(seq);
  if (stop > size) stop = size;
  if (start < 0 || stop < start) {
    Py_XDECREF(owned);
    PyErr_Format(PyExc_ValueError, "token bounds [%lld, %lld) are invalid for %lld tokens",
                 static_cast<long long>(start), static_cast<long long>(stop), static_cast<long long>(size));
    return -1;
  }
  const int64_t count = stop - start;
  if (count > capacity || (count > 0 && out == nullptr)) {
    Py_XDECREF(owned);
    PyErr_Format(PyExc_ValueError, "%lld tokens do not fit a buffer of %lld", static_cast<long long>(count),
                 static_cast<long long>(capacity));
    return -1;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!token_value(items[start + i], start + i, out + i)) {
      Py_XDECREF(owned);
      return -1;
    }
  }
  Py_XDECREF(owned);
  return count;
}

// One crossing for a prefix-index call on a token list: converts seq[start:stop] into a thread-local
// buffer, then calls the engine function `fn` (its address, from the engine library the binding loaded):
//   op 0: tagma_prefix_lookup(h, ns, tokens, count, max_blocks, ids_out, result)
//   op 1: tagma_prefix_lookup_attach(h, ns, request, tokens, count, max_blocks, result)
//   op 2: tagma_prefix_insert(h, ns, request, tokens, start, count, result)
// Returns the engine's status (read tagma_last_error on non-zero), or -1 with a Python exception set when
// the tokens cannot be converted (nothing was called then).
__attribute__((visibility("default"))) int32_t tagma_py_prefix_call(void* fn, int32_t op, uint64_t h, uint64_t ns,
                                                                     uint64_t request, PyObject* seq, int64_t start,
                                                                     int64_t stop, int64_t max_blocks,
                                                                     int32_t* ids_out, int64_t* result) {
  thread_local std::vector<int32_t> buffer;
  if (fn == nullptr || op < 0 || op > 2) {
    PyErr_SetString(PyExc_ValueError, "tagma_py_prefix_call: bad function or op");
    return -1;
  }
  const Py_ssize_t size = PyObject_Length(seq);
  if (size < 0) return -1;
  const int64_t end = stop < size ? stop : size;
  if (start < 0 || end < start) {
    PyErr_Format(PyExc_ValueError, "token bounds [%lld, %lld) are invalid for %lld tokens",
                 static_cast<long long>(start), static_cast<long long>(stop), static_cast<long long>(size));
    return -1;
  }
  try {
    if (static_cast<size_t>(end - start) > buffer.size()) buffer.resize(static_cast<size_t>(end - start));
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  const int64_t count = tagma_py_tokens_into(seq, start, end, buffer.data(), static_cast<int64_t>(buffer.size()));
  if (count < 0) return -1;
  switch (op) {
    case 0:
      return reinterpret_cast<decltype(&tagma_prefix_lookup)>(fn)(h, ns, buffer.data(), count, max_blocks, ids_out,
                                                                  result);
    case 1:
      return reinterpret_cast<decltype(&tagma_prefix_lookup_attach)>(fn)(h, ns, request, buffer.data(), count,
                                                                         max_blocks, result);
    default:
      return reinterpret_cast<decltype(&tagma_prefix_insert)>(fn)(h, ns, request, buffer.data(), start, count,
                                                                  result);
  }
}

}  // extern "C"
