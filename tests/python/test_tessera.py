"""The Python package (python/tessera) on the bundled tessera-tiny: the same tokens as the CLI, streams
whose events agree with the final answer, cancellation, batches, the GIL released, and bad arguments
raised as Python exceptions with the engine's message.

Run by ctest (test python_package) with PYTHONPATH at the build's python/ folder, TESSERA_BINARY the
tessera command and TESSERA_SOURCE_DIR the repository."""
import json
import os
import subprocess
import threading
import time

import pytest

import tessera

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SOURCE, "models", "tessera-tiny")
BINARY = os.environ.get("TESSERA_BINARY", "tessera")


@pytest.fixture(scope="module")
def llm():
    return tessera.LLM(MODEL)


def cli_tokens(prompt, *flags, model=MODEL):
    out = subprocess.run([BINARY, "generate", "-m", model, "-p", prompt, "--raw", "--json", *flags],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("flags,params", [
    (["--gen-length", "32", "--steps", "16"], dict(gen_length=32, steps=16)),
    ([], dict()),  # the model's defaults (generation_config.json)
    (["--gen-length", "32", "--steps", "32", "--temperature", "0.8", "--seed", "7"],
     dict(gen_length=32, steps=32, temperature=0.8, seed=7)),
    (["--gen-length", "32", "--steps", "16", "--threshold", "0.5"], dict(gen_length=32, steps=16, threshold=0.5)),
    (["--gen-length", "32", "--steps", "16", "--edit-mode", "speed"], dict(gen_length=32, steps=16, edit_mode="speed")),
    (["--gen-length", "64", "--steps", "32", "--cache", "prefix"], dict(gen_length=64, steps=32, cache="prefix")),
    (["--gen-length", "32", "--steps", "16", "--stop", " the"], dict(gen_length=32, steps=16, stop=[" the"])),
])
def test_same_tokens_and_text_as_the_cli(llm, flags, params):
    want = cli_tokens("Once upon a time", *flags)
    got = llm.generate("Once upon a time", tessera.SamplingParams(**params))[0]
    assert got.token_ids == want["tokens"]
    assert got.text == want["text"]
    assert got.steps == want["steps"]
    assert got.finish_reason in ("stop", "length")
    assert got.timings["seconds"] > 0


def test_the_bundled_moe_model_gives_the_clis_tokens():
    moe = os.path.join(SOURCE, "models", "tessera-tiny-moe")
    llm = tessera.LLM(moe)
    assert llm.info["family"] == "llada-moe"
    for prompt in ("Once upon a time", "The little dog"):
        want = cli_tokens(prompt, "--gen-length", "32", "--steps", "16", model=moe)
        got = llm.generate(prompt, tessera.SamplingParams(gen_length=32, steps=16))[0]
        assert got.token_ids == want["tokens"] and got.text == want["text"]


def test_batch_gives_each_prompt_its_answer_alone(llm):
    prompts = ["Once upon a time", "The cat sat", "Lily and Ben went to the park"]
    params = tessera.SamplingParams(gen_length=32, steps=16)
    batch = llm.generate(prompts, params)
    assert [o.token_ids for o in batch] == [llm.generate(p, params)[0].token_ids for p in prompts]
    assert [o.prompt_token_ids for o in batch] == [llm.tokenize(p) and llm._prompt(p) for p in prompts]


def test_stream_events_agree_with_the_final_text(llm):
    params = tessera.SamplingParams(gen_length=32, steps=16, stop_at_eos=False)
    stream = llm.stream("The little dog", params)
    events = list(stream)
    out = stream.output
    assert out is not None and not stream.cancelled
    assert [e.step for e in events] == list(range(out.steps))
    masked = [e.masked for e in events]
    assert masked == sorted(masked, reverse=True) and masked[-1] == 0
    last = events[-1]
    assert last.canvas[last.prompt_len:] == out.token_ids
    assert last.committed == len(last.canvas)
    assert last.committed_text == out.text
    for e in events:  # the committed text only grows, and is always a prefix of the answer
        assert out.text.startswith(e.committed_text)


def test_closing_a_stream_cancels_it(llm):
    params = tessera.SamplingParams(gen_length=64, steps=64)
    stream = llm.stream("Once upon a time", params)
    first = [next(stream), next(stream)]
    t0 = time.monotonic()
    stream.close()
    assert time.monotonic() - t0 < 30
    assert stream.cancelled and stream.output is None
    assert [e.step for e in first] == [0, 1]
    # The model is as it was.
    assert llm.generate("Once upon a time", params)[0].token_ids == cli_tokens(
        "Once upon a time", "--gen-length", "64", "--steps", "64")["tokens"]


def test_a_step_callback_cancels_and_its_exception_propagates(llm):
    params = tessera.SamplingParams(gen_length=32, steps=16)
    seen = []
    with pytest.raises(tessera.Cancelled):
        llm.generate("Once", params, on_step=lambda ev: seen.append(ev.step) or ev.step == 3)
    assert seen == [0, 1, 2, 3]

    def boom(ev):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        llm.generate("Once", params, on_step=boom)


def test_the_gil_is_released_while_the_engine_runs(llm):
    params = tessera.SamplingParams(gen_length=64, steps=64)
    done = threading.Event()
    t = threading.Thread(target=lambda: (llm.generate("Once upon a time", params), done.set()))
    ticks = 0
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0)
    t.join()
    assert ticks > 100  # with the GIL held for the whole generation this loop could not run


