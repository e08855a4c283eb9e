#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "memory/workspace.h"

namespace tessera {
namespace {

class CpuWorkspace final : public Workspace {
 public:
  explicit CpuWorkspace(size_t reserve_bytes) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    reserved_ = round_up(reserve_bytes == 0 ? page_ : reserve_bytes);
    void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail("workspace: cannot reserve " + std::to_string(reserved_ >> 20) +
           " MiB of virtual address space: " + std::strerror(errno));
    }
    base_ = p;
  }
  ~CpuWorkspace() override {
    if (base_ != nullptr) munmap(base_, reserved_);
  }
  CpuWorkspace(const CpuWorkspace&) = delete;
  CpuWorkspace& operator=(const CpuWorkspace&) = delete;

  void* base() const override { return base_; }
  size_t reserved() const override { return reserved_; }
  size_t committed() const override { return committed_; }
  size_t granularity() const override { return page_; }

  void commit(size_t bytes) override {
    const size_t want = round_up(bytes);
    if (want > reserved_) {
      fail("workspace: the plan needs " + std::to_string(want >> 20) + " MiB but only " +
           std::to_string(reserved_ >> 20) + " MiB were reserved");
    }
    if (want > committed_) {
      auto* start = static_cast<char*>(base_) + committed_;
      if (mprotect(start, want - committed_, PROT_READ | PROT_WRITE) != 0) {
        fail(std::string("workspace: cannot commit memory: ") + std::strerror(errno));
      }
      committed_ = want;
    } else if (want < committed_ / 2) {
      shrink_to(want);
    }
  }
  void release() override { shrink_to(0); }

 private:
  size_t round_up(size_t b) const { return (b + page_ - 1) / page_ * page_; }
  void shrink_to(size_t want) {
    auto* start = static_cast<char*>(base_) + want;
    const size_t len = committed_ - want;
    if (len == 0) return;
    madvise(start, len, MADV_DONTNEED);
    mprotect(start, len, PROT_NONE);
    committed_ = want;
  }
  void* base_ = nullptr;
  size_t reserved_ = 0;
  size_t committed_ = 0;
  size_t page_ = 4096;
};

}  // namespace

std::unique_ptr<Workspace> make_cpu_workspace(size_t reserve_bytes) {
  return std::make_unique<CpuWorkspace>(reserve_bytes);
}

}  // namespace tessera
