#include "engine/executor.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "engine/vocab_parallel.h"

namespace tessera {

using graph::OpKind;

Tensor tensor_view(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int id,
                   bool chunked, int loop, int64_t chunk) {
  const graph::TensorDecl& d = g.tensors()[static_cast<size_t>(id)];
  if (d.kind == graph::TensorKind::Weight) return d.weight;
  const graph::InstTensor& t = p.tensors[static_cast<size_t>(id)];
  char* ptr = c.base + t.offset;
  if (d.kind == graph::TensorKind::State) {
    TESSERA_CHECK(c.state != nullptr && static_cast<size_t>(id) < c.state->size() &&
                      (*c.state)[static_cast<size_t>(id)] != nullptr,
                  "execute: no memory bound for the state tensor " + d.full_name());
    ptr = (*c.state)[static_cast<size_t>(id)];
  }
  // State tensors hold every request's rows (the KV cache pool), not the step's.
  int64_t rows = d.kind == graph::TensorKind::State && c.state_rows > 0 ? c.state_rows : t.rows;
  if (loop >= 0) {
    const graph::Program::Loop& L = p.loops[static_cast<size_t>(loop)];
    const int64_t row0 = chunk * L.chunk_rows;
    const int64_t here = std::min(L.chunk_rows, L.total - row0);
    if (chunked) {
      ptr += static_cast<size_t>(row0 * d.cols) * dtype_size(d.dtype);
      rows = here;
    } else if (d.rows == g.loops()[static_cast<size_t>(loop)].chunk_rows) {
      rows = here;  // a per-chunk tensor: the last chunk may be short
    }
  }
  Tensor v;
  v.data = ptr;
  v.dtype = d.dtype;
  v.device = c.backend->device();
  v.ndim = 2;
  v.shape[0] = rows;
  v.shape[1] = d.cols;
  return v;
}

void MoeTraffic::add(std::span<const int32_t> ids, int64_t k, int64_t n_experts, int64_t first_row) {
  const auto m = static_cast<int64_t>(ids.size()) / k;
  ++calls;
  rows += m;
  pairs += m * k;
  for (size_t i = 0; i < kRanks.size(); ++i) {
    const int64_t n = kRanks[i];
    if (n_experts % n != 0) continue;
    std::array<int64_t, 8> load{};
    for (int64_t r = 0; r < m; ++r) {
      uint32_t hit = 0;  // ranks holding one of the row's experts (n <= 8)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[static_cast<size_t>(r * k + j)];
        if (e < 0 || e >= n_experts) continue;  // (moe_ffn refuses such an id with its error)
        const auto rank = static_cast<size_t>(e / (n_experts / n));
        hit |= 1u << rank;
        ++load[rank];
      }
      const auto owner = static_cast<uint32_t>((first_row + r) % n);
      touched[i] += std::popcount(hit);
      sent_rows[i] += std::popcount(hit & ~(1u << owner));
    }
    busiest[i] += *std::max_element(load.begin(), load.end());
  }
}

