#include "engine/request_budget.h"

namespace tessera {

void check_request_budget(Engine& e, const RequestPlan& plan) {
  if (e.options().memory_budget == 0) return;
  plan_largest_step(e, plan);
}

StepStats plan_largest_step(Engine& e, const RequestPlan& plan) {
  if (plan.attention_block > 0) e.set_attention_block(plan.attention_block);
  const OutputMode mode = plan.host_logits ? OutputMode::Logits
                          : plan.logprobs  ? OutputMode::SampleLogprobs
                                           : OutputMode::Sample;
  e.check_memory(plan.canvas, plan.logit_rows, mode, plan.kv_capacity > 0);
  return e.last_step();
}

}  // namespace tessera
