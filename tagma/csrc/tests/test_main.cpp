// Runs every registered test (or those whose name contains argv[1]); prints each failure and a summary
// line "N passed, M failed"; exits non-zero when a test failed.
#include <cstdio>
#include <cstring>
#include <exception>

#include "test_runner.h"

namespace test {
namespace {

const char* current_test = "";
int current_failures = 0;

}  // namespace

std::vector<TestCase>& all_tests() {
  static std::vector<TestCase> tests;
  return tests;
}

void record_failure(const char* file, int line, const std::string& message) {
  ++current_failures;
  std::printf("FAIL %s (%s:%d): %s\n", current_test, file, line, message.c_str());
}

}  // namespace test

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  int passed = 0;
  int failed = 0;
  for (const test::TestCase& test_case : test::all_tests()) {
    if (std::strstr(test_case.name, filter) == nullptr) continue;
    test::current_test = test_case.name;
    test::current_failures = 0;
    try {
      test_case.function();
    } catch (const test::Abort&) {
      // already recorded
    } catch (const std::exception& error) {
      test::record_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + error.what());
    }
    if (test::current_failures == 0) {
      ++passed;
    } else {
      ++failed;
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
