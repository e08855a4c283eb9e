// The makers of the step loop's parts, one per part file; choose_parts (policies.cpp) calls them.
#pragma once
#include <memory>

#include "decode/loop.h"

namespace tessera::decode {

std::unique_ptr<TransferSchedule> make_schedule(const GenerateOptions& o,
                                                const RequestPlan& plan);  // transfer.cpp
std::unique_ptr<UnmaskPolicy> make_unmask(const GenerateOptions& o);       // unmask.cpp
std::unique_ptr<RowPolicy> make_cache_rows(const GenerateOptions& o, const RequestPlan& plan);   // rows.cpp
std::unique_ptr<RowPolicy> make_window_rows(const GenerateOptions& o, const RequestPlan& plan);  // window.cpp
std::unique_ptr<AttentionPolicy> make_sparse(const GenerateOptions& o,
                                             const RequestPlan& plan);                  // sparse.cpp
std::unique_ptr<ExpertPolicy> make_experts(const GenerateOptions& o);                   // experts.cpp
std::unique_ptr<Guidance> make_guidance(const GenerateOptions& o);                      // guidance.cpp
std::unique_ptr<TransferSchedule> make_edit_schedule(const GenerateOptions& o);         // edit.cpp
std::unique_ptr<UnmaskPolicy> make_edit_sampling();                                     // edit.cpp
std::unique_ptr<TransferSchedule> make_constrained_schedule(const GenerateOptions& o);  // constrained.cpp
std::unique_ptr<RowPolicy> make_causal_rows(const GenerateOptions& o);                  // causal.cpp

}  // namespace tessera::decode
