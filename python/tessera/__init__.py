"""tessera: an inference engine for diffusion language models, from Python.

    import tessera
    llm = tessera.LLM("models/tessera-tiny")
    out = llm.generate("Once upon a time", tessera.SamplingParams(gen_length=32, steps=32))[0]
    print(out.text, out.finish_reason, out.timings)

    for ev in llm.stream("Once upon a time", tessera.SamplingParams(gen_length=32)):
        print(ev.step, ev.committed_text)           # the canvas denoising, step by step

The engine runs with the GIL released; a step callback or a stream takes it only to hand over an event.
Every decoding option of `tessera generate` is a field of SamplingParams (None: the model's default).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

from ._tessera import (Cancelled, InvalidArgumentError, MemoryBudgetError, Model, ModelError,  # noqa: F401
                       TesseraError, __version__, parse_size)

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CanvasEvent", "Stream", "TesseraError",
           "InvalidArgumentError", "ModelError", "MemoryBudgetError", "Cancelled", "__version__"]

_ALGS = {"low_confidence": 0, "random": 1, "origin": 2, "maskgit_plus": 3, "topk_margin": 4, "entropy": 5}
_CACHES = {"none": 0, "prefix": 1, "dual": 2}
_MODES = {"diffusion": 0, "ar": 1, "spec": 2, "uniform": 3}
_SPEC_SAMPLING = {"match": 0, "rejection": 1}
_DES = {"off": 0, "seq": 1, "vote": 2}
_DES_SCOPES = {"block": 0, "all": 1}
_PRECISIONS = {"auto": 0, "bf16": 1, "f32": 2}


def _choice(table: dict, value: str, what: str) -> int:
    if value not in table:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(table)}, got {value!r}")
    return table[value]


@dataclasses.dataclass
class SamplingParams:
    """The decoding options of one request; each is the `tessera generate` flag of the same name.

    None leaves the model's default (its generation_config.json): steps and block_length then follow
    gen_length as they do on the command line; temperature, top_k and top_p are the model's (else 0,
    off and off). logprobs=N reports each token's log-probability with
    N alternatives (0..20). edit_mode ("quality" / "speed") sets the token-editing preset; the editing
    fields given beside it override it.
    """
    gen_length: Optional[int] = None
    steps: Optional[int] = None
    block_length: Optional[int] = None
    temperature: Optional[float] = None
    alg: Optional[str] = None
    threshold: Optional[float] = None
    cfg: float = 0.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    alg_temp: float = 0.0
    seed: int = 0
    cache: str = "none"
    sparse: bool = False
    sparse_block: Optional[int] = None
    sparse_rho: Optional[float] = None
    sparse_skip: Optional[float] = None
    des: Optional[str] = None
    des_k: Optional[int] = None
    des_beta: Optional[float] = None
    des_scope: str = "block"
    window: bool = False
    window_ex: Optional[int] = None
    window_in: Optional[int] = None
    window_refresh: Optional[int] = None
    window_early_stop: bool = False
    edit_mode: Optional[str] = None
    edit_threshold: Optional[float] = None
    max_post_steps: Optional[int] = None
    edit_penalty: Optional[float] = None
    stop: Sequence[str] = ()
    suffix: Optional[str] = None
    logprobs: Optional[int] = None
    stop_at_eos: bool = True
    mode: Optional[str] = None  # the model's own; ar / spec: tri-mode models (Nemotron-Labs-Diffusion)
    spec_sampling: str = "match"  # spec at temperature > 0: match | rejection
    draft_threshold: float = 0.0  # spec's drafts: 0 one pass
    # uniform-noise models (DiffusionGemma): the entropy-bound sampler (None: generation_config.json's)
    t_min: Optional[float] = None
    t_max: Optional[float] = None
    entropy_bound: Optional[float] = None
    stability: Optional[int] = None
    confidence: Optional[float] = None

    def _options(self) -> dict:
        """The C API's fields (tessera_generate_options), as the CLI derives them from its flags."""
        o = {
            "gen_length": self.gen_length, "steps": self.steps, "block_length": self.block_length,
            "temperature": self.temperature, "cfg_scale": self.cfg, "top_k": self.top_k, "top_p": self.top_p,
            "alg_temp": self.alg_temp, "seed": self.seed, "cache": _choice(_CACHES, self.cache, "cache"),
            "spec_sampling": _choice(_SPEC_SAMPLING, self.spec_sampling, "spec_sampling"),
            "draft_threshold": self.draft_threshold,
            "des_scope": _choice(_DES_SCOPES, self.des_scope, "des_scope"),
            "stop": list(self.stop), "suffix": self.suffix, "stop_at_eos": int(bool(self.stop_at_eos)),
            "logprobs": -1 if self.logprobs is None else self.logprobs,
        }
        if self.alg is not None:
            o["alg"] = _choice(_ALGS, self.alg, "alg")
        if self.mode is not None:
            o["mode"] = _choice(_MODES, self.mode, "mode")
        o.update(t_min=self.t_min, t_max=self.t_max, entropy_bound=self.entropy_bound, stability=self.stability,
                 confidence=self.confidence)
        # Each family of options is on when asked for or when one of its values is given (as the flags).
        o["sparse"] = int(self.sparse or any(v is not None for v in
                                             (self.sparse_block, self.sparse_rho, self.sparse_skip)))
        o.update(sparse_block=self.sparse_block, sparse_rho=self.sparse_rho, sparse_skip=self.sparse_skip)
        if self.des is not None:
            o["des"] = _choice(_DES, self.des, "des")
        elif self.des_k is not None and self.des_beta is not None:
            raise InvalidArgumentError("des_k (DES-Seq) and des_beta (DES-Vote) need des to say which")
        elif self.des_k is not None:
            o["des"] = _DES["seq"]
        elif self.des_beta is not None:
            o["des"] = _DES["vote"]
        o.update(des_k=self.des_k, des_beta=self.des_beta)
        o["window"] = int(self.window or self.window_early_stop or any(
            v is not None for v in (self.window_ex, self.window_in, self.window_refresh)))
        o.update(window_ex=self.window_ex, window_in=self.window_in, window_refresh=self.window_refresh,
                 window_early_stop=int(self.window_early_stop))
        # Editing: the preset first, then the values given (the CLI's apply_edit_flags).
        if self.edit_mode is not None:
            o["edit_mode"] = self.edit_mode
            if self.edit_mode == "off" and any(v is not None for v in (self.edit_threshold, self.max_post_steps,
                                                                        self.edit_penalty)):
                raise InvalidArgumentError("edit_mode 'off' cannot take editing values beside it")
        if self.edit_threshold is not None:
            o["edit"] = 1
            o["edit_threshold"] = self.edit_threshold
        o.update(max_post_steps=self.max_post_steps, edit_penalty=self.edit_penalty)
        if self.threshold is not None:
            o["threshold"] = self.threshold
        # Ordered so that the preset is applied before the values that override it.
        first = {k: o.pop(k) for k in ("gen_length", "steps", "block_length", "edit_mode") if k in o}
        return {**first, **o}


