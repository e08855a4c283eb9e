/* tessera: the C API of the tessera inference engine for diffusion language models.
 *
 * A stable, small surface over the engine the `tessera` command and server run: open a model, tokenize,
 * apply its chat template, plan a request's memory, generate (one prompt or a batch) with every decoding
 * option of the CLI, watch the canvas denoise step by step and cancel.
 *
 * Conventions
 * - Every function that can fail returns a tessera_status; TESSERA_OK is 0. On failure,
 *   tessera_last_error() gives a one-line message (the same text the CLI prints) until the next failing
 *   call on the same thread. Nothing is returned through an output pointer on failure but the size a
 *   buffer that was too small needs.
 * - Option structs are versioned by their first field, struct_size: fill them with their _init function,
 *   which sets struct_size to the size this header declares. A library built from a later header reads only
 *   the fields within struct_size and takes the defaults for the rest, so a program built against this
 *   header keeps working with later 0.x libraries of the same SONAME.
 * - Strings are UTF-8 and NUL-terminated. Functions that fill a caller's buffer take its capacity and
 *   write the size they need to an output argument; when the buffer is too small they write nothing into
 *   it and return TESSERA_ERROR_BUFFER_TOO_SMALL (call again with the size given).
 * - No C++ exception or type crosses this API. Enumerations are passed in int32_t fields (a fixed size,
 *   and any value can be stored and refused with a message).
 *
 * Thread safety
 * - tessera_model_open / tessera_model_close: close a model only when no other call on it is running.
 * - tessera_model_info_get, tessera_tokenize, tessera_detokenize, tessera_chat_apply,
 *   tessera_prompt_tokens and tessera_generate_options_init only read: call them from any thread, also
 *   while a generation runs.
 * - tessera_generate, tessera_generate_batch and tessera_plan may be called from several threads on one
 *   model. Every forward runs on the model's engine thread (it lives from open to close): concurrent
 *   requests whose options allow it share packed forwards, each still getting the tokens it gets alone;
 *   the others (SparseD, DES, cfg with a KV cache, and every request when max_batch is 1) run one at a
 *   time, whole, on that thread.
 * - The step callback runs on the thread that called tessera_generate (a batch: on its worker threads),
 *   or on the model's engine thread for a request that runs alone. The callbacks of one call never run
 *   two at a time. A callback must not call tessera_generate* or tessera_plan on the same model (it would
 *   wait for itself).
 * - A tessera_result belongs to the caller: read it from any thread, free it once.
 * - tessera_model_params.threads sets the process's OpenMP thread count (it is process-wide).
 */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TESSERA_API __attribute__((visibility("default")))
#else
#define TESSERA_API
#endif

/* The version of this header (the project's, CMakeLists.txt); tessera_version() gives the library's. */
#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0
#define TESSERA_VERSION_STRING "0.1.0"

typedef enum tessera_status {
  TESSERA_OK = 0,
  TESSERA_ERROR_INVALID_ARGUMENT = 1, /* a bad option, prompt, token id, or a null pointer */
  TESSERA_ERROR_MODEL = 2,            /* the model could not be opened (missing, malformed, unsupported) */
  TESSERA_ERROR_MEMORY_BUDGET = 3,    /* the request cannot fit the memory budget */
  TESSERA_ERROR_BUFFER_TOO_SMALL = 4, /* call again with the size written to the size argument */
  TESSERA_ERROR_CANCELLED = 5,        /* the step callback asked to stop */
  TESSERA_ERROR_INTERNAL = 6          /* anything else (the message says what) */
} tessera_status;

/* The library's version ("0.1.0"). */
TESSERA_API const char* tessera_version(void);
/* The message of the last failing call on this thread ("" when none). Valid until the next failing call
 * on this thread. */
TESSERA_API const char* tessera_last_error(void);
/* A short name of a status ("ok", "invalid argument", ...). */
TESSERA_API const char* tessera_status_name(tessera_status s);