def test_logprobs_and_plan(llm):
    # greedy: the chosen token is the most likely one (the bundled model samples by default)
    out = llm.generate("Once upon a time", tessera.SamplingParams(gen_length=16, steps=16, logprobs=2,
                                                                   temperature=0.0, alg="low_confidence"))[0]
    assert len(out.logprobs) == len(out.token_ids)
    for tok, (t, lp, step, alts) in zip(out.token_ids, out.logprobs):
        assert t == tok and lp <= 0 and step >= 0 and len(alts) == 2 and alts[0][0] == tok
    plan = llm.plan(10, tessera.SamplingParams(gen_length=64))
    assert plan["canvas"] == 74 and plan["logit_rows"] == 32 and plan["activation_bytes"] > 0
    assert plan["weight_bytes"] == llm.info["weight_bytes"]


def test_bad_arguments_raise_with_the_engines_message(llm):
    with pytest.raises(tessera.InvalidArgumentError, match="alg"):
        tessera.SamplingParams(alg="fastest")._options()
    with pytest.raises(ValueError, match="gen_length"):
        llm.generate("Once", tessera.SamplingParams(gen_length=-1))
    with pytest.raises(tessera.InvalidArgumentError, match="context"):
        llm.generate("Once", tessera.SamplingParams(gen_length=4096, steps=128))
    with pytest.raises(tessera.InvalidArgumentError, match="no chat template"):
        llm.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(tessera.InvalidArgumentError, match="vocabulary"):
        llm.generate([1, 99999])
    with pytest.raises(tessera.InvalidArgumentError, match="unknown option"):
        llm._m.generate([[1]], {"gen_lenght": 3}, None)
    with pytest.raises(tessera.ModelError, match="nonexistent"):
        tessera.LLM("/nonexistent/model")
    with pytest.raises(tessera.InvalidArgumentError, match="size"):
        tessera.LLM(MODEL, memory_budget="lots")
    small = tessera.LLM(MODEL, memory_budget=llm.info["weight_bytes"] + 1024)
    with pytest.raises(tessera.MemoryBudgetError, match="memory budget"):
        small.plan(10, tessera.SamplingParams(gen_length=64))
    assert issubclass(tessera.MemoryBudgetError, tessera.TesseraError)


def test_tokenize_round_trip(llm):
    ids = llm.tokenize("Once upon a time")
    assert llm.detokenize(ids) == "Once upon a time"
    assert llm.info["vocab_size"] == 4096 and llm.info["family"] == "llada"