@dataclasses.dataclass
class RequestOutput:
    """One prompt's answer: its text (cut before a stop sequence), token ids, why it ended ("stop": an EOS
    or a stop sequence; "length": gen_length tokens), timings and, when asked for, log-probabilities
    [(token, logprob, step, [(alternative, logprob), ...])] and token edits [(step, position, from, to)]."""
    text: str
    token_ids: List[int]
    finish_reason: str
    prompt_token_ids: List[int]
    steps: int
    forwards: int
    timings: dict
    logprobs: Optional[list] = None
    edits: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CanvasEvent:
    """One denoising step: the whole canvas (prompt, generation, suffix), the positions it decided or
    rewrote, and the committed boundary: canvas[prompt_len:committed] is final, the rest provisional
    (mask_token where undecided). committed_text is the final part's text."""
    sequence: int
    step: int
    canvas: List[int]
    prompt_len: int
    committed: int
    mask_token: int
    decided: List[int]
    edits: List[Tuple[int, int, int, int]]
    committed_text: str = ""

    @property
    def masked(self) -> int:
        return sum(1 for t in self.canvas[self.prompt_len:] if t == self.mask_token)


def _output(d: dict, prompt: List[int], want_logprobs: bool) -> RequestOutput:
    return RequestOutput(text=d["text"], token_ids=list(d["tokens"]), finish_reason=d["finish_reason"],
                         prompt_token_ids=list(prompt), steps=d["steps"], forwards=d["forwards"],
                         timings={"seconds": d["seconds"], "first_step_seconds": d["first_step_seconds"]},
                         logprobs=d["logprobs"] if want_logprobs else None, edits=d["edits"])


Prompt = Union[str, Sequence[int]]
Message = Union[dict, Tuple[str, str]]