/* ---- Models ---------------------------------------------------------------------------------------- */

typedef struct tessera_model tessera_model;

typedef enum tessera_precision {
  TESSERA_PRECISION_AUTO = 0, /* the checkpoint's dtype where the device computes in it, else bf16 */
  TESSERA_PRECISION_BF16 = 1,
  TESSERA_PRECISION_F32 = 2
} tessera_precision;

typedef struct tessera_model_params {
  uint32_t struct_size;
  const char* device;     /* "cpu" (default) or "cuda" */
  int32_t precision;      /* a tessera_precision; default AUTO */
  uint64_t memory_budget; /* bytes for the weights plus the planned activations; 0 = none */
  int32_t threads;        /* > 0: OpenMP threads for the process; 0 (default): OMP_NUM_THREADS or all */
  int32_t dequantize;     /* GGUF: nonzero converts quantized tensors to bf16 at load */
  int32_t max_batch;      /* tessera_generate_batch: most prompts per packed forward (default 8) */
} tessera_model_params;

TESSERA_API void tessera_model_params_init(tessera_model_params* p);
/* A memory size as the CLI's --memory-budget takes it ("24GiB", "512 MiB", "1.5GB", "4096" bytes; KB ... TB
 * powers of 1000, KiB ... TiB and K ... T powers of 1024), into bytes. */
TESSERA_API tessera_status tessera_parse_size(const char* text, uint64_t* bytes);
/* Opens a model directory (config.json, safetensors, tokenizer) or a .gguf file; path NULL or "": the
 * bundled default model (models/tessera-tiny, found from the working directory). params NULL: defaults. */
TESSERA_API tessera_status tessera_model_open(const char* path, const tessera_model_params* params,
                                              tessera_model** out);
TESSERA_API void tessera_model_close(tessera_model* m); /* NULL is a no-op */

typedef struct tessera_model_info {
  uint32_t struct_size;
  int64_t vocab_size;
  int64_t max_positions;   /* the context: prompt + generation (+ suffix) */
  int32_t mask_token;      /* the canvas's undecided positions hold this id */
  int32_t bos_token;       /* -1: none */
  int32_t eos_token;       /* -1: none */
  int32_t attention_block; /* block-causal models (LLaDA2): the attention block; 0: bidirectional */
  int32_t has_chat_template;
  int32_t adds_bos;      /* raw prompts start with BOS (tessera_prompt_tokens) */
  uint64_t weight_bytes; /* the weights as loaded */
  const char* family;    /* "llada", "dream", "llada-moe" or "llada2" (static storage) */
  const char* path;      /* the model's path (owned by the model) */
} tessera_model_info;

TESSERA_API tessera_status tessera_model_info_get(const tessera_model* m, tessera_model_info* out);

/* ---- Text ------------------------------------------------------------------------------------------ */

/* Token ids of text (no BOS, no template). ids may be NULL when capacity is 0. */
TESSERA_API tessera_status tessera_tokenize(const tessera_model* m, const char* text, int32_t* ids,
                                            size_t capacity, size_t* n_ids);
/* The text of token ids, NUL-terminated; *len is the length without the NUL (capacity must exceed it).
 * skip_special: nonzero leaves special tokens (BOS, EOS, template markers) out. */
TESSERA_API tessera_status tessera_detokenize(const tessera_model* m, const int32_t* ids, size_t n_ids,
                                              int32_t skip_special, char* text, size_t capacity, size_t* len);

typedef struct tessera_chat_message {
  const char* role; /* "system", "user" or "assistant" */
  const char* content;
} tessera_chat_message;

/* The text of a conversation in the model's chat template (TESSERA_ERROR_INVALID_ARGUMENT when it has
 * none), ending with the assistant's header when add_generation_prompt is nonzero. */
TESSERA_API tessera_status tessera_chat_apply(const tessera_model* m, const tessera_chat_message* msgs,
                                              size_t n_msgs, int32_t add_generation_prompt, char* text,
                                              size_t capacity, size_t* len);
