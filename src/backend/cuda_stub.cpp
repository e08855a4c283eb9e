// make_cuda_backend when tessera is built without CUDA.
#ifndef TESSERA_HAVE_CUDA
#include "backend/backend.h"

namespace tessera {
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  if (why_not != nullptr) *why_not = "tessera was built without CUDA (configure with -DTESSERA_CUDA=ON)";
  return nullptr;
}
}  // namespace tessera
#endif
