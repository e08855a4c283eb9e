// A `tessera serve` process for a test's lifetime (the golden serve tests).
#pragma once
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "test_util.h"

namespace tessera::test {

// `tessera serve --port 0 ARGS`, logging to DIR/serve.log; port() once it listens (up to 20 s).
class ServerProcess {
 public:
  ServerProcess(const std::string& args, const std::filesystem::path& dir) {
    const auto log = dir / "serve.log";
    std::string out;
    EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " serve --port 0 " + args + " >" + log.string() +
                              " 2>&1 & echo $!",
                          &out),
              0);
    pid_ = std::stoi(out);
    for (int i = 0; i < 200 && port_ == 0; ++i) {  // up to 20 s for the model to load
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream f(log);
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t at = text.find("127.0.0.1:");
      if (at != std::string::npos) port_ = std::stoi(text.substr(at + 10));
    }
    EXPECT_GT(port_, 0) << "the server did not start";
  }
  ~ServerProcess() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  int port() const { return port_; }
  int pid() const { return pid_; }

 private:
  int pid_ = 0, port_ = 0;
};

}  // namespace tessera::test
