// The one error type of the engine: a message that says what was wrong and what to do.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A request that cannot fit the memory budget (the C API's TESSERA_ERROR_MEMORY_BUDGET).
class BudgetError : public Error {
 public:
  explicit BudgetError(const std::string& msg) : Error(msg) {}
};

[[noreturn]] inline void fail(const std::string& msg) {
  throw Error(msg);
}
[[noreturn]] inline void fail_budget(const std::string& msg) {
  throw BudgetError(msg);
}

#define TESSERA_CHECK(cond, msg)                    \
  do {                                              \
    if (!(cond)) ::tessera::fail(std::string(msg)); \
  } while (0)

}  // namespace tessera
