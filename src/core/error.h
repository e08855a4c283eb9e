// The one error type of the engine: a message that says what was wrong and what to do.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] inline void fail(const std::string& msg) {
  throw Error(msg);
}

#define TESSERA_CHECK(cond, msg)                    \
  do {                                              \
    if (!(cond)) ::tessera::fail(std::string(msg)); \
  } while (0)

}  // namespace tessera
