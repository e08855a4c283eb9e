// Row-wise CPU kernels: embedding lookup, RMSNorm, RoPE, SwiGLU, row scatter (KV cache writes).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/simd.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

inline float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
  }
  return 0.0f;
}

// 1 / sqrt(mean(x^2) + eps) of one group of x.
inline float inv_rms(const float* x, int64_t group, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < group; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / static_cast<float>(group) + eps);
}

}  // namespace

void embed(const Tensor& tokens, const Tensor& table, Tensor& out) {
  check_embed(tokens, table, out);
  const int64_t n = tokens.numel(), d = table.cols(), v = table.rows();
  const auto* ids = tokens.as<const int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0 || ids[r] >= v) {
      fail("embed: token id " + std::to_string(ids[r]) + " is outside the vocabulary of " +
           std::to_string(v));
    }
  }
  const size_t row_bytes = table.row_bytes();
#pragma omp parallel for
  for (int64_t r = 0; r < n; ++r) {
    const char* src = static_cast<const char*>(table.data) + static_cast<size_t>(ids[r]) * row_bytes;
    if (table.quantized()) {  // a quantized GGUF table: the row converted to f32 or bf16
      ggml_dequantize_row(static_cast<GgmlType>(table.quant), src, d, out.dtype,
                          static_cast<char*>(out.data) + static_cast<size_t>(r * d) * dtype_size(out.dtype));
    } else if (out.dtype == DType::F32) {
      convert_to_f32(src, table.dtype, out.as<float>() + r * d, static_cast<size_t>(d));
    } else if (out.dtype == table.dtype) {
      std::memcpy(static_cast<char*>(out.data) + static_cast<size_t>(r * d) * dtype_size(out.dtype), src,
                  static_cast<size_t>(d) * dtype_size(out.dtype));
    } else {
      fail("embed: unsupported output dtype");
    }
  }
}

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  using namespace simd;
  check_rmsnorm(x, w, y);
  const int64_t group = w.numel();
  const int64_t n = x.numel() / group;
  const bool to_bf16 = y.dtype == DType::BF16;
  // The weight in f32 once (rows of up to kMaxGroup; longer ones read it element by element).
  constexpr int64_t kMaxGroup = 16384;
  alignas(64) float wf[kMaxGroup];
  const bool staged = group <= kMaxGroup;
  if (staged) {
    for (int64_t i = 0; i < group; ++i) wf[i] = load(w.data, w.dtype, i);
  }
  const int64_t whole = staged ? group / kW * kW : 0;  // vectorised columns
  const auto* xs = x.as<const float>();
#pragma omp parallel for if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xs + r * group;
    const float inv = inv_rms(xr, group, eps);
    auto weight = [&](int64_t i) { return staged ? wf[i] : load(w.data, w.dtype, i); };
    if (to_bf16) {
      auto* yr = y.as<uint16_t>() + r * group;
      for (int64_t i = 0; i < whole; i += kW)
        store_bf16(yr + i, simd::round_bf16(simd::load(xr + i) * inv) * simd::load(wf + i));
      for (int64_t i = whole; i < group; ++i)
        yr[i] = f32_to_bf16(tessera::round_bf16(xr[i] * inv) * weight(i));
    } else {
      float* yr = y.as<float>() + r * group;
      for (int64_t i = 0; i < whole; i += kW)
        simd::store(yr + i, simd::load(xr + i) * inv * simd::load(wf + i));
      for (int64_t i = whole; i < group; ++i) yr[i] = xr[i] * inv * weight(i);
    }
  }
}