def test_the_readme_example_runs_as_written():
    import re
    import sys
    readme = open(os.path.join(SOURCE, "README.md"), encoding="utf-8").read()
    code = re.search(r"<!-- readme-example: python -->\n```python\n(.*?)```", readme, re.S).group(1)
    r = subprocess.run([sys.executable, "-c", code], cwd=SOURCE, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "step 0:" in r.stdout and "activation bytes" in r.stdout


def test_chat_goes_through_the_models_template(tmp_path):
    """A tiny random LLaDA checkpoint in the real layout, with LLaDA's chat template (the bundled models
    have none): chat() answers what `tessera generate --chat` answers."""
    import sys
    pytest.importorskip("numpy")
    model = str(tmp_path / "llada")
    subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "make_tiny_checkpoint.py"), "--family", "llada",
                    "--out", model], check=True, capture_output=True)
    llm = tessera.LLM(model)
    assert llm.info["has_chat_template"]
    text = llm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "<|start_header_id|>user<|end_header_id|>" in text and text.endswith("assistant<|end_header_id|>\n\n")
    params = tessera.SamplingParams(gen_length=16, steps=16)
    got = llm.chat([{"role": "user", "content": "hi"}], params)
    out = subprocess.run([BINARY, "generate", "-m", model, "-p", "hi", "--chat", "--json", "--gen-length", "16",
                          "--steps", "16"], check=True, capture_output=True, text=True).stdout
    want = json.loads(out.strip().splitlines()[-1])
    assert got.token_ids == want["tokens"] and got.prompt_token_ids[-1] != got.prompt_token_ids[0]
    assert len(got.prompt_token_ids) == want["prompt_tokens"]


def test_the_modes_of_a_tri_mode_model(tmp_path, llm):
    """A tiny random Nemotron-Labs-Diffusion checkpoint: mode "spec" writes "ar"'s text at temperature 0;
    a bad mode, and "ar" on a diffusion-only model, raise with the engine's message."""
    import sys
    pytest.importorskip("numpy")
    model = str(tmp_path / "nemotron")
    subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "make_tiny_checkpoint.py"), "--family", "nemotron",
                    "--out", model], check=True, capture_output=True)
    tri = tessera.LLM(model)
    prompt = [5, 9, 3, 7, 11, 20]
    ar = tri.generate(prompt, tessera.SamplingParams(gen_length=24, mode="ar", stop_at_eos=False))[0]
    spec = tri.generate(prompt, tessera.SamplingParams(gen_length=24, mode="spec", block_length=4,
                                                       stop_at_eos=False))[0]
    assert ar.token_ids == spec.token_ids and len(ar.token_ids) == 24
    with pytest.raises(tessera.InvalidArgumentError, match="mode"):
        tessera.SamplingParams(mode="fastest")._options()
    with pytest.raises(tessera.InvalidArgumentError, match="tri-mode"):
        llm.generate("Once", tessera.SamplingParams(gen_length=8, mode="ar"))


def test_a_uniform_noise_model_takes_its_sampler(tmp_path):
    """A tiny random DiffusionGemma checkpoint: its own mode (uniform) by default, and its sampler's settings
    as SamplingParams fields give the CLI's tokens with the same flags."""
    import sys
    pytest.importorskip("numpy")
    model = str(tmp_path / "diffusion_gemma")
    subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "make_tiny_checkpoint.py"), "--family",
                    "diffusion_gemma", "--out", model], check=True, capture_output=True)
    dg = tessera.LLM(model)
    for flags, params in ((["--gen-length", "16", "--seed", "5"], dict(gen_length=16, seed=5)),
                          (["--gen-length", "16", "--seed", "5", "--t-min", "0.2", "--t-max", "0.5",
                            "--entropy-bound", "0.3", "--stability", "2", "--confidence", "0.01"],
                           dict(gen_length=16, seed=5, t_min=0.2, t_max=0.5, entropy_bound=0.3, stability=2,
                                confidence=0.01))):
        want = cli_tokens("hello", *flags, model=model)
        got = dg.generate("hello", tessera.SamplingParams(**params))[0]
        assert got.token_ids == want["tokens"], flags
    with pytest.raises(tessera.InvalidArgumentError, match="stability"):
        dg.generate("hello", tessera.SamplingParams(gen_length=8, stability=99))
