// tessera._tessera: the Python binding of the C API (include/tessera/tessera.h). It only translates:
// Python values to the C structs and back, statuses to exceptions, and the GIL (released while the engine
// runs, taken again for a step callback). The Pythonic surface (LLM, SamplingParams, streams) is
// tessera/__init__.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/tessera.h"

namespace py = pybind11;

namespace {

PyObject* g_error = nullptr;  // tessera.TesseraError and its kinds, made at import
PyObject* g_invalid = nullptr;
PyObject* g_model_error = nullptr;
PyObject* g_budget = nullptr;
PyObject* g_cancelled = nullptr;

[[noreturn]] void raise(tessera_status s) {
  PyObject* type = s == TESSERA_ERROR_INVALID_ARGUMENT ? g_invalid
                   : s == TESSERA_ERROR_MODEL          ? g_model_error
                   : s == TESSERA_ERROR_MEMORY_BUDGET  ? g_budget
                   : s == TESSERA_ERROR_CANCELLED      ? g_cancelled
                                                       : g_error;
  PyErr_SetString(type, tessera_last_error());
  throw py::error_already_set();
}

void check(tessera_status s) {
  if (s != TESSERA_OK) raise(s);
}

// The C API's two calls for a caller's buffer: the size it needs, then the filled buffer (text: a
// std::string, its NUL included in the capacity; token ids: a vector).
template <class T, class F>
auto filled(F call) {
  using Out = std::conditional_t<std::is_same_v<T, char>, std::string, std::vector<T>>;
  constexpr size_t nul = std::is_same_v<T, char> ? 1 : 0;
  size_t n = 0;
  const tessera_status s = call(nullptr, 0, &n);
  if (s == TESSERA_OK) return Out();
  if (s != TESSERA_ERROR_BUFFER_TOO_SMALL) check(s);
  Out out(n + nul, T{});
  check(call(out.data(), out.size(), &n));
  out.resize(n);
  return out;
}

std::vector<tessera_chat_message> c_messages(const std::vector<std::pair<std::string, std::string>>& msgs) {
  std::vector<tessera_chat_message> out;
  for (const auto& [role, content] : msgs) out.push_back({role.c_str(), content.c_str()});
  return out;
}

// Generation options from a dict of field names (those of tessera_generate_options) over the model's
// defaults; strings held for the call.
struct Options {
  tessera_generate_options c{};
  std::vector<std::string> stop;
  std::vector<const char*> stop_ptrs;
  std::optional<std::string> suffix;
};

template <class T>
T get(const py::handle& v, const std::string& key) {
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    PyErr_SetString(g_invalid, ("option '" + key + "' has the wrong type (" +
                                std::string(py::str(py::type::of(v).attr("__name__"))) + ")")
                                   .c_str());
    throw py::error_already_set();
  }
}

std::unique_ptr<Options> c_options(tessera_model* m, const py::dict& d) {
  auto o = std::make_unique<Options>();
  check(tessera_generate_options_init(m, &o->c));
  tessera_generate_options& c = o->c;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k);
    if (v.is_none()) continue;
