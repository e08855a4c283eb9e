#include "apps/tessera/client_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace tessera::cli {
namespace {

// "host port" of a socket address, as httplib formats it (getnameinfo, numeric).
std::string endpoint(const sockaddr_storage& a, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return {};
  return std::string(host) + " " + port;
}

int find_socket(const httplib::Request& req) {
  const std::string local = req.local_addr + " " + std::to_string(req.local_port),
                    remote = req.remote_addr + " " + std::to_string(req.remote_port);
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    sockaddr_storage a{}, b{};
    socklen_t la = sizeof(a), lb = sizeof(b);
    const int f = static_cast<int>(fd);
    if (getsockname(f, reinterpret_cast<sockaddr*>(&a), &la) != 0 ||
        getpeername(f, reinterpret_cast<sockaddr*>(&b), &lb) != 0)
      continue;
    if (endpoint(a, la) == local && endpoint(b, lb) == remote) {
      found = f;
      break;
    }
  }
  closedir(d);
  return found;
}

}  // namespace

ClientWatch::ClientWatch(const httplib::Request& req) : fd_(find_socket(req)) {}

bool ClientWatch::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace tessera::cli
