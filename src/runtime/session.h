// A Session: a loaded model with its tokenizer, chat template and default options, ready to generate.
// What the CLI (apps/tessera/cli_session.h), the server and the C API (include/tessera/tessera.h) share:
// model resolution, the model's default options, prompt building and checks, stop sequences, timing.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/engine.h"
#include "io/chat_template.h"
#include "io/json_grammar.h"
#include "io/model_files.h"
#include "io/tokenizer.h"
#include "runtime/json_constraint.h"

namespace tessera {

// How a model is opened: where, on which device, in which precision, within which memory.
struct LoadOptions {
  std::string model;  // a model directory or .gguf file; empty: the bundled default (default_model_dir)
  std::string device = "cpu";  // cpu | cuda
  Precision precision = Precision::Auto;
  bool dequantize = false;   // GGUF: quantized tensors converted to bf16 at load
  size_t memory_budget = 0;  // bytes for the weights plus the planned activations; 0 = none
  size_t prefix_cache = 0;   // block-causal models: the cross-request prefix cache's bytes (0: off)
  int threads = 0;  // > 0: OpenMP threads for the process (omp_set_num_threads); 0: OMP_NUM_THREADS or all
  // Tensor parallelism over tp processes (dist/communicator.h: MPI, one process per rank, started by
  // mpirun -np tp); every rank loads its share and runs the same requests. dist_timeout: seconds a
  // collective may wait for the others before the job ends with an error.
  int tp = 1, ep = 1;  // ep: expert parallelism over the same ranks (MoE models; 1 or the number of ranks)
  double dist_timeout = 120.0;
  std::string chat_template_file;  // a Jinja chat template used instead of the model's; empty: the model's
};

// The ranks of --tp / --ep on `device`: MPI's world, which must have exactly max(tp, ep) processes
// started by the launcher (one-line errors otherwise, and for a launch of several processes with
// neither); null for one process.
std::shared_ptr<dist::Communicator> parallel_communicator(int tp, int ep, const std::string& device,
                                                          double timeout_s);

class Session {
 public:
  // Loads the model; its options start as defaults() (throws Error for a bad model or options file).
  explicit Session(const LoadOptions& lo);
  // The model's default options: generation_config.json's tessera keys where it has them, else LLaDA's
  // defaults (block-causal models: LLaDA2's: block length the attention block, as many steps as the
  // block, threshold 0.95; Dream: the entropy policy), its EOS ids, and unique-expert counts on MoE
  // models. A length not given is the one the given lengths imply: block_length the gen_length
  // (block-causal: the attention block), steps the gen_length (block-causal: the block length).
  // A length that does not fit is fitted, not refused, unless the caller gave it (fit_layout); each
  // change is described in `notes` when given.
  GenerateOptions defaults(std::optional<int> gen_length = {}, std::optional<int> block_length = {},
                           std::optional<int> steps = {}, std::vector<std::string>* notes = nullptr) const;
  // Sets g's gen_length and, for bidirectional models, a block length and steps that fit it: a block or
  // step count given here is kept as it is (steps above gen_length lowered to it: the same tokens, no
  // empty steps), the others follow g's: the largest block up to g's that divides gen_length (and the
  // given steps) and is at least half of it, else one block; as many steps per token as g has, rounded
  // up to a multiple of the blocks. Block-causal models keep their attention block. Each change of a
  // value that was not given is described in `notes`.
  void fit_layout(GenerateOptions& g, int gen_length, std::optional<int> block_length,
                  std::optional<int> steps, std::vector<std::string>* notes = nullptr) const;
  // The unmasking the model decodes with unless told otherwise (generation_config.json's alg, else
  // entropy for Dream, low_confidence for the others): defaults().alg without the rest.
  Unmask default_alg() const;
  // Replaces the session's options (validated: throws Error, nothing changed, for bad ones).
  void set_options(const GenerateOptions& o);
  void set_logprobs_top(int n) { logprobs_top_ = n; }
  // Token ids of a prompt (chat template applied unless raw; BOS where the model adds one); throws
  // when the prompt plus the generation of `o` (default: the session's options) exceeds the context, and
  // before tokenizing when its text is too long for any tokenization of it to fit.
  std::vector<int32_t> prompt_ids(const std::vector<ChatMessage>& msgs, bool use_chat) const {
    return prompt_ids(msgs, use_chat, gen_);
  }
  std::vector<int32_t> prompt_ids(const std::vector<ChatMessage>& msgs, bool use_chat,
                                  const GenerateOptions& o) const;
  // A conversation with tools and switches (serve's chat requests) through the chat template; `reply_start`
  // is text appended after the generation prompt (the start of a forced tool call). Checked as above;
  // `text`, when given, gets the prompt's text.
  std::vector<int32_t> prompt_ids(const Conversation& c, const std::string& reply_start,
                                  const GenerateOptions& o, std::string* text = nullptr) const;
  // The ids of msgs as prompt_ids makes them, unchecked.
  std::vector<int32_t> encode_messages(const std::vector<ChatMessage>& msgs, bool use_chat) const;
  // Whether a prompt of n tokens and the generation of `o` (default: the session's) fit the model's
  // context (check_prompt's test).
  bool fits_context(size_t n) const { return fits_context(n, gen_); }
  bool fits_context(size_t n, const GenerateOptions& o) const {
    return canvas_length(static_cast<int64_t>(n), o) <= engine_->config().max_positions;
  }
  // Throws unless the token ids fit the context with the generation of `o` and lie in the vocabulary
  // (tokenized: they came from the tokenizer, which the message then blames).
  void check_prompt(const std::vector<int32_t>& ids, const GenerateOptions& o, bool tokenized) const;
  // Throws unless every id lies in the model's vocabulary ("token id N <of>is outside ...").
  void check_vocab(std::span<const int32_t> ids, const std::string& of = "") const;
  // check_prompt's test of a prompt's length alone (n tokens; the C API's memory plan).
  void check_length(size_t n, const GenerateOptions& o) const;
  // A block-causal model (LLaDA2), and its attention block as loaded (the engine's changes with each
  // request's block length; these do not, so that other threads may read them while one generates).
  bool block_causal() const { return model_block_ > 0; }
  int model_block() const { return model_block_; }
  bool has_chat_template() const { return !chat_.empty(); }
  // The model's own chat template, or its family's built-in one (chat_template().builtin()), or none.
  const ChatTemplate& chat_template() const { return chat_; }
  bool adds_bos() const { return add_bos_; }  // raw prompts start with the model's BOS
  // The ids of an infilling suffix (GenerateOptions::suffix); throws, naming it `what`, for text that is
  // not UTF-8 or whose tokens hold the mask token.
  std::vector<int32_t> suffix_ids(const std::string& text, const std::string& what) const;
  struct Output {
    std::string text;
    GenerateResult result;
    double seconds = 0;
    // The first step (planning, the first forward of each shape, primitives made) and the median of
    // the later steps, each from the end of the step before (on_step's own time included).
    double first_step_seconds = 0, steady_step_seconds = 0;
    bool stopped = false;  // the text was cut before a stop sequence (result.tokens trimmed with it)
  };
  // Generates with the options `o` (validated by the caller), calling on_step after every step.
  Output run(const std::vector<int32_t>& prompt, const GenerateOptions& o,
             const std::function<void(const StepEvent&)>& on_step);
  // The same through a Batcher over this session's engine, from any thread: a request whose plan shares
  // forwards (RequestPlan::shares_forwards) shares forwards with the others running at the same time (its
  // unmasking loop and on_step run on the calling thread); any other request, or every request when the batch
  // size is 1, runs alone on the engine thread (one at a time). key: the request's name, alike on every
  // rank when the batcher runs over ranks (Batcher::generate); there a generation that runs alone agrees
  // after every step with rank 0 whether it goes on (Batcher::agree_stop).
  Output run(Batcher& b, const std::vector<int32_t>& prompt, const GenerateOptions& o,
             const std::function<void(const StepEvent&)>& on_step, uint64_t key = 0);
  const Tokenizer& tokenizer() const { return *tok_; }
  Engine& engine() { return *engine_; }
  // Over ranks (--tp / --ep), a rank other than 0: it runs what rank 0 runs and reports nothing.
  bool follower() const { return engine_->options().comm && engine_->options().comm->rank() != 0; }
  const Engine& engine() const { return *engine_; }
  const ModelConfig& config() const { return engine_->config(); }
  const GenerateOptions& options() const { return gen_; }
  // The text of chat messages with the model's template (throws Error when it has none).
  std::string chat_text(const std::vector<ChatMessage>& msgs, bool add_generation_prompt = true) const;
  // The chat template's thinking switch (enable_thinking) for chat_text; nullopt: the template's default.
  // Throws Error when the template has none.
  void set_thinking(std::optional<bool> on);
  // Structured output: the constraint of a JSON grammar (then `suffix`) over this model's vocabulary,
  // ending at its EOS (GenerateOptions::constraint). Throws Error for a vocabulary that cannot write every
  // completion.
  std::shared_ptr<const TokenConstraint> json_output(std::shared_ptr<const JsonGrammar> grammar,
                                                     std::string suffix = "") const;
  // --logprobs N: the most likely tokens reported per generated token.
  int logprobs_top() const { return logprobs_top_; }
  std::string model_dir() const { return dir_; }
  // The canvas of a request: prompt + gen_length, padded to whole blocks for block-causal models.
  int64_t canvas_length(int64_t prompt_len) const { return canvas_length(prompt_len, gen_); }
  int64_t canvas_length(int64_t prompt_len, const GenerateOptions& o) const;

