// A minimal test runner: TEST registers a function; CHECK* record a failure and continue; REQUIRE* record
// a failure and abandon the current test.
#ifndef TAGMA_TEST_RUNNER_H
#define TAGMA_TEST_RUNNER_H

#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test {

using TestFunction = void (*)();

struct TestCase {
  const char* name;
  TestFunction function;
};

std::vector<TestCase>& all_tests();

struct Registrar {
  Registrar(const char* name, TestFunction function) { all_tests().push_back(TestCase{name, function}); }
};

// Thrown by REQUIRE* to abandon the current test.
struct Abort {};

void record_failure(const char* file, int line, const std::string& message);

template <class T, class = void>
struct Printable : std::false_type {};
template <class T>
struct Printable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};

template <class T>
std::string show(const T& value);
template <class A, class B>
std::string show(const std::pair<A, B>& value);
template <class T>
std::string show(const std::vector<T>& values);

template <class T>
std::string show(const T& value) {
  if constexpr (std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>) {
    return std::to_string(static_cast<int>(value));
  } else if constexpr (Printable<T>::value) {
    std::ostringstream out;
    out << value;
    return out.str();
  } else {
    return "<value>";
  }
}

template <class A, class B>
std::string show(const std::pair<A, B>& value) {
  return "(" + show(value.first) + ", " + show(value.second) + ")";
}

template <class T>
std::string show(const std::vector<T>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i == 0 ? "" : ", ") + show(values[i]);
  return text + "]";
}

}  // namespace test

#define TEST(name)                                                      \
  static void name();                                                   \
  static const ::test::Registrar name##_registrar(#name, name);         \
  static void name()

#define CHECK(condition)                                                                \
  do {                                                                                  \
    if (!(condition)) ::test::record_failure(__FILE__, __LINE__, "CHECK(" #condition ")"); \
  } while (0)

#define CHECK_EQ(actual, expected)                                                                        \
  do {                                                                                                    \
    const auto check_actual_ = (actual);                                                                    \
    const auto check_expected_ = (expected);                                                                \
    if (!(check_actual_ == check_expected_)) {                                                            \
      ::test::record_failure(__FILE__, __LINE__,                                                          \
                             "CHECK_EQ(" #actual ", " #expected "): " + ::test::show(check_actual_) +     \
                                 " != " + ::test::show(check_expected_));                                 \
    }                                                                                                     \
  } while (0)

#define REQUIRE(condition)                                                                 \
  do {                                                                                     \
    if (!(condition)) {                                                                    \
      ::test::record_failure(__FILE__, __LINE__, "REQUIRE(" #condition ")");               \
      throw ::test::Abort{};                                                               \
    }                                                                                      \
  } while (0)

#define REQUIRE_EQ(actual, expected)                                                                      \
  do {                                                                                                    \
    const auto require_actual_ = (actual);                                                                  \
    const auto require_expected_ = (expected);                                                              \
    if (!(require_actual_ == require_expected_)) {                                                        \
      ::test::record_failure(__FILE__, __LINE__,                                                          \
                             "REQUIRE_EQ(" #actual ", " #expected "): " + ::test::show(require_actual_) + \
                                 " != " + ::test::show(require_expected_));                               \
      throw ::test::Abort{};                                                                              \
    }                                                                                                     \
  } while (0)

#endif  // TAGMA_TEST_RUNNER_H