namespace {

void dump(const graph::GraphTemplate& g, const ExecContext& c, int id, const Tensor& t, int64_t chunk) {
  std::vector<char> host(t.nbytes());
  c.backend->copy_to_host(host.data(), t.data, host.size());
  std::string name = g.tensors()[static_cast<size_t>(id)].full_name();
  if (chunk > 0) name += ".chunk" + std::to_string(chunk);
  std::ofstream f(c.dump_dir + "/" + name + ".bin", std::ios::binary);
  f.write(host.data(), static_cast<std::streamsize>(host.size()));
}

// Which part of DES a MoeRoute call does (see DesExec).
enum class DesPass : uint8_t { Both, VoteOnly, ApplyOnly };

void run_op_untimed(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int oi,
                    int64_t chunk, DesPass pass);

// The multiply-adds (x 2) of a GEMM, a gather-GEMM (the selected rows), the routed experts (the pairs
// on this rank's experts) or an attention op (every query row against every key row of its sequence: the
// dense count, which a causal or sparse mask lowers); 0 for the other ops. --profile's rates (tessera bench)
// divide these by the ops' seconds.
double op_flop_count(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int oi,
                     int64_t chunk) {
  const graph::OpDecl& op = g.ops()[static_cast<size_t>(oi)];
  auto in = [&](size_t i) { return tensor_view(g, p, c, op.in[i].id, op.in[i].chunked, op.loop, chunk); };
  switch (op.kind) {
    case OpKind::Gemm: {
      const Tensor a = in(0), w = in(1);
      return 2.0 * static_cast<double>(a.rows()) * static_cast<double>(w.rows()) *
             static_cast<double>(a.cols());
    }
    case OpKind::GatherGemm: {
      const Tensor a = in(0), rows = in(1), w = in(2);
      return 2.0 * static_cast<double>(rows.numel()) * static_cast<double>(w.rows()) *
             static_cast<double>(a.cols());
    }
    case OpKind::Attention: {
      const Tensor cu_q = in(3), cu_k = in(4);
      const size_t n = static_cast<size_t>(cu_q.numel());
      std::vector<int32_t> q(n), k(n);
      c.backend->copy_to_host(q.data(), cu_q.data, n * 4);
      c.backend->copy_to_host(k.data(), cu_k.data, n * 4);
      double pairs = 0;
      for (size_t s = 0; s + 1 < n; ++s)
        pairs += static_cast<double>(q[s + 1] - q[s]) * static_cast<double>(k[s + 1] - k[s]);
      return 4.0 * pairs * op.p.head_dim * op.p.n_heads;  // Q K^T and P V
    }
    case OpKind::MoeFfn: {  // the (row, slot) pairs on this rank's experts: gate, up and down
      const Tensor ids = in(1);
      const MoeExperts& e = op.p.experts;
      std::vector<int32_t> id(static_cast<size_t>(ids.numel()));
      c.backend->copy_to_host(id.data(), ids.data, id.size() * 4);
      const auto pairs =
          static_cast<double>(std::count_if(id.begin(), id.end(), [&](int32_t x) { return e.local(x); }));
      return 6.0 * pairs * static_cast<double>(e.hidden) * static_cast<double>(e.inter);
    }
    default:
      return 0;
  }
}

// MoeTraffic: the rows of this router call's final routing (ids [rows, k]).
void count_moe_traffic(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int oi,
                       int64_t chunk) {
  const graph::OpDecl& op = g.ops()[static_cast<size_t>(oi)];
  const Tensor logits = tensor_view(g, p, c, op.in[0].id, op.in[0].chunked, op.loop, chunk);
  const Tensor ids = tensor_view(g, p, c, op.out[0].id, op.out[0].chunked, op.loop, chunk);
  const int64_t r0 = op.loop >= 0 ? chunk * p.loops[static_cast<size_t>(op.loop)].chunk_rows : 0;
  std::vector<int32_t> id(static_cast<size_t>(ids.numel()));
  c.backend->copy_to_host(id.data(), ids.data, id.size() * 4);
  c.moe_traffic->add(id, ids.cols(), logits.cols(), r0);
}

void run_op(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int oi,
            int64_t chunk, DesPass pass = DesPass::Both) {
  if (c.op_seconds == nullptr) {
    run_op_untimed(g, p, c, oi, chunk, pass);
    return;
  }
  const int kind = static_cast<int>(g.ops()[static_cast<size_t>(oi)].kind);
  if (c.op_flops != nullptr) c.op_flops[kind] += op_flop_count(g, p, c, oi, chunk);
  const auto t0 = std::chrono::steady_clock::now();
  run_op_untimed(g, p, c, oi, chunk, pass);
  c.backend->synchronize();
  c.op_seconds[kind] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c.moe_traffic != nullptr && kind == static_cast<int>(OpKind::MoeRoute) && pass != DesPass::VoteOnly)
    count_moe_traffic(g, p, c, oi, chunk);
}