/* A prompt's token ids as `tessera generate` makes them: use_chat nonzero applies the chat template
 * (with the assistant's header), zero concatenates the contents raw after BOS where the model adds one. */
TESSERA_API tessera_status tessera_prompt_tokens(const tessera_model* m, const tessera_chat_message* msgs,
                                                 size_t n_msgs, int32_t use_chat, int32_t* ids,
                                                 size_t capacity, size_t* n_ids);

/* ---- Decoding options ------------------------------------------------------------------------------ */

typedef enum tessera_unmask {
  TESSERA_UNMASK_LOW_CONFIDENCE = 0, /* LLaDA */
  TESSERA_UNMASK_RANDOM = 1,         /* LLaDA */
  TESSERA_UNMASK_ORIGIN = 2,         /* Dream */
  TESSERA_UNMASK_MASKGIT_PLUS = 3,   /* Dream */
  TESSERA_UNMASK_TOPK_MARGIN = 4,    /* Dream */
  TESSERA_UNMASK_ENTROPY = 5         /* Dream */
} tessera_unmask;

typedef enum tessera_kv_cache {
  TESSERA_CACHE_NONE = 0,   /* exact */
  TESSERA_CACHE_PREFIX = 1, /* Fast-dLLM: reuse K/V before the block */
  TESSERA_CACHE_DUAL = 2    /* also after it */
} tessera_kv_cache;

typedef enum tessera_des { TESSERA_DES_OFF = 0, TESSERA_DES_SEQ = 1, TESSERA_DES_VOTE = 2 } tessera_des;
typedef enum tessera_des_scope { TESSERA_DES_SCOPE_BLOCK = 0, TESSERA_DES_SCOPE_ALL = 1 } tessera_des_scope;
/* --mode: how the canvas is written (AR and SPEC need a tri-mode model: Nemotron-Labs-Diffusion). */
typedef enum tessera_mode {
  TESSERA_MODE_DIFFUSION = 0, /* unmasking (a tri-mode model's: seeded and committed by causal passes) */
  TESSERA_MODE_AR = 1,        /* one token per causal forward */
  TESSERA_MODE_SPEC = 2,      /* linear self-speculation (greedy: the same text as AR) */
  TESSERA_MODE_UNIFORM = 3    /* uniform-noise canvases (DiffusionGemma: its only mode) */
} tessera_mode;

/* Every decoding option of `tessera generate` (the flag of each in its comment). Start from
 * tessera_generate_options_init, which sets the model's defaults (its generation_config.json). Lengths
 * of 0 take the default the others imply: block_length the gen_length (block-causal models: the
 * attention block), steps the gen_length (block-causal: the block length). */