void rope(Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p, RopeTable* table) {
  check_rope(x, positions, head_dim, p);
  const int64_t n = x.rows();
  const int64_t heads = x.cols() / head_dim;
  const int half = p.rotary_dim / 2;
  const int offset = p.pair_offset > 0 ? p.pair_offset : half;  // proportional RoPE: (i, i + head_dim / 2)
  const bool neox = p.neox;
  float inv_freq[512];
  TESSERA_CHECK(half <= 512, "rope: head_dim too large");
  for (int i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(p, i);
  const auto* pos = positions.as<const int32_t>();
  float* xs = x.as<float>();
  // The angles' cosines and sines of a row, scaled by attn_factor (the same expressions with or without
  // the table, so the same bits).
  auto angles = [&](int64_t r, float* cs, float* sn) {
    for (int i = 0; i < half; ++i) {
      const float ang = static_cast<float>(pos[r]) * inv_freq[i];
      cs[i] = std::cos(ang) * p.attn_factor;
      sn[i] = std::sin(ang) * p.attn_factor;
    }
  };
  const size_t nh = static_cast<size_t>(n) * static_cast<size_t>(half);
  const bool cached = table != nullptr && table->pos.size() == static_cast<size_t>(n) &&
                      table->inv_freq.size() == static_cast<size_t>(half) &&
                      table->attn_factor == p.attn_factor &&
                      std::memcmp(table->pos.data(), pos, static_cast<size_t>(n) * 4) == 0 &&
                      std::memcmp(table->inv_freq.data(), inv_freq, static_cast<size_t>(half) * 4) == 0;
  if (table != nullptr && !cached) {
    table->pos.assign(pos, pos + n);
    table->inv_freq.assign(inv_freq, inv_freq + half);
    table->attn_factor = p.attn_factor;
    table->cs.resize(nh);
    table->sn.resize(nh);
#pragma omp parallel for if (n > 8)
    for (int64_t r = 0; r < n; ++r) angles(r, table->cs.data() + r * half, table->sn.data() + r * half);
  }
#pragma omp parallel for if (n > 8)
  for (int64_t r = 0; r < n; ++r) {
    float cs_row[512], sn_row[512];
    const float* cs = cs_row;
    const float* sn = sn_row;
    if (table != nullptr) {
      cs = table->cs.data() + r * half;
      sn = table->sn.data() + r * half;
    } else {
      angles(r, cs_row, sn_row);
    }
    const float scale = rope_pos_scale(p, pos[r]);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xs + r * x.cols() + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + offset : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[i] - x1 * sn[i];
        v[b] = x1 * cs[i] + x0 * sn[i];
      }
      if (scale != 1.0f)
        for (int d = 0; d < head_dim; ++d) v[d] *= scale;
    }
  }
}

// silu(g) * u with e^-g from simd::exp (within 2 ulp of std::exp) on whole vectors, std::exp on the tail.
namespace {

// body(i) for i in [0, n): over the threads where `parallel` and the work is worth a region.
template <typename Body>
void for_range(int64_t n, bool parallel, Body&& body) {
  if (parallel) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

void swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out, bool parallel) {
  using namespace simd;
  check_swiglu(gate, up, out);
  const int64_t n = gate.numel();
  const int64_t nv = n / kW;  // whole vectors
  parallel = parallel && n > 65536;
  if (gate.dtype == DType::F32) {
    const float* g = gate.as<const float>();
    const float* u = up.as<const float>();
    float* o = out.as<float>();
    for_range(nv, parallel, [&](int64_t b) {
      const vf gv = simd::load(g + b * kW);
      simd::store(o + b * kW, gv / (1.0f + simd::exp(-gv)) * simd::load(u + b * kW));
    });
    for (int64_t i = nv * kW; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return;
  }
  const auto* g = gate.as<const uint16_t>();
  const auto* u = up.as<const uint16_t>();
  auto* o = out.as<uint16_t>();
  // HF bf16: silu(g) is rounded to bf16 before the multiply.
  for_range(nv, parallel, [&](int64_t b) {
    const vf gv = load_bf16(g + b * kW);
    store_bf16(o + b * kW, simd::round_bf16(gv / (1.0f + simd::exp(-gv))) * load_bf16(u + b * kW));
  });
  for (int64_t i = nv * kW; i < n; ++i) {
    const float gv = bf16_to_f32(g[i]);
    o[i] = f32_to_bf16(tessera::round_bf16(gv / (1.0f + std::exp(-gv))) * bf16_to_f32(u[i]));
  }
}

}  // namespace

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  swiglu_impl(gate, up, out, true);
}
void swiglu_serial(const Tensor& gate, const Tensor& up, Tensor& out) {
  swiglu_impl(gate, up, out, false);
}

void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate, Tensor& y) {
  check_rmsnorm_ex(x, w, group, accumulate, y);
  const int64_t n = x.numel() / group;
  const auto* xs = x.as<const float>();
  const bool to_bf16 = y.dtype == DType::BF16;
#pragma omp parallel for if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xs + r * group;
    const float inv = inv_rms(xr, group, eps);
    for (int64_t i = 0; i < group; ++i) {
      const float wi = w != nullptr ? load(w->data, w->dtype, i) : 1.0f;
      if (to_bf16) {
        y.as<uint16_t>()[r * group + i] = f32_to_bf16(tessera::round_bf16(xr[i] * inv) * wi);
      } else if (accumulate) {
        y.as<float>()[r * group + i] += xr[i] * inv * wi;
      } else {
        y.as<float>()[r * group + i] = xr[i] * inv * wi;
      }
    }
  }
}

namespace {
// gelu with the tanh approximation (PyTorch's gelu(approximate="tanh"), Hugging Face's gelu_pytorch_tanh).
inline float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}
}  // namespace