void run_op_untimed(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int oi,
                    int64_t chunk, DesPass pass) {
  const graph::OpDecl& op = g.ops()[static_cast<size_t>(oi)];
  Backend& b = *c.backend;
  auto in = [&](size_t i) { return tensor_view(g, p, c, op.in[i].id, op.in[i].chunked, op.loop, chunk); };
  auto out = [&](size_t i) { return tensor_view(g, p, c, op.out[i].id, op.out[i].chunked, op.loop, chunk); };
  switch (op.kind) {
    case OpKind::Embed: {
      Tensor o = out(0);
      b.embed(in(0), in(1), o);
      break;
    }
    case OpKind::RmsNorm: {
      Tensor o = out(0);
      // in: x, the weight (absent: no scale), and when accumulating the output it adds to.
      const bool weighted = op.in.size() > (op.p.accumulate ? 2u : 1u);
      if (op.p.group == 0 && !op.p.accumulate && weighted) {
        b.rmsnorm(in(0), in(1), op.p.eps, o);
        break;
      }
      const Tensor w = weighted ? in(1) : Tensor();
      const int64_t group = op.p.group > 0 ? op.p.group : w.numel();
      b.rmsnorm_ex(in(0), weighted ? &w : nullptr, group, op.p.eps, op.p.accumulate, o);
      break;
    }
    case OpKind::Gemm: {
      Tensor o = out(0);
      const bool has_bias = op.in.size() >= 3 &&
                            g.tensors()[static_cast<size_t>(op.in[2].id)].kind == graph::TensorKind::Weight;
      Tensor bias = has_bias ? in(2) : Tensor();
      b.gemm(in(0), in(1), has_bias ? &bias : nullptr, o, op.p.accumulate);
      break;
    }
    case OpKind::GatherGemm: {
      Tensor o = out(0);
      b.gather_gemm(in(0), in(1), in(2), o);
      break;
    }
    case OpKind::Rope: {
      Tensor o = out(0);
      b.rope(o, in(1), op.p.head_dim, op.p.rope);
      break;
    }
    case OpKind::Attention: {
      Tensor o = out(0);
      const Tensor cu_q = in(3), cu_k = in(4), q_pos = in(5), k_pos = in(6);
      AttnParams ap;
      ap.mask = op.p.mask;
      ap.block_size = op.p.block_size;
      ap.scale = op.p.scale;
      ap.n_seqs = static_cast<int>(cu_q.numel() - 1);
      ap.cu_q = cu_q.as<const int32_t>();
      ap.cu_k = cu_k.as<const int32_t>();
      ap.q_pos = q_pos.as<const int32_t>();
      ap.k_pos = k_pos.as<const int32_t>();
      ap.operands = o.dtype;  // a bf16 graph's attention may round its operands to bf16
      ap.window = op.p.window;
      if (op.out.size() > 1) ap.kv_scratch = out(1).data;  // planned bf16 K/V staging
      if (op.out.size() > 2) ap.q_scratch = out(2).data;   // q itself, which attention may overwrite
      uint8_t* pattern = nullptr;
      if (c.sparse != nullptr) {
        TESSERA_CHECK(op.layer >= 0 && ap.n_seqs == 1, "execute: sparse attention needs one sequence");
        pattern = c.sparse->patterns + static_cast<size_t>(op.layer) * c.sparse->layer_bytes;
        if (!c.sparse->select) {
          ap.block_mask = pattern;
          ap.sparse_block = c.sparse->p.block;
          ap.sparse_q_blocks = c.sparse->q_blocks;
          ap.sparse_k_blocks = c.sparse->k_blocks;
        }
      }
      // The selecting forward builds the layer's pattern from q and k before its dense attention, which
      // may overwrite q (AttnParams::q_scratch: cuDNN's output lands in q's buffer).
      if (c.sparse != nullptr && c.sparse->select) {
        SparseSelectParams sp = c.sparse->p;
        sp.scale = op.p.scale;
        sp.operands = o.dtype;
        if (sp.attn_block > 0) {  // block-causal: pattern rows by position, over the canvas's strides
          sp.q_pos = ap.q_pos;
          sp.n_qb = c.sparse->q_blocks;
          sp.n_kb = c.sparse->k_blocks;
        }
        b.sparse_select(in(0), in(1), op.p.n_heads, op.p.n_kv_heads, op.p.head_dim, sp, pattern);
      }
      b.attention(in(0), in(1), in(2), o, op.p.n_heads, op.p.n_kv_heads, op.p.head_dim, ap);
      break;
    }
    case OpKind::Swiglu: {
      Tensor o = out(0);
      b.swiglu(in(0), in(1), o);
      break;
    }
    case OpKind::SampleRows: {
      Tensor logits = in(0), keys = in(1), tok = out(0), conf = out(1);
      const VocabShare& vs = op.p.vocab_split;
      TESSERA_CHECK(vs.n == 0 || c.comm != nullptr, "execute: a split LM head runs without its communicator");
      const auto sample = [&](const Tensor& l, const Tensor& k, const SampleParams& sp, Tensor& t,
                              Tensor& f) {
        if (vs.n > 0) {
          split_sample_rows(l, k, sp, vs, *c.comm, t, f);
        } else {
          b.sample_rows(l, k, sp, t, f);
        }
      };
      if (c.sample_seqs.empty()) {
        TESSERA_CHECK(c.sample != nullptr, "execute: sample_rows needs SampleParams");
        sample(logits, keys, *c.sample, tok, conf);
        break;
      }
      TESSERA_CHECK(c.sample_rows.size() == c.sample_seqs.size() + 1,
                    "execute: one row range per sequence's SampleParams expected");
      // This call's logit rows [row0, row0 + n), split at the sequences' boundaries.
      const int64_t row0 = op.loop >= 0 ? chunk * p.loops[static_cast<size_t>(op.loop)].chunk_rows : 0;
      const int64_t n = logits.rows();
      for (size_t s = 0; s < c.sample_seqs.size(); ++s) {
        const int64_t lo = std::max(c.sample_rows[s], row0) - row0;
        const int64_t hi = std::min(c.sample_rows[s + 1], row0 + n) - row0;
        if (lo >= hi) continue;
        Tensor l = logits.row_view(lo, hi - lo), k = keys.row_view(lo, hi - lo),
               t = tok.row_view(lo, hi - lo), f = conf.row_view(lo, hi - lo);
        sample(l, k, c.sample_seqs[s], t, f);
      }
      break;
    }
    case OpKind::TokenLogprob: {
      Tensor o = out(0);
      if (op.p.vocab_split.n > 0) {
        TESSERA_CHECK(c.comm != nullptr, "execute: a split LM head runs without its communicator");
        split_token_logprob(in(0), in(1), op.p.vocab_split, *c.comm, o);
      } else {
        b.token_logprob(in(0), in(1), o);
      }
      break;
    }
    case OpKind::TopLogprobs: {
      Tensor chosen = out(0), ids = out(1), lp = out(2);
      if (op.p.vocab_split.n > 0) {
        TESSERA_CHECK(c.comm != nullptr, "execute: a split LM head runs without its communicator");
        split_top_logprobs(in(0), in(1), op.p.vocab_split, *c.comm, chosen, ids, lp);
      } else {
        b.top_logprobs(in(0), in(1), chosen, ids, lp);
      }
      break;
    }
    case OpKind::GatherVocab: {
      Tensor o = out(0);
      TESSERA_CHECK(c.comm != nullptr, "execute: a split LM head runs without its communicator");
      gather_vocab(in(0), op.p.vocab_split, *c.comm, o);
      break;
    }
    case OpKind::MoeRoute: {
      Tensor ids = out(0), w = out(1);
      MoeRouteParams rp = op.p.route;
      if (op.in.size() > 1) rp.expert_bias = in(1).as<const float>();
      MoeShare sh;
      if (c.des != nullptr) {  // this call's rows are [r0, r0 + n) of the step
        TESSERA_CHECK(op.layer >= 0, "execute: expert sharing needs the router's layer");
        const DesExec& d = *c.des;
        const int64_t n = ids.rows();
        const int64_t r0 = op.loop >= 0 ? chunk * p.loops[static_cast<size_t>(op.loop)].chunk_rows : 0;
        sh = d.share;
        sh.vote_lo = std::clamp<int64_t>(d.vote_lo - r0, 0, n);
        sh.vote_hi = std::clamp<int64_t>(d.vote_hi - r0, 0, n);
        sh.share_lo = d.all_rows ? 0 : sh.vote_lo;
        sh.share_hi = d.all_rows ? n : sh.vote_hi;
        sh.vote = pass != DesPass::ApplyOnly && sh.mode != DesMode::Off;
        sh.apply = pass != DesPass::VoteOnly;
        sh.state = d.state + static_cast<size_t>(op.layer) * d.layer_floats;
        rp.share = &sh;
      }
      b.moe_route(in(0), rp, ids, w);
      break;
    }
    case OpKind::ScatterRows: {
      Tensor o = out(0);
      b.scatter_rows(in(0), in(1), o);
      break;
    }
    case OpKind::Convert: {
      Tensor o = out(0);
      b.convert(in(0), o);
      break;
    }
    case OpKind::GatherRows: {
      Tensor o = out(0);
      b.gather_rows(in(0), in(1), o);
      break;
    }
    case OpKind::AllReduce: {
      Tensor o = out(0);
      TESSERA_CHECK(c.comm != nullptr, "execute: a tensor-parallel graph runs without its communicator");
      TESSERA_CHECK(o.dtype == DType::F32, "all_reduce: f32 expected");
      c.comm->all_reduce_sum(o.as<float>(), static_cast<size_t>(o.numel()));
      break;
    }
    case OpKind::Geglu: {
      Tensor o = out(0);
      b.geglu(in(0), in(1), o);
      break;
    }
    case OpKind::Scale: {
      Tensor o = out(0);
      b.scale(o, op.p.scale);
      break;
    }
    case OpKind::Softcap: {
      Tensor o = out(0);
      b.softcap(o, op.p.scale);
      break;
    }
    case OpKind::CanvasSample: {
      TESSERA_CHECK(c.sample != nullptr && c.sample_seqs.empty(),
                    "execute: canvas_sample needs one SampleParams (a single sequence)");
      Tensor tok = out(0), am = out(1), ent = out(2);
      b.canvas_sample(in(0), in(1), *c.sample, tok, am, ent);
      break;
    }
    case OpKind::SoftEmbed: {
      TESSERA_CHECK(c.sample != nullptr, "execute: soft_embed needs the step's temperature");
      Tensor probs = out(0), o = out(1);
      b.soft_embed(in(0), in(1), c.sample->temperature, op.p.scale, probs, o);
      break;
    }
    case OpKind::MoeFfn: {
      // The scratch is the whole planned buffer (its fixed part included), seen as bytes.
      const Tensor s = out(0);
      Tensor scratch(s.data, DType::I32,
                     {static_cast<int64_t>(p.tensors[static_cast<size_t>(op.out[0].id)].bytes / 4)},
                     s.device);
      Tensor o = out(1);
      b.moe_ffn(in(0), in(1), in(2), op.p.experts, scratch, o);
      break;
    }
  }
  if (!c.dump_dir.empty()) {
    for (const graph::Ref& r : op.out) {
      // An input an op may overwrite (attention's q on CUDA) is not one of its results.
      const bool scratch = op.kind == OpKind::Attention && &r - op.out.data() >= 2;
      if (!scratch) dump(g, c, r.id, out(static_cast<size_t>(&r - op.out.data())), chunk);
    }
  }
}

}  // namespace

