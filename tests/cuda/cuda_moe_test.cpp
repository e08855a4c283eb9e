// MoE on the GPU against the CPU backend: routing (softmax top-k without renormalisation; sigmoid +
// expert bias + groups + renormalisation + scale; Dynamic Expert Sharing) and the expert FFN over the
// selected experts only (bf16 through the tensor-core grouped GEMM, f32 through the SIMT kernel), outputs
// poisoned first.
#include "cuda_test_util.h"

namespace tessera {
namespace {

using test::CudaTest;
using test::DevBuf;
using test::random_floats;

struct RouteCase {
  int64_t rows;
  int experts;
  MoeRouteParams p;
  bool bias;
};
class CudaMoeRoute : public CudaTest, public ::testing::WithParamInterface<RouteCase> {};

TEST_P(CudaMoeRoute, MatchesCpu) {
  RouteCase c = GetParam();
  const int k = c.p.top_k;
  const auto logits = random_floats(static_cast<size_t>(c.rows * c.experts), 71 + c.experts, 3.0f);
  const auto bias = random_floats(static_cast<size_t>(c.experts), 72, 0.5f);
  std::vector<int32_t> ids(static_cast<size_t>(c.rows * k));
  std::vector<float> w(ids.size());
  {
    MoeRouteParams hp = c.p;
    hp.expert_bias = c.bias ? bias.data() : nullptr;
    std::vector<float> l = logits;
    Tensor ti(ids.data(), DType::I32, {c.rows, k}), tw(w.data(), DType::F32, {c.rows, k});
    cpu->moe_route(Tensor(l.data(), DType::F32, {c.rows, c.experts}), hp, ti, tw);
  }
  DevBuf dl(*gpu, logits.size() * 4), db(*gpu, bias.size() * 4), di(*gpu, ids.size() * 4),
      dw(*gpu, w.size() * 4);
  dl.upload(logits);
  db.upload(bias);
  di.poison();
  dw.poison();
  MoeRouteParams dp = c.p;
  dp.expert_bias = c.bias ? static_cast<const float*>(db.p) : nullptr;
  Tensor ti = di.view(DType::I32, {c.rows, k}), tw = dw.view(DType::F32, {c.rows, k});
  gpu->moe_route(dl.view(DType::F32, {c.rows, c.experts}), dp, ti, tw);
  EXPECT_EQ(di.download<int32_t>(ids.size()), ids);
  const auto gw = dw.download<float>(w.size());
  EXPECT_CLOSE_TO_CPU(gw, w, 1e-5);
}

// DES (MoeShare) on the same inputs: the middle third of the rows votes; Seq (k = 1, those rows share)
// and Vote (m = E / 4, every row shares), in one call and as votes-then-routing: ids, weights and the
// layer state (votes within 1e-5; seq counts and the hit / coreset flags exactly) equal the CPU's.
TEST_P(CudaMoeRoute, SharingMatchesCpu) {
  RouteCase c = GetParam();
  const int k = c.p.top_k, E = c.experts;
  const auto logits = random_floats(static_cast<size_t>(c.rows * E), 71 + E, 3.0f);
  const auto bias = random_floats(static_cast<size_t>(E), 72, 0.5f);
  for (int variant = 0; variant < 3; ++variant) {
    MoeShare sh;
    sh.mode = variant == 0 ? DesMode::Seq : DesMode::Vote;
    sh.k = 1;
    sh.m_core = std::max(1, E / 4);
    sh.vote_lo = c.rows / 3;
    sh.vote_hi = 2 * c.rows / 3;
    sh.share_lo = variant == 0 ? sh.vote_lo : 0;
    sh.share_hi = variant == 0 ? sh.vote_hi : c.rows;
    const bool split = variant == 2;
    std::vector<int32_t> ids(static_cast<size_t>(c.rows * k));
    std::vector<float> w(ids.size()), state(static_cast<size_t>(5 * E), 0.0f);
    auto passes = [&](Backend& b, const Tensor& l, MoeRouteParams p, MoeShare share, float* st, Tensor& ti,
                      Tensor& tw) {
      share.state = st;
      p.share = &share;
      share.vote = true;
      share.apply = !split;
      b.moe_route(l, p, ti, tw);
      if (split) {
        share.vote = false;
        share.apply = true;
        b.moe_route(l, p, ti, tw);
      }
    };
    {
      MoeRouteParams hp = c.p;
      hp.expert_bias = c.bias ? bias.data() : nullptr;
      std::vector<float> l = logits;
      Tensor ti(ids.data(), DType::I32, {c.rows, k}), tw(w.data(), DType::F32, {c.rows, k});
      passes(*cpu, Tensor(l.data(), DType::F32, {c.rows, E}), hp, sh, state.data(), ti, tw);
    }
    DevBuf dl(*gpu, logits.size() * 4), db(*gpu, bias.size() * 4), di(*gpu, ids.size() * 4),
        dw(*gpu, w.size() * 4), ds(*gpu, state.size() * 4);
    dl.upload(logits);
    db.upload(bias);
    ds.upload(std::vector<float>(state.size(), 0.0f));
    di.poison();
    dw.poison();
    MoeRouteParams dp = c.p;
    dp.expert_bias = c.bias ? static_cast<const float*>(db.p) : nullptr;
    Tensor ti = di.view(DType::I32, {c.rows, k}), tw = dw.view(DType::F32, {c.rows, k});
    passes(*gpu, dl.view(DType::F32, {c.rows, E}), dp, sh, static_cast<float*>(ds.p), ti, tw);
    EXPECT_EQ(di.download<int32_t>(ids.size()), ids) << "variant " << variant;
    EXPECT_CLOSE_TO_CPU(dw.download<float>(w.size()), w, 1e-5);
    const auto gs = ds.download<float>(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      if (i < static_cast<size_t>(E))
        EXPECT_NEAR(gs[i], state[i], 1e-5 * std::max(1.0f, std::fabs(state[i]))) << "vote " << i;
      else
        EXPECT_EQ(gs[i], state[i]) << "variant " << variant << " state " << i;
    }
  }
}

MoeRouteParams route(MoeScore s, int k, bool norm, float scale, int groups, int topk_groups) {
  MoeRouteParams p;
  p.score = s;
  p.top_k = k;
  p.norm_topk = norm;
  p.scale = scale;
  p.n_group = groups;
  p.topk_group = topk_groups;
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, CudaMoeRoute,
    ::testing::Values(RouteCase{37, 8, route(MoeScore::Softmax, 2, false, 1.0f, 1, 1), false},
                      RouteCase{300, 64, route(MoeScore::Softmax, 8, false, 1.0f, 1, 1), false},
                      RouteCase{50, 32, route(MoeScore::Sigmoid, 4, true, 2.5f, 4, 2), true},
                      RouteCase{20, 256, route(MoeScore::Sigmoid, 8, true, 2.5f, 8, 4), true}),
    test::case_index_name);

// Random expert weights in both backends' memory, with their pointer tables.
struct Experts {
  std::vector<std::vector<float>> host_f32;
  std::vector<std::vector<uint16_t>> host_bf16;
  std::vector<std::unique_ptr<DevBuf>> dev;
  std::vector<const void*> host_table, dev_table;
  std::unique_ptr<DevBuf> dev_table_buf;
  MoeExperts cpu_e, gpu_e;
};

Experts make_experts(Backend& gpu, int E, int64_t D, int64_t F, DType dt) {
  Experts x;
  for (int i = 0; i < 3 * E; ++i) {
    const bool down = i >= 2 * E;
    auto f = random_floats(static_cast<size_t>(D * F), 200 + static_cast<uint64_t>(i),
                           1.0f / std::sqrt(static_cast<float>(down ? F : D)));
    x.host_f32.push_back(f);
    x.host_bf16.push_back(test::to_bf16(f));
  }
  for (int i = 0; i < 3 * E; ++i) {
    const size_t bytes = static_cast<size_t>(D * F) * dtype_size(dt);
    x.dev.push_back(std::make_unique<DevBuf>(gpu, bytes));
    if (dt == DType::BF16) {
      x.dev.back()->upload(x.host_bf16[static_cast<size_t>(i)]);
      x.host_table.push_back(x.host_bf16[static_cast<size_t>(i)].data());
    } else {
      x.dev.back()->upload(x.host_f32[static_cast<size_t>(i)]);
      x.host_table.push_back(x.host_f32[static_cast<size_t>(i)].data());
    }
    x.dev_table.push_back(x.dev.back()->p);
  }
  x.dev_table_buf = std::make_unique<DevBuf>(gpu, x.dev_table.size() * sizeof(void*));
  gpu.copy_to_device(x.dev_table_buf->p, x.dev_table.data(), x.dev_table.size() * sizeof(void*));
  x.cpu_e = MoeExperts{x.host_table.data(), E, D, F, dt};
  x.gpu_e = MoeExperts{static_cast<const void* const*>(x.dev_table_buf->p), E, D, F, dt};
  return x;
}

struct FfnCase {
  int64_t rows;
  int experts, k;
  int64_t hidden, inter;
  DType dtype;
  // Expert parallelism: this rank's experts [local_lo, local_hi) (0, 0: all), and whether it writes its
  // partial sum instead of adding it (a rank other than 0).
  int local_lo = 0, local_hi = 0;
  bool overwrite = false;
};
class CudaMoeFfn : public CudaTest, public ::testing::WithParamInterface<FfnCase> {};

TEST_P(CudaMoeFfn, MatchesCpu) {
  const FfnCase c = GetParam();
  Experts ex = make_experts(*gpu, c.experts, c.hidden, c.inter, c.dtype);
  for (MoeExperts* e : {&ex.cpu_e, &ex.gpu_e}) {
    e->local_lo = c.local_lo;
    e->local_hi = c.local_hi;
    e->overwrite = c.overwrite;
  }
  // As a sharded load leaves them: the other ranks' experts null in the device's table, so a read
  // of one faults.
  std::unique_ptr<DevBuf> local_table;
  if (c.local_hi > 0) {
    std::vector<const void*> t = ex.dev_table;
    for (int p = 0; p < 3; ++p)
      for (int x = 0; x < c.experts; ++x)
        if (!ex.gpu_e.local(x)) t[static_cast<size_t>(p * c.experts + x)] = nullptr;
    local_table = std::make_unique<DevBuf>(*gpu, t.size() * sizeof(void*));
    gpu->copy_to_device(local_table->p, t.data(), t.size() * sizeof(void*));
    ex.gpu_e.table = static_cast<const void* const*>(local_table->p);
  }
  const bool bf = c.dtype == DType::BF16;
  const auto xf = random_floats(static_cast<size_t>(c.rows * c.hidden), 81);
  const auto xb = test::to_bf16(xf);
  const auto base = random_floats(static_cast<size_t>(c.rows * c.hidden), 82);
  // Routing on the CPU (deterministic), the same ids / weights for both backends.
  const auto logits = random_floats(static_cast<size_t>(c.rows * c.experts), 83, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(c.rows * c.k));
  std::vector<float> w(ids.size());
  {
    std::vector<float> l = logits;
    MoeRouteParams p;
    p.top_k = c.k;
    Tensor ti(ids.data(), DType::I32, {c.rows, c.k}), tw(w.data(), DType::F32, {c.rows, c.k});
    cpu->moe_route(Tensor(l.data(), DType::F32, {c.rows, c.experts}), p, ti, tw);
  }
  const size_t scratch = moe_scratch_bytes(c.rows, c.k, ex.cpu_e);
  std::vector<float> ref = base;
  {
    std::vector<char> s(scratch);
    std::vector<uint16_t> xbb = xb;
    std::vector<float> xff = xf;
    std::vector<int32_t> i = ids;
    std::vector<float> ww = w;
    Tensor tx(bf ? static_cast<void*>(xbb.data()) : xff.data(), c.dtype, {c.rows, c.hidden});
    Tensor ts(s.data(), DType::I32, {static_cast<int64_t>(scratch / 4)});
    Tensor to(ref.data(), DType::F32, {c.rows, c.hidden});
    cpu->moe_ffn(tx, Tensor(i.data(), DType::I32, {c.rows, c.k}),
                 Tensor(ww.data(), DType::F32, {c.rows, c.k}), ex.cpu_e, ts, to);
  }
  DevBuf dx(*gpu, xf.size() * 4), di(*gpu, ids.size() * 4), dw(*gpu, w.size() * 4), ds(*gpu, scratch),
      dout(*gpu, base.size() * 4);
  if (bf) {
    dx.upload(xb);
  } else {
    dx.upload(xf);
  }
  di.upload(ids);
  dw.upload(w);
  ds.poison();
  dout.upload(base);
  Tensor ts = ds.view(DType::I32, {static_cast<int64_t>(scratch / 4)}),
         to = dout.view(DType::F32, {c.rows, c.hidden});
  gpu->moe_ffn(dx.view(c.dtype, {c.rows, c.hidden}), di.view(DType::I32, {c.rows, c.k}),
               dw.view(DType::F32, {c.rows, c.k}), ex.gpu_e, ts, to);
  const auto got = dout.download<float>(ref.size());
  // Compare the added part (out - base) so that the residual does not hide errors.
  std::vector<float> dg(got.size()), dr(ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    dg[i] = got[i] - base[i];
    dr[i] = ref[i] - base[i];
  }
  EXPECT_CLOSE_TO_CPU(dg, dr, bf ? 1e-2 : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeFfn,
                         ::testing::Values(FfnCase{1, 8, 2, 64, 32, DType::BF16},
                                           FfnCase{5, 64, 8, 64, 32, DType::BF16},  // most experts get no row
                                           FfnCase{300, 16, 4, 128, 96, DType::BF16},
                                           FfnCase{257, 64, 8, 256, 128, DType::BF16},
                                           FfnCase{40, 8, 2, 48, 40, DType::F32},
                                           // expert parallelism: rank 0 of 4, rank 1 of 2, rank 3 of 4
                                           FfnCase{300, 16, 4, 128, 96, DType::BF16, 0, 4, false},
                                           FfnCase{257, 64, 8, 256, 128, DType::BF16, 32, 64, true},
                                           FfnCase{40, 8, 2, 48, 40, DType::F32, 6, 8, true}),
                         test::case_index_name);

}  // namespace
}  // namespace tessera
