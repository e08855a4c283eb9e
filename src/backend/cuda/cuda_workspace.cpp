// The CUDA workspace (declared in backend/workspace.h): one virtual range reserved once; physical
// chunks of the allocation granularity mapped up to the planned peak; released on shrink.
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/workspace.h"
#include "core/error.h"

namespace tessera {
namespace {

// The driver's virtual-memory API, fetched through the runtime (cudaGetDriverEntryPointByVersion):
// tessera links only the static CUDA runtime, so its binaries start (and report "no GPU") on
// machines without a driver.
struct Driver {
  decltype(&cuGetErrorString) get_error_string = nullptr;
  decltype(&cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

template <typename F>
void load(F& f, const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    fail(std::string("cuda workspace: the driver lacks ") + name);
  }
  f = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    load(x.get_error_string, "cuGetErrorString");
    load(x.ctx_get_device, "cuCtxGetDevice");
    load(x.granularity, "cuMemGetAllocationGranularity");
    load(x.reserve, "cuMemAddressReserve");
    load(x.address_free, "cuMemAddressFree");
    load(x.create, "cuMemCreate");
    load(x.release, "cuMemRelease");
    load(x.map, "cuMemMap");
    load(x.unmap, "cuMemUnmap");
    load(x.set_access, "cuMemSetAccess");
    return x;
  }();
  return d;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    driver().get_error_string(r, &msg);
    fail(std::string("cuda workspace: ") + what + ": " + (msg != nullptr ? msg : "unknown error"));
  }
}

class CudaWorkspace final : public Workspace {
 public:
  explicit CudaWorkspace(size_t reserve_bytes) {
    // The runtime's primary context must exist (the backend made it); the driver API then uses it.
    if (cudaFree(nullptr) != cudaSuccess) fail("cuda workspace: no CUDA context");
    const Driver& d = driver();
    CUdevice dev = 0;
    check_cu(d.ctx_get_device(&dev), "current device");
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev;
    check_cu(d.granularity(&gran_, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "granularity");
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    reserved_ = round_up(reserve_bytes == 0 ? gran_ : reserve_bytes);
    check_cu(d.reserve(&base_, reserved_, 0, 0, 0), "reserve the virtual range");
  }
  ~CudaWorkspace() override {
    cudaDeviceSynchronize();
    unmap_to(0);
    driver().address_free(base_, reserved_);
  }
  CudaWorkspace(const CudaWorkspace&) = delete;
  CudaWorkspace& operator=(const CudaWorkspace&) = delete;

  void* base() const override { return reinterpret_cast<void*>(base_); }
  size_t reserved() const override { return reserved_; }
  size_t committed() const override { return chunks_.size() * gran_; }
  size_t granularity() const override { return gran_; }

  void commit(size_t bytes) override {
    const size_t want = round_up(bytes);
    if (want > reserved_) {
      fail("workspace: the plan needs " + std::to_string(want >> 20) + " MiB but only " +
           std::to_string(reserved_ >> 20) + " MiB were reserved");
    }
    while (committed() < want) {
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = driver().create(&h, gran_, &prop_, 0);
      if (r != CUDA_SUCCESS) {
        fail("workspace: out of device memory: the plan needs " + std::to_string(want >> 20) +
             " MiB of activations and only " + std::to_string(committed() >> 20) +
             " MiB could be committed (lower --memory-budget or the context)");
      }
      const CUdeviceptr at = base_ + committed();
      check_cu(driver().map(at, gran_, 0, h, 0), "map a chunk");
      check_cu(driver().set_access(at, gran_, &access_, 1), "set access");
      chunks_.push_back(h);
    }
    if (want < committed() / 2) {
      cudaDeviceSynchronize();  // no kernel may still use the pages
      unmap_to(want);
    }
  }
  void release() override {
    cudaDeviceSynchronize();
    unmap_to(0);
  }

 private:
  size_t round_up(size_t b) const { return (b + gran_ - 1) / gran_ * gran_; }
  void unmap_to(size_t bytes) {
    while (committed() > bytes) {
      const CUdeviceptr at = base_ + committed() - gran_;
      driver().unmap(at, gran_);
      driver().release(chunks_.back());
      chunks_.pop_back();
    }
  }
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  size_t gran_ = size_t{2} << 20;
  size_t reserved_ = 0;
  CUdeviceptr base_ = 0;
  std::vector<CUmemGenericAllocationHandle> chunks_;
};

}  // namespace

std::unique_ptr<Workspace> make_cuda_workspace(size_t reserve_bytes) {
  return std::make_unique<CudaWorkspace>(reserve_bytes);
}

}  // namespace tessera