class LLM:
    """A model opened once: generate(), chat(), stream(), plan(), tokenize() / detokenize().

    path: a model directory or .gguf file (None: the bundled default, found from the working directory);
    device "cpu" or "cuda"; precision "auto", "bf16" or "f32"; memory_budget in bytes (0: none) or a
    string such as "2GiB"; threads: OpenMP threads for the process (0: OMP_NUM_THREADS or all); max_batch:
    the most prompts of one generate() call packed into a forward.
    """

    def __init__(self, path: Optional[str] = None, *, device: str = "cpu", precision: str = "auto",
                 memory_budget: Union[int, str] = 0, threads: int = 0, dequantize: bool = False,
                 max_batch: int = 8):
        if isinstance(memory_budget, str):
            memory_budget = parse_size(memory_budget)
        if not isinstance(memory_budget, int) or memory_budget < 0:
            raise InvalidArgumentError(f"memory_budget must be a size in bytes >= 0, got {memory_budget!r}")
        self._m = Model(None if path is None else str(path), device, _choice(_PRECISIONS, precision, "precision"),
                        memory_budget, threads, dequantize, max_batch)
        self.info = self._m.info()

    # ---- text ----
    def tokenize(self, text: str) -> List[int]:
        return self._m.tokenize(text)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._m.detokenize(list(ids), skip_special)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return self._m.chat_apply(_messages(messages), add_generation_prompt)

    def _prompt(self, p: Prompt) -> List[int]:
        if isinstance(p, str):
            return self._m.prompt_tokens([("user", p)], False)  # raw, after BOS where the model adds one
        return [int(t) for t in p]

    # ---- generation ----
    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], params: Optional[SamplingParams] = None,
                 on_step: Optional[Callable[[CanvasEvent], Optional[bool]]] = None) -> List[RequestOutput]:
        """Generates for a prompt or a list of prompts (text, used raw, or token ids); several prompts share
        packed forwards. on_step(event) runs after every step; returning True cancels (Cancelled)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [self._prompt(p) for p in prompts]
        return self._run(ids, params or SamplingParams(), on_step)

    def chat(self, messages: Sequence[Message], params: Optional[SamplingParams] = None,
             on_step: Optional[Callable[[CanvasEvent], Optional[bool]]] = None) -> RequestOutput:
        """Answers a conversation ([{"role": ..., "content": ...}] or [(role, content)]) through the
        model's chat template."""
        ids = self._m.prompt_tokens(_messages(messages), True)
        return self._run([ids], params or SamplingParams(), on_step)[0]

    def stream(self, prompt: Union[Prompt, Sequence[Message]], params: Optional[SamplingParams] = None,
               *, chat: bool = False) -> "Stream":
        """An iterator of the canvas events of one generation (run on a thread of its own); its result is
        stream.output once the iteration ends. Closing it (close(), the end of a with block, or dropping it)
        cancels the generation at its next step."""
        ids = self._m.prompt_tokens(_messages(prompt), True) if chat else self._prompt(prompt)
        return Stream(self, ids, params or SamplingParams())

    def plan(self, prompt: Union[Prompt, int], params: Optional[SamplingParams] = None) -> dict:
        """The memory plan of a request (its largest step): canvas, logit rows, KV cache rows, weight and
        activation bytes, chunk counts. Raises MemoryBudgetError when it cannot fit the budget."""
        n = prompt if isinstance(prompt, int) else len(self._prompt(prompt))
        return self._m.plan(n, (params or SamplingParams())._options())

    def _event(self, d: dict, stop_at_eos: bool) -> CanvasEvent:
        ev = CanvasEvent(**d)
        final = ev.canvas[ev.prompt_len:ev.committed]
        eos = self.info["eos_token"]
        if stop_at_eos and eos in final:  # the answer ends at its first EOS
            final = final[:final.index(eos)]
        ev.committed_text = self._m.detokenize(final, True)
        return ev

    def _run(self, ids: List[List[int]], params: SamplingParams, on_step) -> List[RequestOutput]:
        cb = None
        if on_step is not None:
            def cb(d):
                return bool(on_step(self._event(d, params.stop_at_eos)))
        outs = self._m.generate(ids, params._options(), cb)
        return [_output(d, p, params.logprobs is not None) for d, p in zip(outs, ids)]


class Stream:
    """The events of one generation as they come (see LLM.stream). stream.output is the RequestOutput once
    the iteration has ended; stream.cancelled tells whether close() stopped it first."""

    _END = object()

    def __init__(self, llm: LLM, ids: List[int], params: SamplingParams):
        # The generation's thread sees only these, not the Stream: dropping the Stream cancels it.
        q: "queue.Queue" = queue.Queue()
        stop = threading.Event()
        state = {"output": None, "cancelled": False, "error": None}

        def on_step(ev: CanvasEvent):
            q.put(ev)
            return stop.is_set()

        def run():
            try:
                state["output"] = llm._run([ids], params, on_step)[0]
            except Cancelled:
                state["cancelled"] = True
            except BaseException as e:  # handed to the reader
                state["error"] = e
            finally:
                q.put(Stream._END)

        self._q, self._stop, self._state = q, stop, state
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    @property
    def output(self) -> Optional[RequestOutput]:
        return self._state["output"]

    @property
    def cancelled(self) -> bool:
        return self._state["cancelled"]

    def __iter__(self) -> Iterator[CanvasEvent]:
        return self

    def __next__(self) -> CanvasEvent:
        item = self._q.get()
        if item is Stream._END:
            self._q.put(Stream._END)  # later calls end too
            self._thread.join()
            if self._state["error"] is not None:
                raise self._state["error"]
            raise StopIteration
        return item

    def close(self) -> None:
        """Cancels the generation (at its next step) and waits for it to end."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self._stop.set()


def _messages(messages) -> List[Tuple[str, str]]:
    if isinstance(messages, str):
        return [("user", messages)]
    out = []
    for m in messages:
        if isinstance(m, dict):
            out.append((m["role"], m["content"]))
        else:
            role, content = m
            out.append((role, content))
    return out

