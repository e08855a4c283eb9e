// A `tessera serve` process for a test's lifetime (the golden serve tests).
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace tessera::test {

// The events of an SSE body ("data: X" lines), [DONE] included.
inline std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> ev;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    ev.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return ev;
}

// A raw connection to 127.0.0.1:port that has sent `POST path` with the JSON `body`, for a client that
// leaves mid-request: the caller reads from it and closes it. -1 if it could not connect or send.
inline int post_raw(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// `tessera serve --port 0 ARGS`, logging to DIR/serve.log; port() once it listens (up to 20 s; ready()
// without a port for a Unix socket). launcher: a command before it (mpirun ...), which pid() is then.
class ServerProcess {
 public:
  ServerProcess(const std::string& args, const std::filesystem::path& dir, const std::string& launcher = "")
      : log_(dir / "serve.log") {
    const auto& log = log_;
    std::string out;
    EXPECT_EQ(run_command(launcher + std::string(TESSERA_BINARY) + " serve --port 0 " + args + " >" +
                              log.string() + " 2>&1 & echo $!",
                          &out),
              0);
    pid_ = std::stoi(out);
    for (int i = 0; i < 200 && !ready_; ++i) {  // up to 20 s for the model to load
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream f(log);
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t at = text.find("127.0.0.1:");
      if (at != std::string::npos) port_ = std::stoi(text.substr(at + 10));
      ready_ = port_ > 0 || text.find(" on unix:") != std::string::npos;  // a Unix socket has no port
    }
    EXPECT_TRUE(ready_) << "the server did not start";
  }
  ~ServerProcess() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  int port() const { return port_; }
  std::string log() const {
    std::ifstream f(log_);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  int pid() const { return pid_; }
  bool ready() const { return ready_; }
  // Whether the process still runs (not a zombie: it is not this process's child, a shell started it).
  bool alive() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    return pid_ > 0 && paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  }

 private:
  std::filesystem::path log_;
  int pid_ = 0, port_ = 0;
  bool ready_ = false;
};

}  // namespace tessera::test