typedef struct tessera_generate_options {
  uint32_t struct_size;
  int32_t gen_length;        /* --gen-length */
  int32_t steps;             /* --steps; 0: implied */
  int32_t block_length;      /* --block-length; 0: implied */
  float temperature;         /* --temperature (0: greedy) */
  int32_t alg;               /* --alg: a tessera_unmask */
  float threshold;           /* --threshold: confidence-threshold parallel decoding (0: off) */
  float cfg_scale;           /* --cfg */
  int32_t top_k;             /* --top-k (Dream algorithms; 0: off) */
  float top_p;               /* --top-p (Dream algorithms; 1: off) */
  float alg_temp;            /* --alg-temp */
  uint64_t seed;             /* --seed */
  int32_t cache;             /* --cache: a tessera_kv_cache */
  int32_t sparse;            /* --sparse (SparseD; nonzero: on) */
  int32_t sparse_block;      /* --sparse-block */
  float sparse_rho;          /* --sparse-rho */
  float sparse_skip;         /* --sparse-skip */
  int32_t des;               /* --des: a tessera_des */
  int32_t des_k;             /* --des-k */
  float des_beta;            /* --des-beta */
  int32_t des_scope;         /* --des-scope: a tessera_des_scope */
  int32_t window;            /* --window (Window-Diffusion; nonzero: on) */
  int32_t window_ex;         /* --window-ex (0: 64 for the LLaDA algorithms, 128 for Dream's) */
  int32_t window_in;         /* --window-in */
  int32_t window_refresh;    /* --window-refresh */
  int32_t window_early_stop; /* --window-early-stop */
  int32_t edit;              /* token editing (--edit-mode quality|speed set these four) */
  float edit_threshold;      /* --edit-threshold */
  int32_t max_post_steps;    /* --max-post-steps */
  float edit_penalty;        /* --edit-penalty */
  const char* const* stop;   /* --stop: stop sequences (n_stop of them; copied by the call) */
  size_t n_stop;
  const char* suffix;    /* --suffix: infilling text after the generated span; NULL: none */
  int32_t logprobs;      /* --logprobs N: -1 off, else 0..20 alternatives per token */
  int32_t stop_at_eos;   /* nonzero (default): the answer ends at the first EOS */
  int32_t mode;          /* --mode: a tessera_mode */
  int32_t spec_sampling; /* --spec-sampling: 0 match, 1 rejection (mode SPEC at temperature > 0) */
  float draft_threshold; /* --draft-threshold (mode SPEC; 0: one draft pass) */
  /* The entropy-bound sampler of mode UNIFORM (defaults: the model's generation_config.json) */
  double t_min;         /* --t-min */
  double t_max;         /* --t-max */
  double entropy_bound; /* --entropy-bound */
  int32_t stability;    /* --stability */
  double confidence;    /* --confidence */
} tessera_generate_options;

/* The model's defaults. An editing preset: tessera_generate_options_edit_preset. */
TESSERA_API tessera_status tessera_generate_options_init(const tessera_model* m, tessera_generate_options* o);
/* Sets the editing fields (edit, threshold, edit_threshold, max_post_steps) to a preset of
 * --edit-mode: "quality", "speed" or "off". */
TESSERA_API tessera_status tessera_generate_options_edit_preset(tessera_generate_options* o,
                                                                const char* mode);

/* ---- Generation ------------------------------------------------------------------------------------ */

typedef struct tessera_edit {
  int32_t step;     /* the step that rewrote it */
  int32_t position; /* absolute canvas position */
  int32_t from, to; /* the token before and after */
} tessera_edit;

/* What a step did, passed to the step callback. The canvas is the whole sequence (prompt, generation,
 * suffix): positions [prompt_len, committed) are final, positions from `committed` on are provisional
 * (mask_token where undecided; with token editing, decided tokens that may still be rewritten). Every
 * pointer is valid during the callback only. */
typedef struct tessera_step_event {
  uint32_t struct_size;
  size_t sequence; /* the prompt's index (tessera_generate_batch); 0 for tessera_generate */
  int32_t step;    /* 0-based executed step */
  const int32_t* canvas;
  size_t canvas_len;
  size_t prompt_len;
  int32_t committed;
  int32_t mask_token;
  const int32_t* decided; /* canvas positions this step decided or rewrote, ascending */
  size_t n_decided;
  const tessera_edit* edits; /* the tokens this step rewrote */
  size_t n_edits;
} tessera_step_event;

/* Called after every step; return 0 to go on, nonzero to cancel (the call then returns
 * TESSERA_ERROR_CANCELLED and no result; for a batch, every prompt of it stops). */
typedef int32_t (*tessera_step_callback)(const tessera_step_event* ev, void* user_data);

typedef struct tessera_result tessera_result;

typedef enum tessera_finish_reason {
  TESSERA_FINISH_STOP = 0,  /* an EOS or a stop sequence ended the answer */
  TESSERA_FINISH_LENGTH = 1 /* gen_length tokens were generated */
} tessera_finish_reason;

