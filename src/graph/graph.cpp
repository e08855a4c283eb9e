#include "graph/graph.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::graph {

const char* sym_name(Sym s) {
  switch (s) {
    case Sym::One:
      return "1";
    case Sym::NQuery:
      return "n_query";
    case Sym::NKv:
      return "n_kv";
    case Sym::NLogits:
      return "n_logits";
    case Sym::NSeqsPlus1:
      return "n_seqs+1";
    case Sym::FfnRows:
      return "ffn_rows";
    case Sym::LogitRows:
      return "logit_rows";
    case Sym::kCount:
      break;
  }
  return "?";
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Embed:
      return "embed";
    case OpKind::RmsNorm:
      return "rmsnorm";
    case OpKind::Gemm:
      return "gemm";
    case OpKind::GatherGemm:
      return "gather_gemm";
    case OpKind::Rope:
      return "rope";
    case OpKind::Attention:
      return "attention";
    case OpKind::Swiglu:
      return "swiglu";
    case OpKind::SampleRows:
      return "sample_rows";
    case OpKind::TokenLogprob:
      return "token_logprob";
    case OpKind::MoeRoute:
      return "moe_route";
    case OpKind::MoeFfn:
      return "moe_ffn";
    case OpKind::ScatterRows:
      return "scatter_rows";
    case OpKind::Convert:
      return "convert";
    case OpKind::GatherRows:
      return "gather_rows";
    case OpKind::TopLogprobs:
      return "top_logprobs";
    case OpKind::AllReduce:
      return "all_reduce";
    case OpKind::GatherVocab:
      return "gather_vocab";
    case OpKind::Geglu:
      return "geglu";
    case OpKind::Scale:
      return "scale";
    case OpKind::Softcap:
      return "softcap";
    case OpKind::CanvasSample:
      return "canvas_sample";
    case OpKind::SoftEmbed:
      return "soft_embed";
  }
  return "?";
}

std::array<int64_t, static_cast<size_t>(Sym::kCount)> StepShape::bind() const {
  std::array<int64_t, static_cast<size_t>(Sym::kCount)> v{};
  auto ceil_div = [](int64_t a, int64_t b) { return b <= 0 ? a : (a + b - 1) / b; };
  v[static_cast<size_t>(Sym::One)] = 1;
  v[static_cast<size_t>(Sym::NQuery)] = n_query;
  v[static_cast<size_t>(Sym::NKv)] = n_kv;
  v[static_cast<size_t>(Sym::NLogits)] = n_logits;
  v[static_cast<size_t>(Sym::NSeqsPlus1)] = n_seqs + 1;
  v[static_cast<size_t>(Sym::FfnRows)] = ceil_div(n_query, k_ffn);
  v[static_cast<size_t>(Sym::LogitRows)] = ceil_div(n_logits, k_logits);
  return v;
}

std::string TensorDecl::full_name() const {
  return layer >= 0 ? "blk." + std::to_string(layer) + "." + name : name;
}

int GraphTemplate::add_weight(std::string name, int layer, const Tensor& t) {
  TensorDecl d;
  d.name = std::move(name);
  d.layer = layer;
  d.kind = TensorKind::Weight;
  d.dtype = t.dtype;
  d.rows_mul = t.rows();
  d.cols = t.cols();
  d.weight = t;
  tensors_.push_back(std::move(d));
  return static_cast<int>(tensors_.size()) - 1;
}

int GraphTemplate::add_input(std::string name, DType dt, Sym rows, int64_t cols) {
  const int id = add_tensor(std::move(name), -1, dt, rows, cols);
  tensors_[static_cast<size_t>(id)].kind = TensorKind::Input;
  return id;
}

int GraphTemplate::add_tensor(std::string name, int layer, DType dt, Sym rows, int64_t cols, int64_t mul) {
  TensorDecl d;
  d.name = std::move(name);
  d.layer = layer;
  d.dtype = dt;
  d.rows = rows;
  d.rows_mul = mul;
  d.cols = cols;
  tensors_.push_back(std::move(d));
  return static_cast<int>(tensors_.size()) - 1;
}

