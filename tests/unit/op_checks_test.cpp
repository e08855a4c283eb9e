// The op argument checks shared by every backend (backend/op_checks.h): the CPU backend refuses what the
// CUDA backend refuses (rope's rotary_dim, rmsnorm's group, swiglu's dtypes, gemm's bias), with one
// message for both, and a check naming the device names the calling backend.
#include "backend/op_checks.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(OpChecks, CpuBackendChecksRopeRotaryDim) {
  auto be = make_cpu_backend();
  std::vector<float> x(2 * 8, 1.0f);
  std::vector<int32_t> pos = {0, 1};
  Tensor tx(x.data(), DType::F32, {2, 8}), tp(pos.data(), DType::I32, {2});
  be->rope(tx, tp, 8, RopeParams{.rotary_dim = 8, .theta = 10000.0f});  // valid
  for (const int rot : {0, 3, 10})
    test::expect_error([&] { be->rope(tx, tp, 8, RopeParams{.rotary_dim = rot, .theta = 10000.0f}); },
                       "rope: bad rotary_dim");
  Tensor short_pos(pos.data(), DType::I32, {1});
  test::expect_error([&] { be->rope(tx, short_pos, 8, RopeParams{.rotary_dim = 8, .theta = 10000.0f}); },
                     "rope: one position per row");
  // YaRN and the position scale are checked too.
  test::expect_error([&] { be->rope(tx, tp, 8, RopeParams{.rotary_dim = 8, .yarn_factor = 0.5f}); },
                     "rope: YaRN needs factor >= 1");
  test::expect_error([&] { be->rope(tx, tp, 8, RopeParams{.rotary_dim = 8, .pos_beta = 0.1f}); },
                     "rope: the position scale needs pos_orig > 0");
}

TEST(OpChecks, CpuBackendChecksRmsnormGroup) {
  auto be = make_cpu_backend();
  std::vector<float> x(8, 1.0f), w(4, 1.0f), y(8);
  Tensor tx(x.data(), DType::F32, {2, 4}), ty(y.data(), DType::F32, {2, 4});
  be->rmsnorm(tx, Tensor(w.data(), DType::F32, {4}), 1e-5f, ty);  // valid
  test::expect_error([&] { be->rmsnorm(tx, Tensor(w.data(), DType::F32, {0}), 1e-5f, ty); },
                     "rmsnorm: shape mismatch");  // an empty weight: no group
  test::expect_error([&] { be->rmsnorm(tx, Tensor(w.data(), DType::F32, {3}), 1e-5f, ty); },
                     "rmsnorm: shape mismatch");
}

TEST(OpChecks, CpuBackendChecksSwigluDtypesAndGemmBias) {
  auto be = make_cpu_backend();
  std::vector<float> g(4, 1.0f), u(4, 1.0f), o(4);
  std::vector<uint16_t> half(4);
  Tensor tg(g.data(), DType::F32, {4}), to(o.data(), DType::F32, {4});
  test::expect_error([&] { be->swiglu(tg, Tensor(half.data(), DType::BF16, {4}), to); },
                     "swiglu: dtypes must all be f32 or all bf16");
  std::vector<float> a(2 * 4, 1.0f), w(3 * 4, 1.0f), c(2 * 3), bias(2, 0.0f);
  Tensor ta(a.data(), DType::F32, {2, 4}), tw(w.data(), DType::F32, {3, 4}), tc(c.data(), DType::F32, {2, 3});
  const Tensor short_bias(bias.data(), DType::F32, {2});
  test::expect_error([&] { be->gemm(ta, tw, &short_bias, tc, false); }, "gemm: bias must be f32 [N]");
}

TEST(OpChecks, MessagesNameTheCallingDevice) {
  std::vector<float> a(8), c(6);
  std::vector<uint16_t> w(12);
  Tensor ta(a.data(), DType::F32, {2, 4}), tw(w.data(), DType::BF16, {3, 4}),
      tc(c.data(), DType::F32, {2, 3});
  test::expect_error([&] { check_gemm(ta, tw, nullptr, tc, false, Device::CPU); },
                     "gemm (cpu): activation and weight dtypes must match");
  test::expect_error([&] { check_gemm(ta, tw, nullptr, tc, false, Device::CUDA); },
                     "gemm (cuda): activation and weight dtypes must match");
  const Tensor q(a.data(), DType::BF16, {2, 4}), k(a.data(), DType::F32, {2, 4});
  test::expect_error([&] { check_attention(q, k, k, tc, 1, 1, 4, AttnParams{}, Device::CUDA); },
                     "attention (cuda): q, k, v must be f32");
  test::expect_error([&] { check_attention(k, k, k, tc, 2, 0, 2, AttnParams{}, Device::CPU); },
                     "attention: n_heads must be a multiple of n_kv_heads");
}

// moe_route's checks take the device's limits: the CPU's messages name its own.
TEST(OpChecks, MoeRouteTakesTheDeviceLimits) {
  std::vector<float> logits(2 * 8);
  std::vector<int32_t> ids(2 * 2);
  std::vector<float> weights(2 * 2);
  const Tensor tl(logits.data(), DType::F32, {2, 8}), ti(ids.data(), DType::I32, {2, 2}),
      tw(weights.data(), DType::F32, {2, 2});
  MoeRouteParams p;
  p.top_k = 2;
  check_moe_route(tl, p, ti, tw, MoeRouteLimits{1024, 64, 1024});
  test::expect_error(
      [&] {
        check_moe_route(tl, p, ti, tw, MoeRouteLimits{4, 64, 4});
      },
      "moe_route: 1 to 4 experts supported");
  test::expect_error(
      [&] {
        check_moe_route(tl, p, ti, tw, MoeRouteLimits{1024, 1, 1024});
      },
      "moe_route: top_k must be in [1, min(E, 1)]");
  p.n_group = 8;
  p.topk_group = 1;
  test::expect_error(
      [&] {
        check_moe_route(tl, p, ti, tw, MoeRouteLimits{1024, 64, 4});
      },
      "moe_route: n_group must divide the expert count and topk_group be in [1, n_group] (at "
      "most 4 groups)");
  test::expect_error(
      [&] {
        check_moe_route(tl, p, ti, tw, MoeRouteLimits{1024, 64, 1024});
      },
      "moe_route: the kept groups hold fewer than top_k experts");
}

}  // namespace
}  // namespace tessera
