// The expert policy of DES (algorithms.md 4): the rows decoded in parallel, which vote for each MoE
// layer's coreset, are the current block's positions (from the end of the prompt); under
// Window-Diffusion, each forward's span of candidates.
#include <algorithm>

#include "decode/policies.h"

namespace tessera::decode {
namespace {

class SharedExperts final : public ExpertPolicy {
 public:
  explicit SharedExperts(bool per_forward) : per_forward_(per_forward) {}
  void begin_block(Loop& L, int lo, int hi) override { L.den.des_rows(std::max(lo, L.P), hi); }
  void before_forward(Loop& L) override {
    if (per_forward_) L.den.des_rows(L.pos.front(), L.pos.back() + 1);
  }

 private:
  bool per_forward_;
};

}  // namespace

std::unique_ptr<ExpertPolicy> make_experts(const GenerateOptions& o) {
  return std::make_unique<SharedExperts>(o.window);
}

}  // namespace tessera::decode
