// DiffusionGemma on the GPU: the uniform-noise ops against the CPU backend (rmsnorm without scale and
// accumulating, geglu, scale, softcap, proportional RoPE, sliding-window and 512-wide attention, per-expert
// router scales, the sampler's statistics: the same tokens, soft embeddings), outputs poisoned first; then
// the tiny checkpoint in the real layout on --device cuda: encoder and decoder logits as the CPU engine's,
// the same canvas predictions and the same generation as the CPU (which matches the numpy reference:
// tests/golden/diffusion_gemma_test.cpp).
#include "cuda_test_util.h"
#include "decode/generate.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::cuda_engine_options;
using test::CudaTest;
using test::DevBuf;
using test::from_bf16;
using test::random_floats;
using test::to_bf16;

Tensor host(std::vector<float>& v, int64_t r, int64_t c) {
  return Tensor(v.data(), DType::F32, {r, c});
}

// Narrow groups (a warp each: heads) and wide ones (a block each: the hidden size).
class CudaRmsNormEx : public CudaTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(CudaRmsNormEx, MatchesCpu) {
  const int64_t R = 37, group = GetParam(), cols = 2 * group;
  const auto x = random_floats(static_cast<size_t>(R * cols), 1, 2.0f);
  const auto w = random_floats(static_cast<size_t>(group), 2, 1.0f);
  const auto y0 = random_floats(x.size(), 3, 1.0f);
  DevBuf dx(*gpu, x.size() * 4), dw(*gpu, w.size() * 4), dy(*gpu, x.size() * 4);
  dx.upload(x);
  dw.upload(w);
  for (const bool weighted : {false, true}) {
    for (const int mode : {0, 1, 2}) {  // f32, f32 accumulating, bf16
      std::vector<float> xs = x, want = y0, wv = w;
      std::vector<uint16_t> want_b(x.size());
      Tensor tw(wv.data(), DType::F32, {group});
      Tensor ty = mode == 2 ? Tensor(want_b.data(), DType::BF16, {R, cols}) : host(want, R, cols);
      cpu->rmsnorm_ex(host(xs, R, cols), weighted ? &tw : nullptr, group, 1e-6f, mode == 1, ty);
      if (mode == 1)
        dy.upload(y0);
      else
        dy.poison();
      Tensor gw = dw.view(DType::F32, {group});
      Tensor gy = dy.view(mode == 2 ? DType::BF16 : DType::F32, {R, cols});
      gpu->rmsnorm_ex(dx.view(DType::F32, {R, cols}), weighted ? &gw : nullptr, group, 1e-6f, mode == 1, gy);
      if (mode == 2) {
        EXPECT_CLOSE_TO_CPU(from_bf16(dy.download<uint16_t>(x.size())), from_bf16(want_b), 1e-2);
      } else {
        EXPECT_CLOSE_TO_CPU(dy.download<float>(x.size()), want, 1e-5);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, CudaRmsNormEx, ::testing::Values(int64_t{64}, int64_t{2816}));

TEST_F(CudaTest, UniformGegluScaleSoftcapMatchCpu) {
  const int64_t n = 1001;
  auto g = random_floats(n, 4, 3.0f), u = random_floats(n, 5, 1.0f);
  DevBuf dg(*gpu, n * 4), du(*gpu, n * 4), dout(*gpu, n * 4);
  for (const bool bf : {false, true}) {
    std::vector<float> want(n);
    std::vector<uint16_t> gb = to_bf16(g), ub = to_bf16(u), want_b(n);
    if (bf) {
      Tensor to(want_b.data(), DType::BF16, {n});
      cpu->geglu(Tensor(gb.data(), DType::BF16, {n}), Tensor(ub.data(), DType::BF16, {n}), to);
      dg.upload(gb);
      du.upload(ub);
    } else {
      Tensor to(want.data(), DType::F32, {n});
      cpu->geglu(Tensor(g.data(), DType::F32, {n}), Tensor(u.data(), DType::F32, {n}), to);
      dg.upload(g);
      du.upload(u);
    }
    dout.poison();
    const DType dt = bf ? DType::BF16 : DType::F32;
    Tensor go = dout.view(dt, {n});
    gpu->geglu(dg.view(dt, {n}), du.view(dt, {n}), go);
    if (bf) {
      EXPECT_CLOSE_TO_CPU(from_bf16(dout.download<uint16_t>(n)), from_bf16(want_b), 1e-2);
    } else {
      EXPECT_CLOSE_TO_CPU(dout.download<float>(n), want, 1e-5);
    }
  }
  std::vector<float> x = random_floats(n, 6, 80.0f), want = x;
  Tensor tw(want.data(), DType::F32, {n});
  cpu->scale(tw, -1.75f);
  cpu->softcap(tw, 30.0f);
  DevBuf dx(*gpu, n * 4);
  dx.upload(x);
  Tensor gx = dx.view(DType::F32, {n});
  gpu->scale(gx, -1.75f);
  gpu->softcap(gx, 30.0f);
  EXPECT_CLOSE_TO_CPU(dx.download<float>(n), want, 1e-6);
}

// Gemma 4's global layers: 64 of 256 pairs rotate, pair i is (i, i + 128) at theta^(-2i / 256); a few rows
// (thread per pair) and many (a block per row).
TEST_F(CudaTest, UniformProportionalRopeMatchesCpu) {
  const int d = 256, heads = 2;
  RopeParams p;
  p.rotary_dim = 128;
  p.pair_offset = 128;
  p.freq_dim = 256;
  p.theta = 1e6f;
  for (const int64_t rows : {19, 70}) {
    auto x = random_floats(static_cast<size_t>(rows * heads * d), 7, 1.0f);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>(r * 97 + 3);
    std::vector<float> want = x;
    Tensor tw = host(want, rows, heads * d);
    cpu->rope(tw, Tensor(pos.data(), DType::I32, {rows}), d, p);
    DevBuf dx(*gpu, x.size() * 4), dp(*gpu, pos.size() * 4);
    dx.upload(x);
    dp.upload(pos);
    Tensor gx = dx.view(DType::F32, {rows, heads * d});
    gpu->rope(gx, dp.view(DType::I32, {rows}), d, p);
    EXPECT_CLOSE_TO_CPU(dx.download<float>(x.size()), want, 1e-5);
  }
}

// The CPU's f32 attention (its own test checks it against a direct reference) and the GPU's on the same
// inputs: head dims 256 and 512 (the tile kernels stop at 256 on the CPU; on the GPU the tiled f32 kernel
// takes them), causal with a window, a canvas over a longer cache with a window, no window; f32 and bf16
// outputs; windows on narrow heads (the tiled kernel, and the SIMT kernel for a width it lacks).
TEST_F(CudaTest, UniformWindowedAndWideAttentionMatchCpu) {
  auto ref = make_cpu_backend(CpuBackendOptions{CpuAttention::F32});
  std::vector<int32_t> all(300);
  for (int32_t i = 0; i < 300; ++i) all[static_cast<size_t>(i)] = i;
  const std::vector<int32_t> canvas(all.begin() + 260, all.end());
  struct Case {
    int hq, hkv, d;
    MaskKind mask;
    int window;
    const std::vector<int32_t>* q_pos;
    DType out;
  };
  const std::vector<Case> cases = {
      {4, 2, 256, MaskKind::Causal, 40, &all, DType::F32},
      {4, 1, 256, MaskKind::None, 40, &canvas, DType::F32},
      {4, 1, 512, MaskKind::Causal, 40, &all, DType::F32},
      {4, 1, 512, MaskKind::None, 40, &canvas, DType::F32},
      {2, 2, 512, MaskKind::None, 0, &canvas, DType::BF16},
      {4, 2, 64, MaskKind::None, 40, &canvas, DType::BF16},
      {4, 2, 128, MaskKind::Causal, 40, &all, DType::BF16},
      {4, 2, 48, MaskKind::Causal, 40, &all, DType::F32},  // a width the tiled kernel lacks: the SIMT one
  };
  for (const Case& c : cases) {
    const auto nq = static_cast<int64_t>(c.q_pos->size()), nk = static_cast<int64_t>(all.size());
    auto q = random_floats(static_cast<size_t>(nq * c.hq * c.d), 1, 0.5f);
    auto k = random_floats(static_cast<size_t>(nk * c.hkv * c.d), 2, 0.5f);
    auto v = random_floats(static_cast<size_t>(nk * c.hkv * c.d), 3, 1.0f);
    std::vector<int32_t> cu_q = {0, static_cast<int32_t>(nq)}, cu_k = {0, static_cast<int32_t>(nk)};
    std::vector<int32_t> qp = *c.q_pos, kp = all;
    AttnParams p;
    p.mask = c.mask;
    p.window = c.window;
    p.scale = 1.0f;
    p.cu_q = cu_q.data();
    p.cu_k = cu_k.data();
    p.q_pos = qp.data();
    p.k_pos = kp.data();
    std::vector<float> want(q.size());
    std::vector<uint16_t> want_b(q.size());
    Tensor to = c.out == DType::F32 ? host(want, nq, c.hq * c.d)
                                    : Tensor(want_b.data(), DType::BF16, {nq, c.hq * c.d});
    ref->attention(host(q, nq, c.hq * c.d), host(k, nk, c.hkv * c.d), host(v, nk, c.hkv * c.d), to, c.hq,
                   c.hkv, c.d, p);
    DevBuf dq(*gpu, q.size() * 4), dk(*gpu, k.size() * 4), dv(*gpu, v.size() * 4), dout(*gpu, q.size() * 4),
        dcq(*gpu, 8), dck(*gpu, 8), dqp(*gpu, qp.size() * 4), dkp(*gpu, kp.size() * 4),
        dscr(*gpu, attn_kv_scratch_bytes(nk, c.hkv * c.d));
    dq.upload(q);
    dk.upload(k);
    dv.upload(v);
    dcq.upload(cu_q);
    dck.upload(cu_k);
    dqp.upload(qp);
    dkp.upload(kp);
    dout.poison();
    AttnParams g = p;
    g.cu_q = static_cast<const int32_t*>(dcq.p);
    g.cu_k = static_cast<const int32_t*>(dck.p);
    g.q_pos = static_cast<const int32_t*>(dqp.p);
    g.k_pos = static_cast<const int32_t*>(dkp.p);
    g.kv_scratch = dscr.p;  // lets the tensor-core kernel run where it could (not with a window)
    Tensor go = dout.view(c.out, {nq, c.hq * c.d});
    gpu->attention(dq.view(DType::F32, {nq, c.hq * c.d}), dk.view(DType::F32, {nk, c.hkv * c.d}),
                   dv.view(DType::F32, {nk, c.hkv * c.d}), go, c.hq, c.hkv, c.d, g);
    SCOPED_TRACE("d " + std::to_string(c.d) + " window " + std::to_string(c.window));
    if (c.out == DType::F32) {
      EXPECT_CLOSE_TO_CPU(dout.download<float>(q.size()), want, 1e-5);
    } else {
      EXPECT_CLOSE_TO_CPU(from_bf16(dout.download<uint16_t>(q.size())), from_bf16(want_b), 1e-2);
    }
  }
}

TEST_F(CudaTest, UniformRouterPerExpertScalesMatchCpu) {
  const int64_t M = 53;
  const int E = 128, K = 8;
  auto logits = random_floats(static_cast<size_t>(M * E), 9, 3.0f);
  auto scale = random_floats(E, 10, 1.0f);
  MoeRouteParams rp;
  rp.top_k = K;
  rp.norm_topk = true;
  rp.expert_scale = scale.data();
  std::vector<int32_t> ids(static_cast<size_t>(M * K));
  std::vector<float> w(ids.size());
  Tensor ti(ids.data(), DType::I32, {M, K}), tw(w.data(), DType::F32, {M, K});
  cpu->moe_route(host(logits, M, E), rp, ti, tw);
  DevBuf dl(*gpu, logits.size() * 4), ds(*gpu, scale.size() * 4), di(*gpu, ids.size() * 4),
      dw(*gpu, w.size() * 4);
  dl.upload(logits);
  ds.upload(scale);
  di.poison();
  dw.poison();
  rp.expert_scale = static_cast<const float*>(ds.p);
  Tensor gi = di.view(DType::I32, {M, K}), gw = dw.view(DType::F32, {M, K});
  gpu->moe_route(dl.view(DType::F32, {M, E}), rp, gi, gw);
  EXPECT_EQ(di.download<int32_t>(ids.size()), ids);
  EXPECT_CLOSE_TO_CPU(dw.download<float>(w.size()), w, 1e-5);
}

// The sampler's statistics: the same Gumbel-max tokens (the counter RNG in f64 on both), the same argmax
// (ties to the lower index), the entropy within 1e-5; flat rows (every token within reach) and peaked ones
// (most of the vocabulary skipped); the soft embeddings with f32 and bf16 tables.
TEST_F(CudaTest, UniformCanvasSampleAndSoftEmbedMatchCpu) {
  const int64_t R = 9, V = 5003, H = 96;
  auto L = random_floats(static_cast<size_t>(R * V), 11, 3.0f);
  for (int64_t v = 0; v < V; v += 7) L[static_cast<size_t>(4 * V + v)] += 60.0f;    // peaked rows
  L[static_cast<size_t>(2 * V + 100)] = L[static_cast<size_t>(2 * V + 7)] = 50.0f;  // a tie
  std::vector<int32_t> keys(R);
  for (int64_t r = 0; r < R; ++r) keys[static_cast<size_t>(r)] = static_cast<int32_t>(1000 + 3 * r);
  DevBuf dl(*gpu, L.size() * 4), dk(*gpu, keys.size() * 4), dt(*gpu, R * 4), da(*gpu, R * 4), de(*gpu, R * 4);
  dl.upload(L);
  dk.upload(keys);
  for (const float T : {0.3f, 1.0f, 2.5f}) {
    SampleParams sp;
    sp.temperature = T;
    sp.seed = 77;
    std::vector<int32_t> tok(R), am(R);
    std::vector<float> ent(R);
    Tensor tt(tok.data(), DType::I32, {R}), ta(am.data(), DType::I32, {R}), te(ent.data(), DType::F32, {R});
    cpu->canvas_sample(host(L, R, V), Tensor(keys.data(), DType::I32, {R}), sp, tt, ta, te);
    dt.poison();
    da.poison();
    de.poison();
    Tensor gt = dt.view(DType::I32, {R}), ga = da.view(DType::I32, {R}), ge = de.view(DType::F32, {R});
    gpu->canvas_sample(dl.view(DType::F32, {R, V}), dk.view(DType::I32, {R}), sp, gt, ga, ge);
    EXPECT_EQ(dt.download<int32_t>(R), tok) << "T " << T;
    EXPECT_EQ(da.download<int32_t>(R), am) << "T " << T;
    EXPECT_CLOSE_TO_CPU(de.download<float>(R), ent, 1e-5);
  }
  auto E = random_floats(static_cast<size_t>(V * H), 12, 1.0f);
  for (const bool bf : {false, true}) {
    const DType dt_ = bf ? DType::BF16 : DType::F32;
    std::vector<float> probs(static_cast<size_t>(R * V)), want(static_cast<size_t>(R * H));
    std::vector<uint16_t> Eb = to_bf16(E), pb(probs.size());
    Tensor table = bf ? Tensor(Eb.data(), DType::BF16, {V, H}) : host(E, V, H);
    Tensor tp = bf ? Tensor(pb.data(), DType::BF16, {R, V}) : host(probs, R, V);
    Tensor to = host(want, R, H);
    cpu->soft_embed(host(L, R, V), table, 0.7f, 3.0f, tp, to);
    DevBuf dE(*gpu, E.size() * 4), dp(*gpu, probs.size() * 4), dout(*gpu, want.size() * 4);
    if (bf)
      dE.upload(Eb);
    else
      dE.upload(E);
    dout.poison();
    Tensor gp = dp.view(dt_, {R, V}), go = dout.view(DType::F32, {R, H});
    gpu->soft_embed(dl.view(DType::F32, {R, V}), dE.view(dt_, {V, H}), 0.7f, 3.0f, gp, go);
    EXPECT_CLOSE_TO_CPU(dout.download<float>(want.size()), want, bf ? 1e-2 : 1e-5);
  }
}

// The tiny checkpoint on the GPU computes what the CPU computes: the encoder's causal logits, the decoder's
// over a cache past the sliding window (with self-conditioning), one canvas step's predictions, and the
// whole entropy-bound loop (f32: the same canvas tokens; bf16: runs to the end with tokens in the
// vocabulary).
TEST_F(CudaTest, TinyDiffusionGemmaMatchesTheCpu) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", "--dtype f32 --seed 2");
  auto on_cpu = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto on_gpu = Engine::load(dir, cuda_engine_options(Precision::F32));
  const int64_t V = on_cpu->vocab_size(), P = 13, C = 8;
  const auto prompt = test::random_canvas(P, V, 18, 0, 0.0);
  // Encoder: logits of positions 1..P-1 from rows 0..P-2.
  std::vector<int32_t> pos, rows;
  for (int32_t p = 1; p < P; ++p) pos.push_back(p), rows.push_back(p - 1);
  std::vector<std::vector<float>> enc(2, std::vector<float>(pos.size() * static_cast<size_t>(V)));
  std::vector<std::vector<float>> dec(2, std::vector<float>(static_cast<size_t>(C * V)));
  std::vector<CanvasPrediction> pred(2);
  std::vector<float> dec2_cpu;
  const auto canvas = test::random_canvas(C, V, 91, 0, 0.0);
  std::vector<int32_t> view = prompt;
  view.insert(view.end(), canvas.begin(), canvas.end());
  Engine* engines[2] = {on_cpu.get(), on_gpu.get()};
  std::vector<std::vector<float>> dec2(2, std::vector<float>(static_cast<size_t>(C * V)));
  for (int i = 0; i < 2; ++i) {
    Engine& e = *engines[i];
    e.kv_cache_reset(P + C);
    e.set_causal(true);
    e.logits_cached(prompt, 0, P, pos, enc[static_cast<size_t>(i)]);
    e.kv_cache_end();
    e.kv_cache_reset(P + C);
    e.set_causal(true);
    e.predict_cached(prompt, 0, P, {}, SampleParams{}, {}, {});
    e.set_causal(false);
    e.logits_canvas(view, P, P + C, {}, dec[static_cast<size_t>(i)]);
    SampleParams sp;
    sp.temperature = 0.7f;
    sp.seed = 5;
    e.denoise_canvas(view, P, P + C, {}, sp, pred[static_cast<size_t>(i)]);
    e.logits_canvas(view, P, P + C, pred[static_cast<size_t>(i)].soft, dec2[static_cast<size_t>(i)]);
    e.kv_cache_end();
  }
  EXPECT_CLOSE_TO_CPU(enc[1], enc[0], 1e-4);
  EXPECT_CLOSE_TO_CPU(dec[1], dec[0], 1e-4);
  EXPECT_CLOSE_TO_CPU(dec2[1], dec2[0], 1e-4);
  // And the GPU's logits against the numpy reference directly (1e-3, the CPU test's bound): the encoder's
  // rows, the decoder's over the cache, and with self-conditioning on the canvas's own step at T = 0.7.
  const std::string dec_args =
      "--mode dec --prompt " + test::join_ids(prompt) + " --canvas " + test::join_ids(canvas);
  const auto ref_enc = test::diffusion_gemma_reference_logits(
      dir, "--mode enc --tokens " + test::join_ids(prompt) + " --rows " + test::join_ids(rows),
      enc[1].size());
  const auto ref_dec = test::diffusion_gemma_reference_logits(dir, dec_args, dec[1].size());
  const auto ref_dec2 = test::diffusion_gemma_reference_logits(
      dir, dec_args + " --prev-canvas " + test::join_ids(canvas) + " --prev-temperature 0.7", dec2[1].size());
  EXPECT_LT(test::rel_error(enc[1].data(), ref_enc.data(), std::min(enc[1].size(), ref_enc.size())), 1e-3);
  EXPECT_LT(test::rel_error(dec[1].data(), ref_dec.data(), std::min(dec[1].size(), ref_dec.size())), 1e-3);
  EXPECT_LT(test::rel_error(dec2[1].data(), ref_dec2.data(), std::min(dec2[1].size(), ref_dec2.size())),
            1e-3);
  EXPECT_EQ(pred[1].sampled, pred[0].sampled);
  EXPECT_EQ(pred[1].argmax, pred[0].argmax);
  EXPECT_CLOSE_TO_CPU(pred[1].soft, pred[0].soft, 1e-4);
  EXPECT_CLOSE_TO_CPU(pred[1].entropy, pred[0].entropy, 1e-4);

  const ModelConfig& c = on_cpu->config();
  GenerateOptions o;
  o.mode = DecodeMode::Uniform;
  o.gen_length = 20;
  o.block_length = static_cast<int>(c.uniform.canvas);
  o.steps = c.uniform.steps;
  o.uniform = UniformSampling{c.uniform.t_min,     c.uniform.t_max,      c.uniform.entropy_bound,
                              c.uniform.stability, c.uniform.confidence, c.pad_id};
  o.eos_ids = c.uniform.eos_ids;
  o.seed = 3;
  const GenerateResult want = generate(*on_cpu, prompt, o);
  const GenerateResult got = generate(*on_gpu, prompt, o);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.forwards, want.forwards);
  auto bf = Engine::load(dir, cuda_engine_options(Precision::BF16));
  const GenerateResult b = generate(*bf, prompt, o);
  EXPECT_GT(b.forwards, 0);
  for (const int32_t t : b.tokens) EXPECT_TRUE(t >= 0 && t < V) << t;
}

}  // namespace
}  // namespace tessera