int GraphTemplate::add_output(std::string name, DType dt, Sym rows, int64_t cols) {
  const int id = add_tensor(std::move(name), -1, dt, rows, cols);
  tensors_[static_cast<size_t>(id)].kind = TensorKind::Output;
  return id;
}

int GraphTemplate::add_state(std::string name, int layer, DType dt, Sym rows, int64_t cols) {
  const int id = add_tensor(std::move(name), layer, dt, rows, cols);
  tensors_[static_cast<size_t>(id)].kind = TensorKind::State;
  return id;
}

int GraphTemplate::add_scratch(std::string name, int layer, Sym rows, size_t bytes_per_row,
                               size_t fixed_bytes) {
  const int id =
      add_tensor(std::move(name), layer, DType::I32, rows, static_cast<int64_t>((bytes_per_row + 3) / 4));
  tensors_[static_cast<size_t>(id)].extra_bytes = (fixed_bytes + 3) / 4 * 4;
  return id;
}

void GraphTemplate::add_alias(int out, int in) {
  auto& o = tensors_.at(static_cast<size_t>(out));
  const auto& i = tensors_.at(static_cast<size_t>(in));
  TESSERA_CHECK(o.kind == TensorKind::Transient && i.kind == TensorKind::Transient,
                "add_alias: only transient tensors can alias");
  TESSERA_CHECK(o.rows == i.rows && o.rows_mul * o.cols * static_cast<int64_t>(dtype_size(o.dtype)) <=
                                        i.rows_mul * i.cols * static_cast<int64_t>(dtype_size(i.dtype)),
                "add_alias: " + o.full_name() + " does not fit in " + i.full_name());
  o.alias_of = i.alias_of >= 0 ? i.alias_of : in;
}

int GraphTemplate::add_op(OpKind k, std::string name, int layer, std::vector<Ref> in, std::vector<Ref> out,
                          const OpParams& p) {
  for (const Ref& r : in)
    TESSERA_CHECK(r.id >= 0 && r.id < static_cast<int>(tensors_.size()), "add_op: bad input");
  for (const Ref& r : out) {
    TESSERA_CHECK(r.id >= 0 && r.id < static_cast<int>(tensors_.size()), "add_op: bad output");
    TESSERA_CHECK(tensors_[static_cast<size_t>(r.id)].kind != TensorKind::Weight &&
                      tensors_[static_cast<size_t>(r.id)].kind != TensorKind::Input,
                  "add_op: " + name + " writes a weight or an input");
  }
  TESSERA_CHECK(open_loop_ >= 0 || std::none_of(in.begin(), in.end(), [](const Ref& r) { return r.chunked; }),
                "add_op: chunked operand outside a loop");
  ops_.push_back(OpDecl{k, std::move(name), layer, std::move(in), std::move(out), p, open_loop_});
  return static_cast<int>(ops_.size()) - 1;
}

void GraphTemplate::begin_loop(Sym total, Sym chunk_rows) {
  TESSERA_CHECK(open_loop_ < 0, "begin_loop: loops do not nest");
  TESSERA_CHECK((total == Sym::NQuery && chunk_rows == Sym::FfnRows) ||
                    (total == Sym::NLogits && chunk_rows == Sym::LogitRows),
                "begin_loop: FFN loops chunk n_query by ffn_rows, logits loops n_logits by logit_rows");
  loops_.push_back(LoopDecl{
      chunk_rows, total, chunk_rows, static_cast<int>(ops_.size()), static_cast<int>(ops_.size()), {}});
  open_loop_ = static_cast<int>(loops_.size()) - 1;
}

void GraphTemplate::add_barrier(int tensor) {
  TESSERA_CHECK(open_loop_ >= 0, "add_barrier: no open loop");
  loops_[static_cast<size_t>(open_loop_)].barriers.push_back(tensor);
}

void GraphTemplate::end_loop() {
  TESSERA_CHECK(open_loop_ >= 0, "end_loop: no open loop");
  loops_[static_cast<size_t>(open_loop_)].end = static_cast<int>(ops_.size());
  open_loop_ = -1;
}

int GraphTemplate::find(const std::string& full_name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].full_name() == full_name) return static_cast<int>(i);
  }
  return -1;
}

