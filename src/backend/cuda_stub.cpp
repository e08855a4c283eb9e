// make_cuda_backend / make_cuda_workspace when tessera is built without CUDA.
#ifndef TESSERA_HAVE_CUDA
#include "backend/backend.h"
#include "backend/workspace.h"
#include "core/error.h"

namespace tessera {
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  if (why_not != nullptr) *why_not = "tessera was built without CUDA (configure with -DTESSERA_CUDA=ON)";
  return nullptr;
}
std::unique_ptr<Workspace> make_cuda_workspace(size_t) {
  fail("tessera was built without CUDA (configure with -DTESSERA_CUDA=ON)");
}
}  // namespace tessera
#endif
