// Token ids from Python to int32, read in C through the CPython API (libtagma_pylist.so, a CPython
// extension module loaded by tagma/prefix_index.py; it calls the engine through function addresses the
// binding passes). Kept out of libtagma so that the engine itself never links Python.
//
// vLLM hands token ids over as Python lists of ints (Request.prompt_token_ids; all_token_ids is a
// ConstantList whose `_x` is the list). Converting 128K of them with array.array('i', lst) costs tens of ns
// per token; this reads the list's items in place.
#include <Python.h>

#include <cstdint>
#include <cstring>
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

// Writes int32(seq[start + i]) into out[i] for i in [0, min(stop, len(seq)) - start) and returns that
// count; seq is a list, a tuple, or an object whose `_x` attribute is a list (vLLM's ConstantList).
// capacity must be >= the count. On error: -1 with a Python exception set (TypeError for a non-int item or
// another sequence type, OverflowError outside int32, ValueError for bad bounds).
int64_t tokens_into(PyObject* seq, int64_t start, int64_t stop, int32_t* out, int64_t capacity) {
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
//   op 0: tagma_prefix_lookup(h, ns, tokens, count, max_blocks, ids_out, &result)
//   op 1: tagma_prefix_lookup_attach(h, ns, request, tokens, count, max_blocks, &result)
//   op 2: tagma_prefix_insert(h, ns, request, tokens, start, count, &result)
// Returns the result (>= 0) on TAGMA_OK, else -status (read tagma_last_error), or -100 with a Python
// exception set when the tokens cannot be converted (nothing was called then).
int64_t call_engine(void* fn, int op, uint64_t h, uint64_t ns, uint64_t request, const int32_t* tokens,
                    int64_t start, int64_t count, int64_t max_blocks, int32_t* ids_out) {
  int64_t result = 0;
  tagma_status status;
  switch (op) {
    case 0:
      status = reinterpret_cast<decltype(&tagma_prefix_lookup)>(fn)(h, ns, tokens, count, max_blocks, ids_out,
                                                                    &result);
      break;
    case 1:
      status = reinterpret_cast<decltype(&tagma_prefix_lookup_attach)>(fn)(h, ns, request, tokens, count,
                                                                           max_blocks, &result);
      break;
    default:
      status = reinterpret_cast<decltype(&tagma_prefix_insert)>(fn)(h, ns, request, tokens, start, count, &result);
  }
  return status == TAGMA_OK ? result : -static_cast<int64_t>(status);
}

// The same call on an int32 buffer (a numpy int32 array, array.array('i')): read in place, no copy.
int64_t buffer_call(void* fn, int op, uint64_t h, uint64_t ns, uint64_t request, PyObject* obj, int64_t start,
                    int64_t stop, int64_t max_blocks, int32_t* ids_out) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -100;
  const char* format = view.format != nullptr ? view.format : "B";
  const size_t length = std::strlen(format);
  const bool int32 = view.itemsize == 4 && view.ndim == 1 && length > 0 && format[length - 1] == 'i' &&
                     (length == 1 || format[0] == '=' || format[0] == '@' || format[0] == '<');
  if (!int32) {
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_TypeError, "a token buffer must be 1-D native int32, got format '%s' of %zd bytes", format,
                 view.itemsize);
    return -100;
  }
  const int64_t size = view.len / 4;
  const int64_t end = stop < size ? stop : size;
  if (start < 0 || end < start) {
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError, "token bounds [%lld, %lld) are invalid for %lld tokens",
                 static_cast<long long>(start), static_cast<long long>(stop), static_cast<long long>(size));
    return -100;
  }
  const int64_t out = call_engine(fn, op, h, ns, request, static_cast<const int32_t*>(view.buf) + start, start,
                                  end - start, max_blocks, ids_out);
  PyBuffer_Release(&view);
  return out;
}

