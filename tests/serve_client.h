// cpp-httplib clients of a `tessera serve` process (the golden serve tests): the bundled model's server, JSON
// posts with the status they must get, refusals.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "serve_process.h"
#include "test_util.h"

namespace tessera::test {

// The bundled default model, and a server of it with extra arguments logging under temp dir `name`.
inline std::filesystem::path tiny_dir() {
  return test::source_dir() / "models" / "tessera-tiny";
}
inline ServerProcess tiny_server(const std::string& extra, const std::string& name) {
  return ServerProcess("-m " + tiny_dir().string() + extra, test::temp_dir(name));
}

// A client of the server that waits long enough for a generation.
inline httplib::Client client_of(const ServerProcess& server, int timeout_s = 60) {
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(timeout_s, 0);
  return c;
}

inline nlohmann::json post(httplib::Client& c, const std::string& path, const std::string& body,
                           int want_status) {
  auto r = c.Post(path, body, "application/json");
  if (!r) {
    ADD_FAILURE() << "no response for " << body;
    return {};
  }
  EXPECT_EQ(r->status, want_status) << body << "\n" << r->body;
  return nlohmann::json::parse(r->body, nullptr, false);
}

// A request the server must refuse with a 400 whose message contains msg.
inline void expect_refused(httplib::Client& c, const std::string& path, const nlohmann::json& body,
                           const std::string& msg) {
  const nlohmann::json e = post(c, path, body.dump(), 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find(msg), std::string::npos) << e.dump();
}

}  // namespace tessera::test
