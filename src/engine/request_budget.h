// The memory budget of a request, from its plan (decode/request.h): its largest step (the whole canvas
// with a block of predicted positions, in the output mode its forwards use, with the KV cache it holds)
// must fit beside the weights and what is held, or it fails before its first forward.
#pragma once
#include "decode/request.h"
#include "engine/engine.h"

namespace tessera {

// Throws Error (the budget, the floor and the largest context that fits) unless the request's largest
// step fits; nothing to check without a budget. Run with the request's state open (RequestScope), so
// that what it holds is counted, on the thread that owns the engine.
void check_request_budget(Engine& e, const RequestPlan& plan);
// Plans the request's largest step (chunked as the budget makes it; throws BudgetError when it cannot
// fit) and returns its figures. As check_request_budget: with the request's state open.
StepStats plan_largest_step(Engine& e, const RequestPlan& plan);

}  // namespace tessera