#define TESSERA_FIELD(name, type) \
  if (key == #name) {             \
    c.name = get<type>(v, key);   \
    continue;                     \
  }
    TESSERA_FIELD(gen_length, int32_t)
    TESSERA_FIELD(steps, int32_t)
    TESSERA_FIELD(block_length, int32_t)
    TESSERA_FIELD(temperature, float)
    TESSERA_FIELD(alg, int32_t)
    TESSERA_FIELD(threshold, float)
    TESSERA_FIELD(cfg_scale, float)
    TESSERA_FIELD(top_k, int32_t)
    TESSERA_FIELD(top_p, float)
    TESSERA_FIELD(alg_temp, float)
    TESSERA_FIELD(seed, uint64_t)
    TESSERA_FIELD(cache, int32_t)
    TESSERA_FIELD(sparse, int32_t)
    TESSERA_FIELD(sparse_block, int32_t)
    TESSERA_FIELD(sparse_rho, float)
    TESSERA_FIELD(sparse_skip, float)
    TESSERA_FIELD(des, int32_t)
    TESSERA_FIELD(des_k, int32_t)
    TESSERA_FIELD(des_beta, float)
    TESSERA_FIELD(des_scope, int32_t)
    TESSERA_FIELD(window, int32_t)
    TESSERA_FIELD(window_ex, int32_t)
    TESSERA_FIELD(window_in, int32_t)
    TESSERA_FIELD(window_refresh, int32_t)
    TESSERA_FIELD(window_early_stop, int32_t)
    TESSERA_FIELD(edit, int32_t)
    TESSERA_FIELD(edit_threshold, float)
    TESSERA_FIELD(max_post_steps, int32_t)
    TESSERA_FIELD(edit_penalty, float)
    TESSERA_FIELD(logprobs, int32_t)
    TESSERA_FIELD(stop_at_eos, int32_t)
    TESSERA_FIELD(mode, int32_t)
    TESSERA_FIELD(spec_sampling, int32_t)
    TESSERA_FIELD(draft_threshold, float)
    TESSERA_FIELD(t_min, double)
    TESSERA_FIELD(t_max, double)
    TESSERA_FIELD(entropy_bound, double)
    TESSERA_FIELD(stability, int32_t)
    TESSERA_FIELD(confidence, double)
#undef TESSERA_FIELD
    if (key == "edit_mode") {
      check(tessera_generate_options_edit_preset(&c, get<std::string>(v, key).c_str()));
      continue;
    }
    if (key == "stop") {
      o->stop = get<std::vector<std::string>>(v, key);
      continue;
    }
    if (key == "suffix") {
      o->suffix = get<std::string>(v, key);
      continue;
    }
    PyErr_SetString(g_invalid, ("unknown option '" + key + "'").c_str());
    throw py::error_already_set();
  }
  for (const std::string& s : o->stop) o->stop_ptrs.push_back(s.c_str());
  c.stop = o->stop_ptrs.data();
  c.n_stop = o->stop_ptrs.size();
  c.suffix = o->suffix ? o->suffix->c_str() : nullptr;
  return o;
}

