// Hand-written GEMMs for what cuBLAS cannot do: the mask-only logits gather-GEMM (rows of A read by
// index straight into shared memory) and the grouped GEMM of MoE experts (per-group weights, group
// sizes known only on the device).
//
// Tensor-core kernel: 128 x 128 x 32 tiles, 8 warps (2 x 4, 64 x 32 each), mma.sync m16n8k16 bf16
// with f32 accumulators, ldmatrix from XOR-swizzled shared memory, a 4-stage cp.async pipeline, and
// grouped tile rasterisation (GROUP_M) so that neighbouring blocks share A and W tiles in L2.
// The SIMT kernel (any dtype, any K) is the fallback and the in-backend reference.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/mma.h"

namespace tessera::cuda {
namespace {

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4, THREADS = 256, GROUP_M = 8;
constexpr int kStageElems = (BM + BN) * BK;  // bf16 elements per stage (A then B)
constexpr int kSmemBytes = STAGES * kStageElems * 2;

// Swizzled offset (in bf16 elements) of 16-byte chunk `ch` (0..3) of tile row `row` (64-byte rows):
// conflict-free for both the cp.async stores and the 8-row ldmatrix reads.
__device__ __forceinline__ int swz(int row, int ch) {
  return row * BK + ((ch ^ ((row >> 1) & 3)) << 3);
}

// Which (group, m-tile, n-tile) this block computes; false when the block has no work.
struct TileCoord {
  int group;
  int64_t row0, row_end, col0;
};
// Grouped problems: m-tile `slot` (of `tile` rows) counted over the groups in order -> its group and rows.
__device__ bool group_slot(const MmaProblem& p, int64_t slot, int tile, TileCoord& t) {
  for (int g = 0; g < p.groups; ++g) {
    const int64_t a = p.group_offsets[g], b = p.group_offsets[g + 1];
    const int64_t tiles = (b - a + tile - 1) / tile;
    if (slot < tiles) {
      t.group = g;
      t.row0 = a + slot * tile;
      t.row_end = b;
      return true;
    }
    slot -= tiles;
  }
  return false;
}
__device__ bool tile_coord(const MmaProblem& p, TileCoord& t) {
  const int64_t n_tiles = ceil_div_dev(p.n, BN);
  if (p.group_offsets == nullptr) {
    // Grouped rasterisation over a 1-D grid.
    const int64_t m_tiles = ceil_div_dev(p.m, BM);
    const int64_t pid = blockIdx.x;
    const int64_t per_group = GROUP_M * n_tiles;
    const int64_t first_m = (pid / per_group) * GROUP_M;
    const int64_t gsize = m_tiles - first_m < GROUP_M ? m_tiles - first_m : GROUP_M;
    const int64_t pm = first_m + (pid % per_group) % gsize;
    const int64_t pn = (pid % per_group) / gsize;
    t.group = 0;
    t.row0 = pm * BM;
    t.row_end = p.m;
    t.col0 = pn * BN;
    return t.row0 < p.m;
  }
  // Grouped problem: blockIdx.y enumerates the m-tiles of all groups in order.
  t.col0 = static_cast<int64_t>(blockIdx.x) * BN;
  return group_slot(p, blockIdx.y, BM, t);
}

__global__ void __launch_bounds__(THREADS) mma_kernel(const MmaProblem p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  TileCoord tc;
  if (!tile_coord(p, tc)) return;
  const auto* A = static_cast<const __nv_bfloat16*>(p.a);
  const auto* W = static_cast<const __nv_bfloat16*>(p.w_table != nullptr ? p.w_table[tc.group] : p.w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64, cols wn*32

  // This thread copies chunk (tid & 3) of tile rows (tid >> 2) and (tid >> 2) + 64, for A and W.
  const int ch = tid & 3;
  const __nv_bfloat16* a_src[2];
  const __nv_bfloat16* w_src[2];
  bool a_ok[2], w_ok[2];
  for (int i = 0; i < 2; ++i) {
    const int row = (tid >> 2) + 64 * i;
    const int64_t r = tc.row0 + row;
    a_ok[i] = r < tc.row_end;
    const int64_t ar = a_ok[i] ? (p.a_rows != nullptr ? p.a_rows[r] : r) : 0;
    a_src[i] = A + ar * p.lda + ch * 8;
    const int64_t n = tc.col0 + row;
    w_ok[i] = n < p.n;
    w_src[i] = W + (w_ok[i] ? n : 0) * p.k + ch * 8;
  }
  const int64_t k_tiles = ceil_div_dev(p.k, BK);
  auto load_stage = [&](int stage, int64_t kt) {
    __nv_bfloat16* sa = smem + stage * kStageElems;
    __nv_bfloat16* sb = sa + BM * BK;
    const int64_t k0 = kt * BK + ch * 8;
    const int kb = k0 < p.k ? 16 : 0;  // K is a multiple of 8: a chunk is all in or all out
    for (int i = 0; i < 2; ++i) {
      const int row = (tid >> 2) + 64 * i;
      cp_async16(sa + swz(row, ch), a_ok[i] && kb ? a_src[i] + kt * BK : A, a_ok[i] ? kb : 0);
      cp_async16(sb + swz(row, ch), w_ok[i] && kb ? w_src[i] + kt * BK : W, w_ok[i] ? kb : 0);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int64_t next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(static_cast<int>(next % STAGES), next);
    cp_async_commit();
    const __nv_bfloat16* sa = smem + static_cast<int>(kt % STAGES) * kStageElems;
    const __nv_bfloat16* sb = sa + BM * BK;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {  // two k16 steps per BK = 32
      unsigned af[4][4], bfr[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = wm * 64 + i * 16 + (lane & 15);
        ldmatrix_x4(af[i], sa + swz(row, kk * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = wn * 32 + j * 16 + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(bfr[j], sb + swz(row, kk * 2 + ((lane >> 3) & 1)));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[i][j], af[i], &bfr[j >> 1][(j & 1) * 2]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulators straight to C (f32 or bf16), bounds-checked.
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = tc.row0 + wm * 64 + i * 16 + g + half * 8;
      if (r >= tc.row_end) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t cidx = tc.col0 + wn * 32 + j * 8 + t4 * 2;
        const float v0 = acc[i][j][half * 2], v1 = acc[i][j][half * 2 + 1];
        if (p.c_dtype == DType::F32) {
          float* c = static_cast<float*>(p.c) + r * p.ldc + cidx;
          if (cidx + 1 < p.n) {
            *reinterpret_cast<float2*>(c) = make_float2(v0, v1);
          } else if (cidx < p.n) {
            c[0] = v0;
          }
        } else {
          __nv_bfloat16* c = static_cast<__nv_bfloat16*>(p.c) + r * p.ldc + cidx;
          if (cidx + 1 < p.n) {
            *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(v0, v1);
          } else if (cidx < p.n) {
            c[0] = __float2bfloat16_rn(v0);
          }
        }
      }
    }
  }
}

// SIMT fallback: 64 x 64 tiles, 256 threads, 4 x 4 outputs per thread, operands of any float dtype.
constexpr int SB = 64, SK = 16;
__global__ void __launch_bounds__(256) simt_kernel(const MmaProblem p) {
  __shared__ float sa[SK][SB + 1];
  __shared__ float sw[SK][SB + 1];
  TileCoord tc;
  tc.col0 = static_cast<int64_t>(blockIdx.x) * SB;
  if (p.group_offsets == nullptr) {
    tc.group = 0;
    tc.row0 = static_cast<int64_t>(blockIdx.y) * SB;
    tc.row_end = p.m;
    if (tc.row0 >= p.m) return;
  } else if (!group_slot(p, blockIdx.y, SB, tc)) {
    return;
  }
  const void* W = p.w_table != nullptr ? p.w_table[tc.group] : p.w;
  const int ad = p.a_dtype == DType::F32 ? 0 : (p.a_dtype == DType::BF16 ? 1 : 2);
  const int wd = p.w_dtype == DType::F32 ? 0 : (p.w_dtype == DType::BF16 ? 1 : 2);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += SK) {
    for (int e = threadIdx.x; e < SB * SK; e += 256) {
      const int row = e / SK, kk = e % SK;
      const int64_t r = tc.row0 + row, k = k0 + kk;
      float va = 0.0f, vw = 0.0f;
      if (r < tc.row_end && k < p.k) {
        const int64_t ar = p.a_rows != nullptr ? p.a_rows[r] : r;
        va = load_any(p.a, ad, ar * p.lda + k);
      }
      const int64_t n = tc.col0 + row;
      if (n < p.n && k < p.k) vw = load_any(W, wd, n * p.k + k);
      sa[kk][row] = va;
      sw[kk][row] = vw;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < SK; ++kk) {
      float a[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = sa[kk][ty * 4 + i];
        w[i] = sw[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], w[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t r = tc.row0 + ty * 4 + i;
    if (r >= tc.row_end) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t n = tc.col0 + tx * 4 + j;
      if (n >= p.n) continue;
      if (p.c_dtype == DType::F32) {
        static_cast<float*>(p.c)[r * p.ldc + n] = acc[i][j];
      } else {
        static_cast<__nv_bfloat16*>(p.c)[r * p.ldc + n] = __float2bfloat16_rn(acc[i][j]);
      }
    }
  }
}

}  // namespace

bool mma_supported(const MmaProblem& p) {
  auto aligned16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  return p.a_dtype == DType::BF16 && p.w_dtype == DType::BF16 && p.k % 8 == 0 && p.lda % 8 == 0 &&
         aligned16(p.a) && (p.w_table != nullptr || aligned16(p.w)) && p.ldc % 2 == 0 &&
         (p.c_dtype == DType::F32 || p.c_dtype == DType::BF16);
}

void mma_gemm(const MmaProblem& p, cudaStream_t s) {
  if (p.m == 0 || p.n == 0) return;
  if (!mma_supported(p)) {
    simt_gemm(p, s);
    return;
  }
  static bool attr_set = false;
  if (!attr_set) {
    check(cudaFuncSetAttribute(mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
          "gather_gemm: shared memory limit");
    attr_set = true;
  }
  const int64_t n_tiles = ceil_div(p.n, BN);
  if (p.group_offsets == nullptr) {
    const int64_t blocks = ceil_div(p.m, BM) * n_tiles;
    TESSERA_CHECK(blocks < (int64_t{1} << 31), "gather_gemm: problem too large");
    mma_kernel<<<static_cast<unsigned>(blocks), THREADS, kSmemBytes, s>>>(p);
  } else {
    const int64_t slots = ceil_div(p.m, BM) + p.groups;
    TESSERA_CHECK(slots < 65536 && n_tiles < (int64_t{1} << 31), "grouped gemm: problem too large");
    mma_kernel<<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(slots)), THREADS, kSmemBytes,
                 s>>>(p);
  }
  check_launch("mma_kernel");
}

void simt_gemm(const MmaProblem& p, cudaStream_t s) {
  if (p.m == 0 || p.n == 0) return;
  const int64_t slots = ceil_div(p.m, SB) + (p.group_offsets != nullptr ? p.groups : 0);
  TESSERA_CHECK(slots < 65536, "gemm (simt): too many rows");
  simt_kernel<<<dim3(static_cast<unsigned>(ceil_div(p.n, SB)), static_cast<unsigned>(slots)), 256, 0, s>>>(p);
  check_launch("simt_kernel");
}

}  // namespace tessera::cuda
