// CUDA backend benchmark: the two ceilings first (bf16 GEMM TFLOP/s through cuBLASLt, device-to-device
// copy GB/s counting bytes read + written), then every op at dLLM shapes (LLaDA-8B: d 4096, ffn 12288,
// 32 heads x 128, vocab 126464; LLaDA-MoE: d 2048, 64 experts top-8, expert ffn 1024) as a fraction
// of the ceiling that bounds it. The library paths the backend takes by default (mask-only logits as
// gather tiles + cuBLASLt, attention through cuDNN) are timed beside tessera's own kernels on a second
// backend made with TESSERA_GATHER_GEMM=fused TESSERA_CUDNN=0, in the same run. Built only with
// TESSERA_CUDA.
// Usage: cuda_bench [--L 4096] [--json FILE] [--only SECTION]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

using namespace tessera;

namespace {

struct Buf {
  Backend* b;
  void* p;
  size_t n;
  Buf(Backend& be, size_t bytes) : b(&be), n(bytes) { p = b->alloc_weights(bytes); }
  ~Buf() { b->free_weights(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Tensor t(DType dt, std::initializer_list<int64_t> d) const { return Tensor(p, dt, d, Device::CUDA); }
};

// Fills a buffer with random values of the given dtype (never zeros: zeros run faster than data).
void fill_random(Backend& b, Buf& buf, DType dt, float scale, uint64_t seed) {
  const size_t n = buf.n / dtype_size(dt);
  const size_t slice = size_t{1} << 24;
  std::vector<float> f(std::min(n, slice));
  std::vector<char> c(f.size() * dtype_size(dt));
  for (size_t at = 0; at < n; at += slice) {
    const size_t m = std::min(slice, n - at);
    for (size_t i = 0; i < m; ++i) {
      f[i] = (static_cast<float>(rng_mix(seed + at + i) >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
    convert_from_f32(f.data(), c.data(), dt, m);
    b.copy_to_device(static_cast<char*>(buf.p) + at * dtype_size(dt), c.data(), m * dtype_size(dt));
  }
  b.synchronize();
}

void fill_ids(Backend& b, Buf& buf, int64_t n, int64_t hi, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>(rng_mix(seed + i) % hi);
  std::sort(v.begin(), v.end());
  b.copy_to_device(buf.p, v.data(), v.size() * 4);
  b.synchronize();
}

// Median over `reps` of the mean time of `inner` back-to-back launches (ms).
double time_ms(Backend& b, const std::function<void()>& f, int reps = 7, int inner = 3) {
  f();
  b.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    b.synchronize();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                inner);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string op, shape, bound;
  double ms, rate, frac;  // rate: TFLOP/s or GB/s
};
std::vector<Row> rows;
double g_tflops = 0, g_gbs = 0;

void add_compute(const std::string& op, const std::string& shape, double ms, double flops) {
  const double tf = flops / ms / 1e9;
  rows.push_back({op, shape, "compute", ms, tf, tf / g_tflops});
  std::printf("%-34s %-30s %9.3f ms %8.1f TFLOP/s %6.1f%%\n", op.c_str(), shape.c_str(), ms, tf,
              100 * tf / g_tflops);
}
void add_memory(const std::string& op, const std::string& shape, double ms, double bytes) {
  const double gbs = bytes / ms / 1e6;
  rows.push_back({op, shape, "memory", ms, gbs, gbs / g_gbs});
  std::printf("%-34s %-30s %9.3f ms %8.1f GB/s    %6.1f%%\n", op.c_str(), shape.c_str(), ms, gbs,
              100 * gbs / g_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t L = 4096;
  std::string json_path, only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--L") L = std::stoll(argv[i + 1]);
    if (k == "--json") json_path = argv[i + 1];
    if (k == "--only") only = argv[i + 1];  // gemm | logits | attention | memory | sample | moe
  }
  // --only takes one section or several, comma-separated (logits,attention).
  auto want = [&](const char* section) {
    return only.empty() || ("," + only + ",").find("," + std::string(section) + ",") != std::string::npos;
  };
  std::string why;
  auto be = make_cuda_backend(&why);
  if (!be) {
    std::fprintf(stderr, "cuda_bench: %s\n", why.c_str());
    return 1;
  }
  Backend& b = *be;
  std::printf("# %s\n", b.name().c_str());
  // tessera's own kernels, for the side-by-side rows (device buffers are shared: one device, one context).
  setenv("TESSERA_GATHER_GEMM", "fused", 1);
  setenv("TESSERA_CUDNN", "0", 1);
  auto be_ref = make_cuda_backend(&why);
  unsetenv("TESSERA_GATHER_GEMM");
  unsetenv("TESSERA_CUDNN");
  if (!be_ref) fail("cuda_bench: second backend: " + why);
  Backend& r = *be_ref;
  // ---- ceilings
  {
    const int64_t n = 8192;
    Buf a(b, n * n * 2), w(b, n * n * 2), c(b, n * n * 2);
    fill_random(b, a, DType::BF16, 1.0f, 1);
    fill_random(b, w, DType::BF16, 1.0f, 2);
    Tensor ta = a.t(DType::BF16, {n, n}), tw = w.t(DType::BF16, {n, n}), tc = c.t(DType::BF16, {n, n});
    const double ms = time_ms(
        b, [&] { b.gemm(ta, tw, nullptr, tc, false); }, 7, 5);
    g_tflops = 2.0 * n * n * n / ms / 1e9;
    const size_t bytes = size_t{2} << 30;
    Buf x(b, bytes), y(b, bytes);
    fill_random(b, x, DType::F32, 1.0f, 3);
    const double cms = time_ms(
        b,
        [&] {
          // cudaMemcpy device-to-device returns before the copy ends: wait for it.
          const cudaError_t e = cudaMemcpy(y.p, x.p, bytes, cudaMemcpyDeviceToDevice);
          if (e != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
            fail("device-to-device copy failed");
        },
        5, 3);
    g_gbs = 2.0 * static_cast<double>(bytes) / cms / 1e6;
    std::printf(
        "ceiling: bf16 GEMM 8192^3 (cuBLASLt) %.1f TFLOP/s; device-to-device copy %.0f GB/s (read + write)\n",
        g_tflops, g_gbs);
  }
  const int64_t D = 4096, F = 12288, H = 32, HD = 128, V = 126464;
  const std::string sL = "L=" + std::to_string(L);
  // ---- GEMMs of a LLaDA-8B layer
  if (want("gemm")) {
    Buf a(b, L * F * 2), w(b, F * D * 2), c(b, L * F * 4);
    fill_random(b, a, DType::BF16, 1.0f, 4);
    fill_random(b, w, DType::BF16, 0.02f, 5);
    Tensor ta = a.t(DType::BF16, {L, D}), tw = w.t(DType::BF16, {D, D}), tc = c.t(DType::F32, {L, D});
    add_compute("gemm q_proj bf16->f32", sL + " 4096x4096",
                time_ms(b, [&] { b.gemm(ta, tw, nullptr, tc, false); }), 2.0 * L * D * D);
    Tensor tw2 = w.t(DType::BF16, {F, D}), tc2 = c.t(DType::BF16, {L, F});
    add_compute("gemm ffn_gate bf16->bf16", sL + " 12288x4096",
                time_ms(b, [&] { b.gemm(ta, tw2, nullptr, tc2, false); }), 2.0 * L * F * D);
    Tensor ta3 = a.t(DType::BF16, {L, F}), tw3 = w.t(DType::BF16, {D, F}), tc3 = c.t(DType::F32, {L, D});
    add_compute("gemm ffn_down bf16->f32 (+=)", sL + " 4096x12288",
                time_ms(b, [&] { b.gemm(ta3, tw3, nullptr, tc3, true); }), 2.0 * L * F * D);
  }
  // ---- mask-only logits: gather-GEMM vs gather copy + cuBLASLt
  for (double ratio : {0.1, 0.5, 0.9}) {
    if (!want("logits")) break;
    const auto R = static_cast<int64_t>(static_cast<double>(L) * ratio);
    Buf h(b, L * D * 2), lm(b, V * D * 2), rws(b, R * 4), out(b, R * V * 4), gath(b, R * D * 2);
    fill_random(b, h, DType::BF16, 1.0f, 6);
    fill_random(b, lm, DType::BF16, 0.02f, 7);
    fill_ids(b, rws, R, L, 8);
    Tensor th = h.t(DType::BF16, {L, D}), tl = lm.t(DType::BF16, {V, D}), tr = rws.t(DType::I32, {R});
    Tensor to = out.t(DType::F32, {R, V}), tg = gath.t(DType::BF16, {R, D});
    const std::string shape = sL + " rows=" + std::to_string(R) + " V=126464";
    const double flops = 2.0 * R * V * D;
    const double ms_g = time_ms(
        r, [&] { r.gather_gemm(th, tr, tl, to); }, 5, 2);
    add_compute("gather_gemm fused kernel (before)", shape, ms_g, flops);
    const double ms_t = time_ms(
        b, [&] { b.gather_gemm(th, tr, tl, to); }, 5, 2);
    add_compute("gather_gemm tiles + cuBLASLt (now)", shape + " 8MiB tile", ms_t, flops);
    const double ms_c = time_ms(
        b,
        [&] {
          b.embed(tr, th, tg);  // the gathered copy [rows x 4096] bf16
          b.gemm(tg, tl, nullptr, to, false);
        },
        5, 2);
    add_compute("whole gathered copy + cuBLASLt", shape + " +" + std::to_string(R * D * 2 >> 20) + "MiB",
                ms_c, flops);
    std::printf("  tiles + cuBLASLt vs fused: %.2fx faster\n", ms_g / ms_t);
  }
  // ---- attention
  for (int64_t La : {L, 4 * L, 8 * L}) {
    if (!want("attention")) break;
    Buf q(b, La * D * 4), k(b, La * D * 4), v(b, La * D * 4), o(b, La * D * 2), pos(b, La * 4), cu(b, 8);
    fill_random(b, q, DType::F32, 1.0f, 9);
    fill_random(b, k, DType::F32, 1.0f, 10);
    fill_random(b, v, DType::F32, 1.0f, 11);
    std::vector<int32_t> pv(static_cast<size_t>(La));
    for (int64_t i = 0; i < La; ++i) pv[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    b.copy_to_device(pos.p, pv.data(), pv.size() * 4);
    const int32_t cuv[2] = {0, static_cast<int32_t>(La)};
    b.copy_to_device(cu.p, cuv, 8);
    AttnParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(HD));
    p.cu_q = p.cu_k = static_cast<const int32_t*>(cu.p);
    p.q_pos = p.k_pos = static_cast<const int32_t*>(pos.p);
    Tensor tq = q.t(DType::F32, {La, D}), tk = k.t(DType::F32, {La, D}), tv = v.t(DType::F32, {La, D});
    Tensor to = o.t(DType::BF16, {La, D});
    Buf scr(b, attn_kv_scratch_bytes(La, D)), qscr(b, attn_q_scratch_bytes(La, D)), o2(b, La * D * 2);
    p.kv_scratch = scr.p;
    p.q_scratch = qscr.p;
    const std::string shape = "L=" + std::to_string(La) + " 32x128 bidir";
    const double ms = time_ms(
        r, [&] { r.attention(tq, tk, tv, to, H, H, HD, p); }, 5, 1);
    add_compute("attention tessera flash (before)", shape, ms, 4.0 * La * La * D);
    Tensor to2 = o2.t(DType::BF16, {La, D});
    const double cms = time_ms(
        b, [&] { b.attention(tq, tk, tv, to2, H, H, HD, p); }, 5, 1);
    add_compute("attention default (cuDNN if loaded)", shape, cms, 4.0 * La * La * D);
    {  // the two outputs side by side (bf16): the largest difference over the first 4096 rows
      const int64_t n = std::min<int64_t>(La, 4096) * D;
      std::vector<uint16_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      b.copy_to_host(x.data(), o.p, x.size() * 2);
      b.copy_to_host(y.data(), o2.p, y.size() * 2);
      double md = 0, mx = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double u = bf16_to_f32(x[i]), w = bf16_to_f32(y[i]);
        md = std::max(md, std::fabs(u - w));
        mx = std::max(mx, std::fabs(u));
      }
      std::printf("  default vs flash: %.2fx faster; max |diff| %.3g (max |out| %.3g)\n", ms / cms, md, mx);
    }
    // Block-sparse at 30% density with 128-blocks.
    const int64_t nb = (La + 127) / 128;
    std::vector<uint8_t> mask(static_cast<size_t>(H * nb * nb));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = rng_mix(i + 99) % 10 < 3 ? 1 : 0;
    Buf bm(b, mask.size());
    b.copy_to_device(bm.p, mask.data(), mask.size());
    AttnParams sp = p;
    sp.block_mask = static_cast<const uint8_t*>(bm.p);
    sp.sparse_block = 128;
    const double sms = time_ms(
        b, [&] { b.attention(tq, tk, tv, to, H, H, HD, sp); }, 5, 1);
    add_compute("attention block-sparse 30% (eff.)", shape, sms, 0.3 * 4.0 * La * La * D);
    std::printf("  block-sparse 30%% vs dense: %.2fx faster\n", ms / sms);
  }
  // ---- memory-bound ops
  if (want("memory")) {
    Buf x(b, L * F * 4), y(b, L * F * 2), z(b, L * F * 2), w(b, D * 2), pos(b, L * 4);
    fill_random(b, x, DType::F32, 1.0f, 12);
    fill_random(b, y, DType::BF16, 1.0f, 13);
    fill_random(b, z, DType::BF16, 1.0f, 14);
    fill_random(b, w, DType::BF16, 1.0f, 15);
    fill_ids(b, pos, L, 4096, 16);
    Tensor tx = x.t(DType::F32, {L, D}), tw = w.t(DType::BF16, {D}), ty = y.t(DType::BF16, {L, D});
    add_memory("rmsnorm f32->bf16", sL + " d=4096",
               time_ms(
                   b, [&] { b.rmsnorm(tx, tw, 1e-5f, ty); }, 7, 10),
               static_cast<double>(L * D) * 6);
    Tensor tp = pos.t(DType::I32, {L});
    add_memory("rope (q, in place)", sL + " 32x128",
               time_ms(
                   b, [&] { b.rope(tx, tp, 128, RopeParams{.rotary_dim = 128, .theta = 5e5f}); }, 7, 10),
               static_cast<double>(L * D) * 8);
    Tensor g = y.t(DType::BF16, {L, F}), u = z.t(DType::BF16, {L, F});
    add_memory("swiglu bf16", sL + " ffn=12288",
               time_ms(
                   b, [&] { b.swiglu(g, u, g); }, 7, 10),
               static_cast<double>(L * F) * 6);
  }
  // ---- sampling on the device
  if (want("sample")) {
    const int64_t R = L / 2;
    Buf lg(b, R * V * 4), keys(b, R * 4), tok(b, R * 4), conf(b, R * 4);
    fill_random(b, lg, DType::F32, 4.0f, 17);
    fill_ids(b, keys, R, 1 << 20, 18);
    Tensor tl = lg.t(DType::F32, {R, V}), tk = keys.t(DType::I32, {R}), tt = tok.t(DType::I32, {R});
    Tensor tc = conf.t(DType::F32, {R});
    SampleParams sp;
    add_memory("sample_rows argmax+prob (2 passes)", "rows=" + std::to_string(R) + " V=126464",
               time_ms(b, [&] { b.sample_rows(tl, tk, sp, tt, tc); }), static_cast<double>(R * V) * 4 * 2);
    sp.temperature = 1.0f;
    sp.gumbel = true;
    add_memory("sample_rows gumbel T=1 (3 passes)", "rows=" + std::to_string(R) + " V=126464",
               time_ms(b, [&] { b.sample_rows(tl, tk, sp, tt, tc); }), static_cast<double>(R * V) * 4 * 3);
  }
  // ---- MoE (LLaDA-MoE geometry)
  if (want("moe")) {
    const int64_t Dm = 2048, Fm = 1024, E = 64, K = 8;
    std::vector<Buf*> experts;
    std::vector<const void*> table(static_cast<size_t>(3 * E));
    for (int64_t e = 0; e < 3 * E; ++e) {
      experts.push_back(new Buf(b, Dm * Fm * 2));
      fill_random(b, *experts.back(), DType::BF16, 0.02f, 100 + static_cast<uint64_t>(e));
      table[static_cast<size_t>(e)] = experts.back()->p;
    }
    Buf tab(b, table.size() * sizeof(void*));
    b.copy_to_device(tab.p, table.data(), table.size() * sizeof(void*));
    MoeExperts ex;
    ex.table = static_cast<const void* const*>(tab.p);
    ex.n_experts = static_cast<int>(E);
    ex.hidden = Dm;
    ex.inter = Fm;
    Buf x(b, L * Dm * 2), lg(b, L * E * 4), ids(b, L * K * 4), wt(b, L * K * 4), out(b, L * Dm * 4),
        scr(b, moe_scratch_bytes(L, static_cast<int>(K), ex));
    fill_random(b, x, DType::BF16, 1.0f, 19);
    fill_random(b, lg, DType::F32, 2.0f, 20);
    fill_random(b, out, DType::F32, 1.0f, 21);
    MoeRouteParams rp;
    rp.top_k = static_cast<int>(K);
    Tensor tlg = lg.t(DType::F32, {L, E}), tid = ids.t(DType::I32, {L, K}), twt = wt.t(DType::F32, {L, K});
    b.moe_route(tlg, rp, tid, twt);
    Tensor tx = x.t(DType::BF16, {L, Dm}), tout = out.t(DType::F32, {L, Dm});
    Tensor ts = scr.t(DType::BF16, {static_cast<int64_t>(scr.n / 2)});
    add_compute("moe_ffn 64 experts top-8 (active)", sL + " d=2048 f=1024",
                time_ms(b, [&] { b.moe_ffn(tx, tid, twt, ex, ts, tout); }), 2.0 * L * K * 3 * Dm * Fm);
    add_memory("moe_route softmax top-8", sL + " E=64",
               time_ms(
                   b, [&] { b.moe_route(tlg, rp, tid, twt); }, 7, 10),
               static_cast<double>(L * E) * 4);
    for (Buf* e : experts) delete e;
  }
  if (!json_path.empty()) {
    std::ostringstream js;
    js << "{\"device\":\"" << b.name() << "\",\"gemm_tflops\":" << g_tflops << ",\"d2d_gbs\":" << g_gbs
       << ",\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      js << (i ? "," : "") << "{\"op\":\"" << rows[i].op << "\",\"shape\":\"" << rows[i].shape
         << "\",\"bound\":\"" << rows[i].bound << "\",\"ms\":" << rows[i].ms << ",\"rate\":" << rows[i].rate
         << ",\"fraction\":" << rows[i].frac << "}";
    }
    js << "]}\n";
    std::ofstream(json_path) << js.str();
  }
  return 0;
}