 private:
  // Throws, before tokenizing, for prompt text longer than any prompt that fits the context.
  void check_prompt_bytes(size_t bytes) const;
  // chat_text without its UTF-8 check of the messages.
  std::string templated(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  // Runs a generation, timed, and decodes its tokens; cuts them before the first of g's stop sequences.
  // gen receives the options and on_step wrapped with the step timer.
  using StepFn = std::function<void(const StepEvent&)>;
  Output timed(const GenerateOptions& g, const StepFn& on_step,
               const std::function<GenerateResult(const GenerateOptions&, const StepFn&)>& gen) const;
  void measure_runtime();
  std::string dir_;
  std::unique_ptr<Engine> engine_;
  std::optional<Tokenizer> tok_;
  ChatTemplate chat_;
  std::optional<bool> thinking_;
  mutable std::once_flag vocab_once_;  // json_output's table of the tokens' bytes, built on first use
  mutable std::shared_ptr<const VocabBytes> vocab_bytes_;
  bool add_bos_ = false;
  int model_block_ = 0;
  size_t max_prompt_bytes_ = 0;  // prompt_ids refuses longer text untokenized
  GenerateOptions gen_;
  int logprobs_top_ = 0;
  // generation_config.json's tessera keys (defaults())
  std::optional<int> gc_gen_length_, gc_block_length_, gc_steps_;
  std::optional<float> gc_threshold_, gc_temperature_, gc_top_p_, gc_edit_penalty_;
  std::optional<int> gc_top_k_;
  std::optional<std::string> gc_alg_;
};

// A uniform-noise model's (DiffusionGemma's) own decoding: mode uniform, canvases of its canvas_length,
// generation_config.json's steps, sampler and EOS ids, for `gen_length` tokens.
GenerateOptions uniform_defaults(const ModelConfig& mc, int gen_length);

// Token ids of raw text (no chat template), `bos` first when it is >= 0.
std::vector<int32_t> encode_raw(const Tokenizer& t, const std::string& text, int64_t bos);

// Where the first of the stop sequences begins in text (the earliest; std::string::npos: none).
size_t find_stop(std::string_view text, const std::vector<std::string>& stop);
// GenerateOptions::stop_when for the stop sequences: whether the text of the tokens holds one (none
// without stop sequences). `t` must outlive it.
std::function<bool(std::span<const int32_t>)> stop_checker(const Tokenizer& t,
                                                           const std::vector<std::string>& stop);
// Cuts a generation before the first of the stop sequences: `text` (the decoded tokens) ends before it
// and the tokens (and their log-probabilities) keep those whose text lies wholly before it. False, and
// nothing changed, when no stop sequence is in the text.
bool cut_at_stop(const Tokenizer& t, const std::vector<std::string>& stop, GenerateResult& r,
                 std::string& text);

// The directory of the bundled default model (models/tessera-tiny); throws with a hint otherwise.
std::string default_model_dir();
// Peak resident memory of this process in bytes.
size_t peak_rss_bytes();
// Device memory in use on the engine's GPU (total minus free: this process's and any other's); -1 on
// the CPU.
int64_t device_bytes_in_use(Engine& e);
std::string human_bytes(double b);
// Throws Error when `s` is not valid UTF-8.
void check_utf8(const std::string& s, const char* what);

}  // namespace tessera
