// The workspace of a step's plan (backend/workspace.h: the interface, and the CUDA one) and the CPU
// workspace.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/workspace.h"

namespace tessera {

// CPU: mmap(PROT_NONE, MAP_NORESERVE) reserve; mprotect to commit; madvise(DONTNEED) to release.
std::unique_ptr<Workspace> make_cpu_workspace(size_t reserve_bytes);

}  // namespace tessera
