// Graph registrar: symbolic sizes, lifetimes, chunk loops, barriers, aliases.
#include "graph/graph.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "memory/planner.h"

namespace tessera::graph {
namespace {

TEST(Graph, SymbolicSizesBindPerStep) {
  GraphTemplate g;
  const int in = g.add_input("tokens", DType::I32, Sym::NQuery);
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, 16);
  const int l = g.add_output("logits", DType::F32, Sym::NLogits, 10);
  g.add_op(OpKind::Embed, "embed", -1, {{in}}, {{x}});
  g.add_op(OpKind::GatherGemm, "lm", -1, {{x}}, {{l}});
  StepShape s;
  s.n_query = 7;
  s.n_kv = 7;
  s.n_logits = 3;
  const Program p = instantiate(g, s);
  EXPECT_EQ(p.tensors[static_cast<size_t>(in)].bytes, 7u * 4);
  EXPECT_EQ(p.tensors[static_cast<size_t>(x)].bytes, 7u * 16 * 4);
  EXPECT_EQ(p.tensors[static_cast<size_t>(l)].bytes, 3u * 10 * 4);
  EXPECT_EQ(p.tensors[static_cast<size_t>(in)].first, 0);
  EXPECT_EQ(p.tensors[static_cast<size_t>(x)].last, 1);
  EXPECT_EQ(p.tensors[static_cast<size_t>(l)].last, 2);  // outputs outlive the last op
}

TEST(Graph, ChunkLoopsKeepBarriersAliveAndShrinkIntermediates) {
  GraphTemplate g;
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, 8);
  const int y = g.add_tensor("y", -1, DType::F32, Sym::NQuery, 8);
  g.add_op(OpKind::Embed, "make_x", -1, {}, {{x}});
  g.begin_loop(Sym::NQuery, Sym::FfnRows);
  g.add_barrier(x);
  const int h = g.add_tensor("h", -1, DType::F32, Sym::FfnRows, 32);
  const int a = g.add_tensor("a", -1, DType::F32, Sym::FfnRows, 32);
  g.add_op(OpKind::Gemm, "up", -1, {{x, true}}, {{h}});
  g.add_alias(a, h);
  g.add_op(OpKind::Swiglu, "act", -1, {{h}}, {{a}});
  g.add_op(OpKind::Gemm, "down", -1, {{a}}, {{y, true}});
  g.end_loop();
  g.add_op(OpKind::RmsNorm, "use_y", -1, {{y}}, {{y}});
  StepShape s;
  s.n_query = 10;
  s.n_kv = 10;
  s.k_ffn = 4;  // ceil(10/4) = 3 rows per chunk, 4 chunks
  const Program p = instantiate(g, s);
  EXPECT_EQ(p.loops[0].count, 4);
  EXPECT_EQ(p.loops[0].chunk_rows, 3);
  EXPECT_EQ(p.tensors[static_cast<size_t>(h)].bytes, 3u * 32 * 4);
  // x is a barrier: alive until the loop's last op (3), although last read at op 1.
  EXPECT_EQ(p.tensors[static_cast<size_t>(x)].last, 3);
  // y is written chunk by chunk: alive from the loop's first op.
  EXPECT_EQ(p.tensors[static_cast<size_t>(y)].first, 1);
  // The alias root h covers a's lifetime.
  EXPECT_EQ(p.tensors[static_cast<size_t>(h)].last, 3);
  Program q = p;
  memory::plan(g, q);
  EXPECT_EQ(q.tensors[static_cast<size_t>(a)].offset, q.tensors[static_cast<size_t>(h)].offset);
}

TEST(Graph, ReadingANonBarrierInsideALoopIsAnError) {
  GraphTemplate g;
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, 8);
  const int h = g.add_tensor("h", -1, DType::F32, Sym::FfnRows, 8);
  g.add_op(OpKind::Embed, "make_x", -1, {}, {{x}});
  g.begin_loop(Sym::NQuery, Sym::FfnRows);
  g.add_op(OpKind::Gemm, "up", -1, {{x, true}}, {{h}});
  g.end_loop();
  StepShape s;
  s.n_query = 4;
  EXPECT_THROW(instantiate(g, s), Error);
}

}  // namespace
}  // namespace tessera::graph
