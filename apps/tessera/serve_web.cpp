// tessera serve's web page routes (web_assets.h): GET / and GET /web/NAME, from the files compiled into
// the binary or from --web-dir.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "apps/tessera/serve_request.h"
#include "apps/tessera/web_assets.h"
#include "core/error.h"

namespace tessera::cli {
namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The file name a page path asks for: "index.html" for /, NAME for /web/NAME, "" otherwise.
std::string_view asked_name(std::string_view path) {
  if (path == "/") return "index.html";
  if (path.substr(0, 5) == "/web/") return path.substr(5);
  return {};
}

// Whether If-None-Match (a list of entity tags, or *) names etag.
bool etag_matches(const std::string* if_none_match, std::string_view etag) {
  if (if_none_match == nullptr) return false;
  std::string_view list = *if_none_match;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view tag = list.substr(0, comma);
    while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.front()))) tag.remove_prefix(1);
    while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.remove_suffix(1);
    if (tag.substr(0, 2) == "W/") tag.remove_prefix(2);  // weak comparison, as If-None-Match asks
    if (tag == "*" || tag == etag) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

http::Response not_found(std::string_view path) {
  http::Response r;
  r.status = 404;
  r.set(error_body({404, "not_found_error", "no file " + std::string(path) + " in the web page"}),
        "application/json");
  return r;
}

// The headers of every file of the page: no sniffing, and for the page itself a Content-Security-Policy
// that lets it load only its own files and call only this server (no inline script, nothing remote).
http::Response file_response(std::string_view name, std::string body, std::string_view type) {
  http::Response r;
  r.set(std::move(body), std::string(type));
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  if (ends_with(name, ".html")) {
    r.headers.push_back({"Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                         "frame-ancestors 'none'"});
    r.headers.push_back({"Referrer-Policy", "no-referrer"});
  }
  return r;
}

void serve_embedded(http::Exchange& ex) {
  const http::Request& req = ex.request();
  const std::string_view name = asked_name(req.path);
  const WebFile* f = web_name_ok(name) ? find_web_file(name) : nullptr;
  if (f == nullptr) return ex.reply(not_found(req.path));
  http::Response r;
  if (etag_matches(req.header("If-None-Match"), f->etag)) {
    r.status = 304;
    r.content_type.clear();
  } else {
    r = file_response(f->name, std::string(f->body), f->content_type);
  }
  // Revalidated at each load (a new binary may bring a new page), answered 304 while unchanged.
  r.headers.push_back({"ETag", std::string(f->etag)});
  r.headers.push_back({"Cache-Control", "no-cache"});
  ex.reply(std::move(r));
}

// --web-dir: the file read at each request, only a regular file directly in the directory (symbolic
// links followed only where they stay inside it).
void serve_dir(http::Exchange& ex, const fs::path& dir) {
  const http::Request& req = ex.request();
  const std::string_view name = asked_name(req.path);
  const std::string_view type = web_content_type(name);
  if (!web_name_ok(name) || type.empty()) return ex.reply(not_found(req.path));
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(dir / std::string(name), ec);
  if (ec || p.parent_path() != dir || !fs::is_regular_file(p, ec)) return ex.reply(not_found(req.path));
  std::ifstream in(p, std::ios::binary);
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return ex.reply(not_found(req.path));
  http::Response r = file_response(name, std::move(body), type);
  r.headers.push_back({"Cache-Control", "no-store"});
  ex.reply(std::move(r));
}

}  // namespace

const WebFile* find_web_file(std::string_view name) {
  for (const WebFile& f : embedded_web_files())
    if (f.name == name) return &f;
  return nullptr;
}

std::string_view web_content_type(std::string_view name) {
  if (ends_with(name, ".html")) return "text/html; charset=utf-8";
  if (ends_with(name, ".js")) return "text/javascript; charset=utf-8";
  if (ends_with(name, ".css")) return "text/css; charset=utf-8";
  if (ends_with(name, ".svg")) return "image/svg+xml";
  return {};
}

bool web_name_ok(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool is_web_path(std::string_view path) {
  return path == "/" || path.substr(0, 5) == "/web/";
}

void add_web_routes(http::Server& svr, const std::string& web_dir) {
  using Run = http::Server::Run;
  if (web_dir.empty()) {
    svr.route("GET", "/", serve_embedded, Run::Inline);
    svr.route("GET", "/web/*", serve_embedded, Run::Inline);
    return;
  }
  std::error_code ec;
  const fs::path dir = fs::canonical(web_dir, ec);
  if (ec || !fs::is_directory(dir)) fail("--web-dir " + web_dir + " is not a directory");
  if (!fs::is_regular_file(dir / "index.html")) fail("--web-dir " + web_dir + " has no index.html");
  const auto h = [dir](http::Exchange& ex) { serve_dir(ex, dir); };
  svr.route("GET", "/", h, Run::Thread);
  svr.route("GET", "/web/*", h, Run::Thread);
}

}  // namespace tessera::cli
