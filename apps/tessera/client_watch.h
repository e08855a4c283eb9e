// tessera serve: the connection of a request, to notice that its client went away while a non-streamed
// answer is generated. httplib 0.11 gives a handler no socket, so it is found among the process's
// descriptors by its two endpoints, as httplib wrote them into the request (it holds the socket open while
// the handler runs). A peer that closed its side (FIN) or reset the connection then polls as POLLRDHUP /
// POLLHUP / POLLERR. A client that half-closes after sending its request would read as gone; HTTP clients
// wait for the answer with the connection open.
#pragma once
#include <httplib.h>

namespace tessera::cli {

class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req);
  bool gone() const;

 private:
  int fd_;
};

}  // namespace tessera::cli
