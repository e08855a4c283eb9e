// One virtually contiguous workspace: a large virtual range reserved once; physical memory
// committed up to the planned peak, released on shrink. Every planned tensor lives at base()+offset.
// The interface sits with the backends, which implement it for their memory (the CPU one is
// memory/workspace_cpu.cpp, declared in memory/workspace.h; the CUDA one backend/cuda/cuda_workspace.cpp).
#pragma once
#include <cstddef>
#include <memory>

namespace tessera {

class Workspace {
 public:
  virtual ~Workspace() = default;
  // Base of the reserved range (device pointer for device workspaces).
  virtual void* base() const = 0;
  virtual size_t reserved() const = 0;
  // Bytes physically backed now (a multiple of granularity()).
  virtual size_t committed() const = 0;
  virtual size_t granularity() const = 0;
  // Makes [0, bytes) usable. Grows the commitment when needed; shrinks it (returning memory to the
  // system) when bytes is below half of what is committed. Throws Error when bytes > reserved().
  virtual void commit(size_t bytes) = 0;
  // Returns all physical memory; the range stays reserved.
  virtual void release() = 0;
};

// CUDA (backend/cuda/cuda_workspace.cpp): cuMemAddressReserve once; cuMemCreate / cuMemMap /
// cuMemSetAccess chunks of the allocation granularity up to the planned peak; unmap and release
// after a device synchronize on shrink. Fails where tessera was built without CUDA.
std::unique_ptr<Workspace> make_cuda_workspace(size_t reserve_bytes);

}  // namespace tessera
