// DiffusionGemma's weight layout and graph (models/diffusion_gemma.cpp, diffusion_gemma_graph.cpp).
#pragma once
#include "models/model.h"

namespace tessera {

DenseWeights diffusion_gemma_layout(const ModelConfig& c, DType act, const WeightMaker& make);

// The Gemma 4 text stack as a graph template. o.mask Causal: the encoder (causal attention, sliding
// layers within the window, the encoder's layer scalars); otherwise the decoder (a canvas attending to
// itself and to the cache, sliding layers to its last window - 1 cached positions; its input the
// scaled embeddings plus self-conditioning on the input "sc_in" [n_query, hidden] f32 (zeros: none),
// normalised; the decoder's layer scalars). Logits are soft-capped. The decoder's Sample mode is the
// entropy-bound sampler's step: outputs "token" (sampled at the step's temperature), "conf" (the entropy
// of the tempered distribution), "argmax" and "soft" [n_logits, hidden] f32 (the next step's
// self-conditioning input).
graph::GraphTemplate build_diffusion_gemma_graph(const ModelConfig& c, const DenseWeights& w,
                                                 const GraphOptions& o, OutputMode mode);

}  // namespace tessera
