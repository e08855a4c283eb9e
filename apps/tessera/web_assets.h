// tessera serve's web page: a chat that shows the canvas denoising live, over the server's own API
// (apps/tessera/web: index.html, app.js, style.css; plain files, no build step). Its files are compiled
// into the binary (cmake/embed_web.cmake generates BUILD/web_assets_data.cpp) or, with --web-dir DIR, read
// from DIR at each request (for working on the page). Routes: GET / (index.html) and GET /web/NAME; both
// open without an API key (the page asks for the key and sends it with its API calls).
#pragma once
#include <span>
#include <string>
#include <string_view>

#include "apps/tessera/http_server.h"

namespace tessera::cli {

struct WebFile {
  std::string_view name;          // "app.js"
  std::string_view content_type;  // "text/javascript; charset=utf-8"
  std::string_view body;
  std::string_view etag;  // quoted, as sent: "\"0123456789abcdef\""
};

// The files compiled in (web_assets_data.cpp, generated).
std::span<const WebFile> embedded_web_files();
// The compiled-in file of that name; nullptr when there is none.
const WebFile* find_web_file(std::string_view name);
// The content type of a page file by its extension ("" for a kind the page does not use).
std::string_view web_content_type(std::string_view name);
// Whether a name asked under /web/ can be a file of the page: letters, digits, '.', '_', '-', not
// beginning with '.' (so no path, no "..", no escapes).
bool web_name_ok(std::string_view name);
// Whether a request path is one of the page's (/ and /web/...).
bool is_web_path(std::string_view path);

// GET / and GET /web/* on svr: from the compiled-in files (with ETags, 304 on If-None-Match), or from
// web_dir when it is not empty (no caching). One-line error (tessera::Error) when web_dir has no
// index.html.
void add_web_routes(http::Server& svr, const std::string& web_dir);

}  // namespace tessera::cli