// gelu_tanh(g) * u; bf16 as swiglu: the activation rounded to bf16 before the multiply (HF).
namespace {
void geglu_impl(const Tensor& gate, const Tensor& up, Tensor& out, bool parallel) {
  check_swiglu(gate, up, out);
  const int64_t n = gate.numel();
  parallel = parallel && n > 65536;
  if (gate.dtype == DType::F32) {
    const float* g = gate.as<const float>();
    const float* u = up.as<const float>();
    float* o = out.as<float>();
    for_range(n, parallel, [&](int64_t i) { o[i] = gelu_tanh(g[i]) * u[i]; });
    return;
  }
  const auto* g = gate.as<const uint16_t>();
  const auto* u = up.as<const uint16_t>();
  auto* o = out.as<uint16_t>();
  for_range(n, parallel, [&](int64_t i) {
    o[i] = f32_to_bf16(tessera::round_bf16(gelu_tanh(bf16_to_f32(g[i]))) * bf16_to_f32(u[i]));
  });
}
}  // namespace

void geglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  geglu_impl(gate, up, out, true);
}
void geglu_serial(const Tensor& gate, const Tensor& up, Tensor& out) {
  geglu_impl(gate, up, out, false);
}

void scale(Tensor& x, float s) {
  check_scale(x, "scale");
  float* v = x.as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > (int64_t{1} << 18))
  for (int64_t i = 0; i < n; ++i) v[i] *= s;
}

void softcap(Tensor& x, float cap) {
  check_scale(x, "softcap");
  TESSERA_CHECK(cap > 0.0f, "softcap: the cap must be positive");
  float* v = x.as<float>();
  const int64_t n = x.numel();
  const float inv = 1.0f / cap;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) v[i] = cap * std::tanh(v[i] * inv);
}

void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  check_scatter_rows(src, rows, dst);
  const bool round = src.dtype == DType::F32 && dst.dtype == DType::BF16;
  const int32_t* idx = rows.as<const int32_t>();
  for (int64_t i = 0; i < src.rows(); ++i) {
    TESSERA_CHECK(idx[i] >= 0 && idx[i] < dst.rows(), "scatter_rows: row index " + std::to_string(idx[i]) +
                                                          " is outside the destination's " +
                                                          std::to_string(dst.rows()) + " rows");
  }
  const int64_t cols = src.cols();
  if (round) {
    const float* s = src.as<const float>();
    auto* d = dst.as<uint16_t>();
#pragma omp parallel for if (src.rows() * cols > (int64_t{1} << 18))
    for (int64_t i = 0; i < src.rows(); ++i) {
      for (int64_t c = 0; c < cols; ++c)
        d[static_cast<int64_t>(idx[i]) * cols + c] = f32_to_bf16(s[i * cols + c]);
    }
    return;
  }
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(src.dtype);
#pragma omp parallel for if (static_cast <size_t>(src.rows()) * row_bytes > (size_t{1} << 20))
  for (int64_t i = 0; i < src.rows(); ++i) {
    std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(idx[i]) * row_bytes,
                static_cast<const char*>(src.data) + static_cast<size_t>(i) * row_bytes, row_bytes);
  }
}

void convert(const Tensor& src, Tensor& dst) {
  check_convert(src, dst);
  const int64_t n = src.numel();
  if (src.dtype == dst.dtype) {
    std::memcpy(dst.data, src.data, src.nbytes());
    return;
  }
  if (src.dtype == DType::BF16 && dst.dtype == DType::F32) {
    const auto* s = src.as<const uint16_t>();
    float* d = dst.as<float>();
#pragma omp parallel for simd if (n > (int64_t{1} << 18))
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  const float* s = src.as<const float>();  // f32 -> bf16
  auto* d = dst.as<uint16_t>();
#pragma omp parallel for simd if (n > (int64_t{1} << 18))
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}

void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  check_gather_rows(src, rows, dst);
  const bool widen = src.dtype == DType::BF16 && dst.dtype == DType::F32;
  const int32_t* idx = rows.as<const int32_t>();
  for (int64_t i = 0; i < dst.rows(); ++i) {
    TESSERA_CHECK(idx[i] >= 0 && idx[i] < src.rows(), "gather_rows: row index " + std::to_string(idx[i]) +
                                                          " is outside the source's " +
                                                          std::to_string(src.rows()) + " rows");
  }
  const int64_t cols = dst.cols();
  if (widen) {
    const auto* s = src.as<const uint16_t>();
    float* d = dst.as<float>();
#pragma omp parallel for if (dst.rows() * cols > (int64_t{1} << 18))
    for (int64_t i = 0; i < dst.rows(); ++i) {
      const uint16_t* r = s + static_cast<int64_t>(idx[i]) * cols;
      for (int64_t c = 0; c < cols; ++c) d[i * cols + c] = bf16_to_f32(r[c]);
    }
    return;
  }
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dst.dtype);
#pragma omp parallel for if (static_cast <size_t>(dst.rows()) * row_bytes > (size_t{1} << 20))
  for (int64_t i = 0; i < dst.rows(); ++i) {
    std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(i) * row_bytes,
                static_cast<const char*>(src.data) + static_cast<size_t>(idx[i]) * row_bytes, row_bytes);
  }
}

}  // namespace tessera::cpu