Program instantiate(const GraphTemplate& g, const StepShape& s) {
  Program prog;
  prog.shape = s;
  prog.sym = s.bind();
  const auto& decls = g.tensors();
  prog.tensors.resize(decls.size());
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorDecl& d = decls[i];
    InstTensor& t = prog.tensors[i];
    t.alias_of = d.alias_of;
    if (d.kind == TensorKind::Weight) {
      t.rows = d.rows_mul;
      continue;
    }
    t.rows = d.rows_mul * prog.sym[static_cast<size_t>(d.rows)];
    t.bytes = static_cast<size_t>(t.rows * d.cols) * dtype_size(d.dtype) + d.extra_bytes;
  }
  for (const LoopDecl& l : g.loops()) {
    const int64_t total = prog.sym[static_cast<size_t>(l.total)];
    const int64_t rows = prog.sym[static_cast<size_t>(l.chunk_rows)];
    const int64_t count = rows == 0 ? 0 : (total + rows - 1) / rows;
    prog.loops.push_back(Program::Loop{l.begin, l.end, count, rows, total});
  }
  // Lifetimes over op indices.
  auto touch = [&](int id, int op) {
    InstTensor& t = prog.tensors[static_cast<size_t>(id)];
    if (t.first < 0 || op < t.first) t.first = op;
    t.last = std::max(t.last, op);
  };
  const auto& ops = g.ops();
  for (size_t oi = 0; oi < ops.size(); ++oi) {
    const OpDecl& op = ops[oi];
    const int o = static_cast<int>(oi);
    for (const Ref& r : op.in) touch(r.id, o);
    for (const Ref& r : op.out) touch(r.id, o);
    if (op.loop >= 0) {
      const LoopDecl& l = g.loops()[static_cast<size_t>(op.loop)];
      // A tensor written chunk by chunk lives across the whole loop.
      for (const Ref& r : op.out) {
        if (r.chunked) {
          touch(r.id, l.begin);
          touch(r.id, l.end - 1);
        }
      }
    }
  }
  for (const LoopDecl& l : g.loops()) {
    for (int b : l.barriers) {
      touch(b, l.begin);
      touch(b, l.end - 1);
    }
    // Every tensor read inside the loop and defined before it must be a barrier (checked, so a
    // template that forgets one fails loudly instead of being overwritten mid-loop).
    for (int oi = l.begin; oi < l.end; ++oi) {
      for (const Ref& r : ops[static_cast<size_t>(oi)].in) {
        const auto kind = decls[static_cast<size_t>(r.id)].kind;
        if (kind == TensorKind::Weight || kind == TensorKind::State) continue;
        if (prog.tensors[static_cast<size_t>(r.id)].first < l.begin &&
            std::find(l.barriers.begin(), l.barriers.end(), r.id) == l.barriers.end()) {
          fail("graph: " + decls[static_cast<size_t>(r.id)].full_name() +
               " is read inside a chunk loop but is not a barrier of it");
        }
      }
    }
  }
  // Inputs are written before op 0; outputs are read after the last op.
  const int n_ops = static_cast<int>(ops.size());
  for (size_t i = 0; i < decls.size(); ++i) {
    InstTensor& t = prog.tensors[i];
    if (decls[i].kind == TensorKind::Input) {  // written before op 0, even when no op reads it
      t.first = 0;
      t.last = std::max(t.last, 0);
    }
    if (decls[i].kind == TensorKind::Output) t.last = n_ops;
    if (decls[i].kind != TensorKind::Weight && t.first < 0) t.first = t.last = 0;  // unused
    if (decls[i].kind == TensorKind::State) {                                      // outlives the step
      t.first = 0;
      t.last = n_ops;
    }
  }
  // Aliases merge into their root's lifetime.
  for (size_t i = 0; i < decls.size(); ++i) {
    const int root = prog.tensors[i].alias_of;
    if (root < 0) continue;
    InstTensor& r = prog.tensors[static_cast<size_t>(root)];
    r.first = std::min(r.first, prog.tensors[i].first);
    r.last = std::max(r.last, prog.tensors[i].last);
  }
  return prog;
}

}  // namespace tessera::graph