int64_t prefix_call(void* fn, int op, uint64_t h, uint64_t ns, uint64_t request, PyObject* seq,
                           int64_t start, int64_t stop, int64_t max_blocks, int32_t* ids_out) {
  thread_local std::vector<int32_t> buffer;
  if (!PyList_Check(seq) && !PyTuple_Check(seq) && PyObject_CheckBuffer(seq)) {
    return buffer_call(fn, op, h, ns, request, seq, start, stop, max_blocks, ids_out);
  }
  Py_ssize_t size = 0;
  if (PyList_Check(seq) || PyTuple_Check(seq)) {
    size = Py_SIZE(seq);
  } else {
    size = PyObject_Length(seq);
    if (size < 0) return -100;
  }
  const int64_t end = stop < size ? stop : size;
  if (start < 0 || end < start) {
    PyErr_Format(PyExc_ValueError, "token bounds [%lld, %lld) are invalid for %lld tokens",
                 static_cast<long long>(start), static_cast<long long>(stop), static_cast<long long>(size));
    return -100;
  }
  try {
    if (static_cast<size_t>(end - start) > buffer.size()) buffer.resize(static_cast<size_t>(end - start));
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -100;
  }
  const int64_t count = tokens_into(seq, start, end, buffer.data(), static_cast<int64_t>(buffer.size()));
  if (count < 0) return -100;
  return call_engine(fn, op, h, ns, request, buffer.data(), start, count, max_blocks, ids_out);
}

// prefix_call(fn, op, h, ns, request, seq, start, stop, max_blocks, ids_out) -> int: the result (>= 0), or
// -status when the engine refused (the caller raises with tagma_last_error). fn and ids_out are addresses
// (ids_out 0: none). A CPython fastcall: no ctypes machinery on the hot path.
PyObject* py_prefix_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_Format(PyExc_TypeError, "prefix_call takes 10 arguments, got %zd", nargs);
    return nullptr;
  }
  void* fn = PyLong_AsVoidPtr(args[0]);
  const long op = PyLong_AsLong(args[1]);
  const unsigned long long h = PyLong_AsUnsignedLongLong(args[2]);
  const unsigned long long ns = PyLong_AsUnsignedLongLong(args[3]);
  const unsigned long long request = PyLong_AsUnsignedLongLong(args[4]);
  const long long start = PyLong_AsLongLong(args[6]);
  const long long stop = PyLong_AsLongLong(args[7]);
  const long long max_blocks = PyLong_AsLongLong(args[8]);
  void* ids_out = args[9] == Py_None ? nullptr : PyLong_AsVoidPtr(args[9]);
  if (PyErr_Occurred()) return nullptr;
  if (fn == nullptr || op < 0 || op > 2) {
    PyErr_SetString(PyExc_ValueError, "prefix_call: bad function address or op");
    return nullptr;
  }
  const int64_t out = prefix_call(fn, static_cast<int>(op), h, ns, request, args[5], start, stop, max_blocks,
                                  static_cast<int32_t*>(ids_out));
  if (out == -100 && PyErr_Occurred()) return nullptr;
  return PyLong_FromLongLong(out);
}

// tokens_into(seq, start, stop, out, capacity) -> int: writes int32(seq[start:stop]) (stop clipped to the
// length) at address `out` (capacity int32 entries) and returns how many.
PyObject* py_tokens_into(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "tokens_into takes 5 arguments, got %zd", nargs);
    return nullptr;
  }
  const long long start = PyLong_AsLongLong(args[1]);
  long long stop = PyLong_AsLongLong(args[2]);
  void* out = PyLong_AsVoidPtr(args[3]);
  const long long capacity = PyLong_AsLongLong(args[4]);
  if (PyErr_Occurred()) return nullptr;
  const Py_ssize_t size = PyObject_Length(args[0]);
  if (size < 0) return nullptr;
  if (stop > size) stop = size;
  const int64_t count = tokens_into(args[0], start, stop, static_cast<int32_t*>(out), capacity);
  if (count < 0) return nullptr;
  return PyLong_FromLongLong(count);
}

PyMethodDef methods[] = {
    {"tokens_into", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_tokens_into)),
     METH_FASTCALL, "int32 token ids of seq[start:stop] into a buffer (see pylist.cpp)."},
    {"prefix_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_prefix_call)),
     METH_FASTCALL, "A prefix-index engine call on a token list (see pylist.cpp)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "libtagma_pylist", "tagma's token-list reader", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

// Loaded by tagma/prefix_index.py with importlib's ExtensionFileLoader under the name libtagma_pylist.
extern "C" __attribute__((visibility("default"))) PyObject* PyInit_libtagma_pylist(void) {
  return PyModule_Create(&module);
}