/* Generates after the prompt's token ids (tessera_prompt_tokens makes them as the CLI does). callback may
 * be NULL. On success *out holds the result (free it with tessera_result_free). */
TESSERA_API tessera_status tessera_generate(tessera_model* m, const int32_t* prompt, size_t prompt_len,
                                            const tessera_generate_options* o, tessera_step_callback callback,
                                            void* user_data, tessera_result** out);
/* Generates for n prompts at once, their forwards packed into shared forwards where the options allow
 * (each prompt's tokens are those it gets alone). out: an array of n results, all set on success, all
 * NULL on failure (the first failure's message). */
TESSERA_API tessera_status tessera_generate_batch(tessera_model* m, const int32_t* const* prompts,
                                                  const size_t* prompt_lens, size_t n,
                                                  const tessera_generate_options* o,
                                                  tessera_step_callback callback, void* user_data,
                                                  tessera_result** out);

TESSERA_API void tessera_result_free(tessera_result* r); /* NULL is a no-op */
/* The answer's text (cut before a stop sequence), NUL-terminated, owned by the result. A byte-level model
 * may stop inside a character: the bytes are as decoded, not always valid UTF-8. */
TESSERA_API const char* tessera_result_text(const tessera_result* r);
/* The answer's token ids (owned by the result); returns their count. */
TESSERA_API size_t tessera_result_tokens(const tessera_result* r, const int32_t** ids);
TESSERA_API tessera_finish_reason tessera_result_finish_reason(const tessera_result* r);

typedef struct tessera_result_stats {
  uint32_t struct_size;
  size_t prompt_tokens;
  size_t generated_tokens;
  int32_t steps;             /* executed steps */
  int64_t forwards;          /* forwards run */
  double seconds;            /* the generation's wall time */
  double first_step_seconds; /* from the call to the end of the first step (time to the first canvas event) */
  size_t n_edits;
} tessera_result_stats;

TESSERA_API void tessera_result_stats_get(const tessera_result* r, tessera_result_stats* out);

typedef struct tessera_top_logprob {
  int32_t token;
  float logprob;
} tessera_top_logprob;

/* Token i's log-probability (options.logprobs >= 0; NaN otherwise or out of range), the step that decided
 * it, and its most likely alternatives at that step (up to options.logprobs of them, owned by the result).
 * Returns the number of alternatives. */
TESSERA_API size_t tessera_result_logprob(const tessera_result* r, size_t i, float* logprob, int32_t* step,
                                          const tessera_top_logprob** top);
/* Every rewrite token editing made, in step order (owned by the result); returns their count. */
TESSERA_API size_t tessera_result_edits(const tessera_result* r, const tessera_edit** edits);

/* ---- Memory plan ----------------------------------------------------------------------------------- */

typedef struct tessera_memory_plan {
  uint32_t struct_size;
  int64_t canvas;             /* positions of the largest forward (prompt + generation + suffix, padded) */
  int64_t logit_rows;         /* predicted positions of the largest forward */
  int64_t kv_cache_rows;      /* rows of KV cache the request holds (0: none) */
  uint64_t weight_bytes;      /* the weights */
  uint64_t activation_bytes;  /* the planned activation peak of the largest step */
  uint64_t lower_bound_bytes; /* the most bytes live at one op of it (no plan can go lower) */
  int64_t k_ffn, k_logits;    /* the chunk counts it is planned with (1: unchunked) */
  uint64_t memory_budget;     /* the model's budget (0: none) */
  int32_t shares_forwards;    /* whether it packs with other requests (tessera_generate_batch) */
} tessera_memory_plan;

/* The memory plan of a request of prompt_len tokens with these options: its largest step, chunked as
 * the memory budget makes it. TESSERA_ERROR_MEMORY_BUDGET (with the floor and the largest context that
 * fits) when it cannot fit. */
TESSERA_API tessera_status tessera_plan(tessera_model* m, size_t prompt_len,
                                        const tessera_generate_options* o, tessera_memory_plan* out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TESSERA_H */