void execute(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c) {
  const int n = static_cast<int>(g.ops().size());
  int oi = 0;
  while (oi < n) {
    const int loop = g.ops()[static_cast<size_t>(oi)].loop;
    if (loop < 0) {
      run_op(g, p, c, oi, 0);
      ++oi;
      continue;
    }
    const graph::Program::Loop& L = p.loops[static_cast<size_t>(loop)];
    int route = -1;  // a chunked MoE layer under DES: its router op
    if (c.des != nullptr && c.des->share.mode != DesMode::Off && L.count > 1) {
      for (int j = L.begin; j < L.end && route < 0; ++j)
        if (g.ops()[static_cast<size_t>(j)].kind == OpKind::MoeRoute) route = j;
    }
    if (route >= 0) {  // votes of every chunk that holds voting rows, before any chunk routes
      for (int64_t k = 0; k < L.count; ++k) {
        const int64_t r0 = k * L.chunk_rows, r1 = std::min(r0 + L.chunk_rows, L.total);
        if (r1 <= c.des->vote_lo || r0 >= c.des->vote_hi) continue;
        for (int j = L.begin; j <= route; ++j) {
          for (const graph::Ref& r : g.ops()[static_cast<size_t>(j)].out)
            TESSERA_CHECK(!r.chunked || j == route,
                          "execute: an op before the router writes loop-wide rows; it cannot run twice");
          run_op(g, p, c, j, k, DesPass::VoteOnly);
        }
      }
    }
    for (int64_t k = 0; k < L.count; ++k) {
      for (int j = L.begin; j < L.end; ++j)
        run_op(g, p, c, j, k, route >= 0 ? DesPass::ApplyOnly : DesPass::Both);
    }
    oi = L.end;
  }
}

}  // namespace tessera
