// Fuzz targets: tessera's readers of untrusted bytes, each driven the way a user's input reaches it.
// A target returns "" when tessera accepted the input and did its work with it, or the message of the
// tessera::Error it refused the input with. Anything else is a finding: a crash or a sanitizer report
// (under the fuzzer or ASan), an exception that is not tessera::Error (no clear message: thrown here
// as Finding), or a broken invariant of the target (Finding too).
//
// The same targets run under libFuzzer (tests/fuzz/fuzz_main.cpp, -DTESSERA_FUZZ=ON with clang) and
// in the unit tests, which replay the committed corpus (tests/fuzz/corpus/TARGET/) on every CI run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera::fuzz {

struct Finding : std::logic_error {
  using std::logic_error::logic_error;
};

// model: the bytes are a model as `tessera generate -m` takes it. A GGUF file when they start with
// "GGUF"; otherwise a Hugging Face directory packed as, for each file, a line "#tessera-fuzz-file NAME"
// and then its bytes (NAME: config.json, model.safetensors, tokenizer.json, tokenizer_config.json or
// generation_config.json; others are ignored; tests/fuzz/make_seeds.py writes them). The model is loaded as
// the CLI loads it (Session: engine, tokenizer, chat template, generation defaults) and generates 4 tokens,
// then 8 with each approximation the model takes (KV cache, SparseD, Window-Diffusion, DES on MoE).
std::string model(std::span<const uint8_t> data);

// How many approximation variants `model` has generated with in this process (for the tests).
int64_t model_variants_run();

// tokenize: the bytes are text. Encoded with tessera-tiny's tokenizer (byte-level BPE, no normalizer)
// and, where ../shared is present, the Qwen2 tokenizer (NFC normalizer): decoding the ids gives the
// text back (Qwen2: its NFC form when the text is valid UTF-8), special tokens parsed or not, and the
// token texts concatenate to the same bytes.
std::string tokenize(std::span<const uint8_t> data);

// llama2c: the bytes are a llama2.c checkpoint (model.bin), converted with stories260K's tok512.bin
// (needs ../shared; "" without it) by `tessera convert-llama2c`, then loaded and run like `model`.
std::string llama2c(std::span<const uint8_t> data);

// request: the bytes are a request to `tessera serve`: the first byte picks the route (bit 0: chat
// completions, else completions) and the model (bit 1: tessera-tiny-moe, else tessera-tiny), the rest
// is the POST body. Parsed as the server parses it (parse_request); a refusal is a 400 or 404 whose
// body is a JSON error object; an accepted request is generated when it is short (gen_length and steps
// <= 16).
std::string request(std::span<const uint8_t> data);

// jinja: the bytes are a chat template. Parsed and rendered (io/jinja) with a conversation that has a
// system turn, tools, a tool call, a tool result and the generation prompt, under small limits (200,000
// steps, 1 MiB of output): a template that loops or grows without bound is refused, never a hang.
std::string jinja(std::span<const uint8_t> data);

// Runs the target named `name` (model | tokenize | llama2c | request); Finding for an unknown name.
std::string run(std::string_view name, std::span<const uint8_t> data);

}  // namespace tessera::fuzz
