// tessera serve's web page routes (apps/tessera/web_assets.h): GET / and GET /web/NAME with their content
// types and ETags, the compiled-in files equal to apps/tessera/web, 404 for anything else (no path
// traversal), open without the API key that /v1 needs, --no-web, and --web-dir. The page itself is tested
// in a browser by tests/web (ctest web_canvas).
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using test::ServerProcess;

std::string tiny() {
  return "-m " + (test::source_dir() / "models" / "tessera-tiny").string();
}
std::string web_source(const std::string& name) {
  return test::read_text(test::source_dir() / "apps" / "tessera" / "web" / name);
}

// A 404 with the server's JSON error object.
void expect_not_found(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path);
  ASSERT_TRUE(r) << path;
  EXPECT_EQ(r->status, 404) << path << "\n" << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << path;
  const json e = json::parse(r->body, nullptr, false);
  EXPECT_EQ(e["error"]["type"], "not_found_error") << path << "\n" << r->body;
}

TEST(ServeWeb, PageAndFilesWithTypesAndETags) {
  const auto dir = test::temp_dir("serve_web");
  ServerProcess server(tiny(), dir);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  const struct {
    const char *path, *file, *type;
  } files[] = {{"/", "index.html", "text/html; charset=utf-8"},
               {"/web/index.html", "index.html", "text/html; charset=utf-8"},
               {"/web/app.js", "app.js", "text/javascript; charset=utf-8"},
               {"/web/style.css", "style.css", "text/css; charset=utf-8"}};
  for (const auto& f : files) {
    auto r = c.Get(f.path);
    ASSERT_TRUE(r) << f.path;
    EXPECT_EQ(r->status, 200) << f.path;
    EXPECT_EQ(r->get_header_value("Content-Type"), f.type) << f.path;
    EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff") << f.path;
    // The bytes compiled in are those of the source tree (the build regenerates them when a file changes).
    EXPECT_EQ(r->body, web_source(f.file)) << f.path;
    const std::string etag = r->get_header_value("ETag");
    ASSERT_EQ(etag.size(), 18u) << f.path << ": " << etag;  // "16 hex digits"
    EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache");
    // Revalidation: 304 without a body while the file is the same, the file again for another tag.
    auto same = c.Get(f.path, {{"If-None-Match", "\"other\", " + etag}});
    ASSERT_TRUE(same);
    EXPECT_EQ(same->status, 304) << f.path;
    EXPECT_TRUE(same->body.empty());
    EXPECT_EQ(same->get_header_value("ETag"), etag);
    auto other = c.Get(f.path, {{"If-None-Match", "\"0000000000000000\""}});
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 200);
    EXPECT_EQ(other->body, r->body);
  }
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("<script src=\"/web/app.js\""), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'self'"), std::string::npos);
  EXPECT_NE(c.Get("/web/app.js")->get_header_value("ETag"),
            c.Get("/web/style.css")->get_header_value("ETag"));
  auto head = c.Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  auto post = c.Post("/", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  // Only the page's files: no other name, no path, no escape, nothing hidden.
  for (const char* path : {"/web/x", "/web/", "/web/app.js/", "/web/../CMakeLists.txt",
                           "/web/..%2fCMakeLists.txt", "/web/%2e%2e/CMakeLists.txt", "/web/.git",
                           "/web/web_assets.h", "/web//etc/passwd", "/index.html", "/app.js", "/webx"})
    expect_not_found(c, path);
  auto long_name = c.Get("/web/" + std::string(6000, 'a') + ".js");  // the error does not echo it whole
  ASSERT_TRUE(long_name);
  EXPECT_EQ(long_name->status, 404);
  EXPECT_LT(long_name->body.size(), 1024u);
}

// The page is open without the key (it asks the user for it); the API is not.
TEST(ServeWeb, PageIsOpenWithoutTheKeyTheApiIsNot) {
  const auto dir = test::temp_dir("serve_web_key");
  ServerProcess server(tiny() + " --api-key sk-web", dir);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  for (const char* path : {"/", "/web/app.js", "/web/style.css"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << path;
  }
  expect_not_found(c, "/web/x");  // a page path without a file: 404, not 401
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto keyed = c.Get("/v1/models", {{"Authorization", "Bearer sk-web"}});
  ASSERT_TRUE(keyed);
  EXPECT_EQ(keyed->status, 200);
}

// --no-web: no page, / is the API's 404 as before, and with a key the page's paths need it like any other.
TEST(ServeWeb, NoWebServesNoPage) {
  const auto dir = test::temp_dir("serve_no_web");
  {
    ServerProcess server(tiny() + " --no-web", dir);
    ASSERT_GT(server.port(), 0);
    httplib::Client c("127.0.0.1", server.port());
    for (const char* path : {"/", "/web/app.js", "/web/index.html"}) expect_not_found(c, path);
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  ServerProcess keyed(tiny() + " --no-web --api-key sk-web", dir);
  ASSERT_GT(keyed.port(), 0);
  httplib::Client c("127.0.0.1", keyed.port());
  auto r = c.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
}

// --web-dir: the files of that directory, read at each request (an edit shows on reload), only regular
// files directly in it with a type the page uses; nothing outside it, through a path or a symbolic link.
TEST(ServeWeb, WebDirServesItsFilesAndNothingOutside) {
  namespace fs = std::filesystem;
  const auto tmp = test::temp_dir("serve_web_dir");
  const fs::path web = tmp / "web";
  fs::create_directories(web / "sub");
  std::ofstream(web / "index.html") << "<p>dev page</p>";
  std::ofstream(web / "app.js") << "console.log('dev');";
  std::ofstream(web / "notes.txt") << "not a page file";
  std::ofstream(web / "sub" / "x.js") << "nested";
  std::ofstream(tmp / "secret.js") << "secret";
  fs::create_symlink(tmp / "secret.js", web / "link.js");
  ServerProcess server(tiny() + " --web-dir " + web.string(), tmp);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->body, "<p>dev page</p>");
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page->get_header_value("Cache-Control"), "no-store");
  std::ofstream(web / "app.js") << "console.log('edited');";
  auto js = c.Get("/web/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200);
  EXPECT_EQ(js->body, "console.log('edited');");
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  for (const char* path : {"/web/style.css", "/web/notes.txt", "/web/sub", "/web/sub/x.js", "/web/link.js",
                           "/web/../secret.js", "/web/..%2fsecret.js", "/web/%2e%2e%2fsecret.js"})
    expect_not_found(c, path);
}

TEST(ServeWeb, BadWebFlagsAreOneLineErrors) {
  const auto tmp = test::temp_dir("serve_web_flags");
  const std::string serve = std::string(TESSERA_BINARY) + " serve " + tiny() + " --port 0 ";
  test::expect_command_error(serve + "--web-dir " + (tmp / "absent").string() + " 2>&1", "--web-dir");
  test::expect_command_error(serve + "--web-dir " + tmp.string() + " 2>&1", "has no index.html");
  std::ofstream(tmp / "index.html") << "<p>x</p>";
  test::expect_command_error(serve + "--web-dir " + tmp.string() + " --no-web 2>&1", "--no-web");
}

}  // namespace
}  // namespace tessera