// Generated text need not be valid UTF-8 (a byte-level model may stop inside a character): invalid bytes
// become U+FFFD, as in the CLI's JSON; the token ids stay exact.
py::str utf8_text(const std::string& s) {
  PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (u == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(u);
}

py::dict result_dict(const tessera_result* r) {
  const int32_t* ids = nullptr;
  const size_t n = tessera_result_tokens(r, &ids);
  tessera_result_stats st{};
  st.struct_size = sizeof st;
  tessera_result_stats_get(r, &st);
  py::list logprobs;
  for (size_t i = 0; i < n; ++i) {
    float lp = 0;
    int32_t step = -1;
    const tessera_top_logprob* top = nullptr;
    const size_t k = tessera_result_logprob(r, i, &lp, &step, &top);
    if (step < 0) break;  // no log-probabilities asked for
    py::list alts;
    for (size_t j = 0; j < k; ++j) alts.append(py::make_tuple(top[j].token, top[j].logprob));
    logprobs.append(py::make_tuple(ids[i], lp, step, alts));
  }
  const tessera_edit* edits = nullptr;
  const size_t ne = tessera_result_edits(r, &edits);
  py::list el;
  for (size_t i = 0; i < ne; ++i)
    el.append(py::make_tuple(edits[i].step, edits[i].position, edits[i].from, edits[i].to));
  py::dict d;
  d["text"] = utf8_text(tessera_result_text(r));
  d["tokens"] = std::vector<int32_t>(ids, ids + n);
  d["finish_reason"] = tessera_result_finish_reason(r) == TESSERA_FINISH_STOP ? "stop" : "length";
  d["prompt_tokens"] = st.prompt_tokens;
  d["steps"] = st.steps;
  d["forwards"] = st.forwards;
  d["seconds"] = st.seconds;
  d["first_step_seconds"] = st.first_step_seconds;
  d["logprobs"] = logprobs;
  d["edits"] = el;
  return d;
}

// The step callback: takes the GIL, calls the Python callable with the event as a dict; a true answer
// cancels, an exception is kept (and re-raised after the call) and cancels.
struct Callback {
  py::object fn;
  std::exception_ptr error;
};

int32_t trampoline(const tessera_step_event* ev, void* user) {
  auto* cb = static_cast<Callback*>(user);
  py::gil_scoped_acquire gil;
  if (cb->error) return 1;
  try {
    py::dict d;
    d["sequence"] = ev->sequence;
    d["step"] = ev->step;
    d["canvas"] = std::vector<int32_t>(ev->canvas, ev->canvas + ev->canvas_len);
    d["prompt_len"] = ev->prompt_len;
    d["committed"] = ev->committed;
    d["mask_token"] = ev->mask_token;
    d["decided"] = std::vector<int32_t>(ev->decided, ev->decided + ev->n_decided);
    py::list edits;
    for (size_t i = 0; i < ev->n_edits; ++i)
      edits.append(
          py::make_tuple(ev->edits[i].step, ev->edits[i].position, ev->edits[i].from, ev->edits[i].to));
    d["edits"] = edits;
    return py::bool_(cb->fn(d)) ? 1 : 0;
  } catch (...) {
    cb->error = std::current_exception();
    return 1;
  }
}

class Model {
 public:
  Model(std::optional<std::string> path, const std::string& device, int precision, uint64_t memory_budget,
        int threads, bool dequantize, int max_batch) {
    tessera_model_params p;
    tessera_model_params_init(&p);
    p.device = device.c_str();
    p.precision = precision;
    p.memory_budget = memory_budget;
    p.threads = threads;
    p.dequantize = dequantize;
    p.max_batch = max_batch;
    tessera_status s;
    {
      py::gil_scoped_release nogil;
      s = tessera_model_open(path ? path->c_str() : nullptr, &p, &m_);
    }
    check(s);
  }
  ~Model() { tessera_model_close(m_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  py::dict info() const {
    tessera_model_info i{};
    i.struct_size = sizeof i;
    check(tessera_model_info_get(m_, &i));
    py::dict d;
    d["vocab_size"] = i.vocab_size;
    d["max_positions"] = i.max_positions;
    d["mask_token"] = i.mask_token;
    d["bos_token"] = i.bos_token;
    d["eos_token"] = i.eos_token;
    d["attention_block"] = i.attention_block;
    d["has_chat_template"] = i.has_chat_template != 0;
    d["adds_bos"] = i.adds_bos != 0;
    d["weight_bytes"] = i.weight_bytes;
    d["family"] = i.family;
    d["path"] = i.path;
    return d;
  }

  std::vector<int32_t> tokenize(const std::string& text) const {
    return filled<int32_t>(
        [&](int32_t* buf, size_t cap, size_t* n) { return tessera_tokenize(m_, text.c_str(), buf, cap, n); });
  }

  py::str detokenize(const std::vector<int32_t>& ids, bool skip_special) const {
    return utf8_text(filled<char>([&](char* buf, size_t cap, size_t* n) {
      return tessera_detokenize(m_, ids.data(), ids.size(), skip_special, buf, cap, n);
    }));
  }

  py::str chat_apply(const std::vector<std::pair<std::string, std::string>>& msgs,
                     bool add_generation_prompt) const {
    const auto c = c_messages(msgs);
    return utf8_text(filled<char>([&](char* buf, size_t cap, size_t* n) {
      return tessera_chat_apply(m_, c.data(), c.size(), add_generation_prompt, buf, cap, n);
    }));
  }

  std::vector<int32_t> prompt_tokens(const std::vector<std::pair<std::string, std::string>>& msgs,
                                     bool use_chat) const {
    const auto c = c_messages(msgs);
    return filled<int32_t>([&](int32_t* buf, size_t cap, size_t* n) {
      return tessera_prompt_tokens(m_, c.data(), c.size(), use_chat, buf, cap, n);
    });
  }

  // Generates for every prompt (one: tessera_generate; several: tessera_generate_batch), the GIL released.
  py::list generate(const std::vector<std::vector<int32_t>>& prompts, const py::dict& options,
                    const py::object& on_step) {
    const auto o = c_options(m_, options);
    Callback cb{on_step, nullptr};
    const tessera_step_callback fn = on_step.is_none() ? nullptr : trampoline;
    std::vector<tessera_result*> results(prompts.size(), nullptr);
    tessera_status s;
    {
      py::gil_scoped_release nogil;
      if (prompts.size() == 1) {
        s = tessera_generate(m_, prompts[0].data(), prompts[0].size(), &o->c, fn, &cb, results.data());
      } else {
        std::vector<const int32_t*> ptrs;
        std::vector<size_t> lens;
        for (const auto& p : prompts) {
          ptrs.push_back(p.data());
          lens.push_back(p.size());
        }
        s = tessera_generate_batch(m_, ptrs.data(), lens.data(), prompts.size(), &o->c, fn, &cb,
                                   results.data());
      }
    }
    if (cb.error) {
      for (auto* r : results) tessera_result_free(r);
      std::rethrow_exception(cb.error);
    }
    check(s);
    py::list out;
    for (auto* r : results) {
      out.append(result_dict(r));
      tessera_result_free(r);
    }
    return out;
  }

  py::dict plan(size_t prompt_len, const py::dict& options) {
    const auto o = c_options(m_, options);
    tessera_memory_plan p{};
    p.struct_size = sizeof p;
    tessera_status s;
    {
      py::gil_scoped_release nogil;
      s = tessera_plan(m_, prompt_len, &o->c, &p);
    }
    check(s);
    py::dict d;
    d["canvas"] = p.canvas;
    d["logit_rows"] = p.logit_rows;
    d["kv_cache_rows"] = p.kv_cache_rows;
    d["weight_bytes"] = p.weight_bytes;
    d["activation_bytes"] = p.activation_bytes;
    d["lower_bound_bytes"] = p.lower_bound_bytes;
    d["k_ffn"] = p.k_ffn;
    d["k_logits"] = p.k_logits;
    d["memory_budget"] = p.memory_budget;
    d["shares_forwards"] = p.shares_forwards != 0;
    return d;
  }

  py::dict default_options() const {
    tessera_generate_options o;
    check(tessera_generate_options_init(m_, &o));
    py::dict d;
    d["gen_length"] = o.gen_length;
    d["alg"] = static_cast<int>(o.alg);
    d["threshold"] = o.threshold;
    return d;
  }

 private:
  tessera_model* m_ = nullptr;
};

PyObject* new_error(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string full = std::string("tessera.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (e == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(e);
  return e;
}

}  // namespace

PYBIND11_MODULE(_tessera, m) {
  m.doc() = "tessera's C API (include/tessera/tessera.h) for Python; use the tessera package";
  m.attr("__version__") = tessera_version();
  g_error = new_error(m, "TesseraError", PyExc_RuntimeError, "An error of the tessera engine.");
  g_invalid = new_error(m, "InvalidArgumentError",
                        py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)).release().ptr(),
                        "A bad option, prompt or token id.");
  g_model_error = new_error(m, "ModelError", g_error, "The model could not be opened.");
  g_budget = new_error(m, "MemoryBudgetError", g_error, "The request cannot fit the memory budget.");
  g_cancelled = new_error(m, "Cancelled", g_error, "The generation was cancelled.");
  m.def(
      "parse_size",
      [](const std::string& text) {
        uint64_t bytes = 0;
        check(tessera_parse_size(text.c_str(), &bytes));
        return bytes;
      },
      "A memory size as --memory-budget takes it (\"2GiB\", \"512MiB\", \"1.5GB\", bytes), in bytes.");
  py::class_<Model>(m, "Model")
      .def(py::init<std::optional<std::string>, const std::string&, int, uint64_t, int, bool, int>(),
           py::arg("path"), py::arg("device"), py::arg("precision"), py::arg("memory_budget"),
           py::arg("threads"), py::arg("dequantize"), py::arg("max_batch"))
      .def("info", &Model::info)
      .def("tokenize", &Model::tokenize)
      .def("detokenize", &Model::detokenize, py::arg("ids"), py::arg("skip_special"))
      .def("chat_apply", &Model::chat_apply)
      .def("prompt_tokens", &Model::prompt_tokens)
      .def("generate", &Model::generate)
      .def("plan", &Model::plan)
      .def("default_options", &Model::default_options);
}
