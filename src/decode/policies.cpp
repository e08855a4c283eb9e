// Where a request's parts are chosen from its options: a new policy is its own file plus one line here.
#include "decode/policies.h"

namespace tessera::decode {

Parts choose_parts(const GenerateOptions& o, const RequestPlan& plan) {
  Parts p;
  if (o.mode == DecodeMode::Uniform) {  // uniform.cpp is the whole loop; init_canvas reads the unmask part
    p.unmask = make_unmask(o);
    return p;
  }
  p.schedule = o.constraint ? make_constrained_schedule(o)
               : o.edit     ? make_edit_schedule(o)
                            : make_schedule(o, plan);
  p.unmask = o.edit ? make_edit_sampling() : make_unmask(o);
  p.rows = o.window ? make_window_rows(o, plan) : o.causal() ? make_causal_rows(o) : make_cache_rows(o, plan);
  if (o.sparse) p.attention = make_sparse(o, plan);
  if (plan.des) p.experts = make_experts(o);
  if (o.cfg_scale > 0.0f || o.edit_penalty > 0.0f || o.constraint) p.guidance = make_guidance(o);
  return p;
}

}  // namespace tessera::decode
