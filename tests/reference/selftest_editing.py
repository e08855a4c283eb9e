"""Checks of the numpy reference's LLaDA2.1 draft-and-edit loops (ref_editing.py, written from
shared/specs/llada21-editing.md). Run by selftest.py, which registers them (register) in its own order."""
import json
import os
import subprocess
import sys

import numpy as np

import reference as ref

HERE = os.path.dirname(os.path.abspath(__file__))
make = close = None  # selftest.py's helpers (register)


def register(check, make_fn, close_fn):
    """Registers this file's checks with selftest.py's `check`; make / close are selftest.py's."""
    global make, close
    make, close = make_fn, close_fn
    for fn in (edit_step_worked_example, edit_step_rules, llada21_generate_invariants,
               llada21_joint_is_the_llada2_loop, cli_generate_edit):
        check(fn)


# the spec's worked example (section 8): B = 4, token ids M(ask) 0, The 1, cat 2, sat 3, . 4, dog 5, ran 6
EX_M, EX_THE, EX_CAT, EX_SAT, EX_DOT, EX_DOG, EX_RAN, EX_EOS = range(8)
EX_STEPS = [([EX_THE, EX_CAT, EX_SAT, EX_DOT], [0.90, 0.60, 0.75, 0.30]),
            ([EX_THE, EX_DOG, EX_RAN, EX_DOT], [0.95, 0.65, 0.80, 0.50]),
            ([EX_THE, EX_DOG, EX_RAN, EX_DOT], [0.97, 0.90, 0.92, 0.97]),
            ([EX_THE, EX_CAT, EX_RAN, EX_DOT], [0.98, 0.40, 0.95, 0.99])]


class ScriptedLLaDA2:
    """A stand-in LLaDA2 model whose forward number i gives the block's rows argmax script[i][0] with
    probability script[i][1] (the rest spread evenly over the other ids); past the script, `tail(i)`."""
    family, mask_id, eos_id, block, config = "llada2", EX_M, EX_EOS, 0, {}

    def __init__(self, script, tail=None, V=8):
        self.script, self.tail, self.V, self.calls = script, tail, V, 0

    def forward(self, tokens):
        i, self.calls = self.calls, self.calls + 1
        cand, p = self.script[i] if i < len(self.script) else self.tail(i)
        L = np.zeros((len(tokens), self.V), dtype=np.float32)
        for r, (t, q) in enumerate(zip(cand, p)):
            L[len(tokens) - len(cand) + r] = np.log((1 - q) / (self.V - 1))
            L[len(tokens) - len(cand) + r, t] = np.log(q)
        return L


def edit_step_worked_example():
    """Spec section 8 (Q mode 0.7 / 0.5) step by step through edit_step, then through generate_llada21 with
    a scripted model; editing at threshold 0.0 (S-mode remark) replaces "dog" by "cat" at step 4; the
    post-step cap stops a block that keeps editing."""
    st = [EX_M] * 4
    want = [([0, 2], [], [EX_THE, EX_M, EX_SAT, EX_M]), ([1], [2], [EX_THE, EX_DOG, EX_RAN, EX_M]),
            ([3], [], [EX_THE, EX_DOG, EX_RAN, EX_DOT]), ([], [], [EX_THE, EX_DOG, EX_RAN, EX_DOT])]
    for i, ((cand, conf), (m2t, t2t, after)) in enumerate(zip(EX_STEPS, want)):
        got = ref.edit_step(st, [False] * 4, cand, conf, EX_M, 0.7, 0.5, True)
        assert got == (m2t, t2t), (i + 1, got)
        for j in m2t + t2t:
            st[j] = cand[j]
        assert st == after, (i + 1, st)
    assert ref.edit_step(st, [False] * 4, *EX_STEPS[3], EX_M, 0.7, 0.0, True) == ([], [1]), "S: dog -> cat"
    m = ScriptedLLaDA2(EX_STEPS)
    x, order, edits, fw = ref.generate_llada21(m, [], 4, 4, 0.7, 0.5, True, 16)
    assert (x, order, edits, fw) == ([EX_THE, EX_DOG, EX_RAN, EX_DOT], [[0, 2], [1, 2], [3]],
                                     [[1, 2, EX_SAT, EX_RAN]], 4) and m.block == 4, (x, order, edits, fw)
    m = ScriptedLLaDA2(EX_STEPS + [EX_STEPS[3]])  # step 5 confirms "cat": nothing changes, stop (2h)
    x, order, edits, fw = ref.generate_llada21(m, [], 4, 4, 0.7, 0.0, True, 16)
    assert x == [EX_THE, EX_CAT, EX_RAN, EX_DOT] and order[3:] == [[1]] and fw == 5, (x, order, fw)
    assert edits == [[1, 2, EX_SAT, EX_RAN], [3, 1, EX_DOG, EX_CAT]], edits
    flip = lambda i: ([EX_THE, EX_CAT if i % 2 else EX_DOG, EX_RAN, EX_DOT], EX_STEPS[3][1])  # noqa: E731
    for post in (16, 2, 0):  # edits forever: post forwards 1 .. max_post_steps, then 2b
        m = ScriptedLLaDA2(EX_STEPS[:3], flip)
        x, order, edits, fw = ref.generate_llada21(m, [], 4, 4, 0.7, 0.0, True, post)
        assert fw == 3 + post == m.calls and len(order) == fw and len(edits) == 1 + post, (post, fw, edits)


def edit_step_rules():
    """Editing disabled: no T2T; strict > at both thresholds; the M2T fallback (min_transfer, ties to the
    lower position); prompt positions and positions masked at step start are never edited."""
    M = 9
    old, cand = [1, M, 2, M, M, 3], [4, 5, 6, 7, 8, 3]
    conf = [0.99, 0.5, 0.99, 0.5, 0.3, 0.99]
    prompt = [True, False, False, False, False, False]
    assert ref.edit_step(old, prompt, cand, conf, M, 0.9, 0.5, True) == ([1], [2])
    assert ref.edit_step(old, prompt, cand, conf, M, 0.9, 0.5, False) == ([1], []), "editing disabled"
    assert ref.edit_step(old, prompt, cand, conf, M, 0.9, 0.0, False)[1] == [], "disabled at threshold 0"
    assert ref.edit_step(old, prompt, cand, conf, M, 0.9, 0.99, True) == ([1], []), "strict > (edit)"
    assert ref.edit_step(old, prompt, cand, conf, M, 0.5, 0.5, True)[0] == [1], "strict > (mask): fallback"
    assert ref.edit_step(old, prompt, cand, conf, M, 0.4, 0.5, True)[0] == [1, 3], "all above the threshold"
    assert ref.edit_step(old, prompt, cand, conf, M, 0.4, 0.5, True, min_transfer=3)[0] == [1, 3, 4]
    assert ref.edit_step(old, prompt, cand, conf, M, 0.99, 0.5, True, min_transfer=2)[0] == [1, 3]
    assert ref.edit_step(old, prompt, cand, conf, M, 0.99, 0.5, True, min_transfer=9)[0] == [1, 3, 4]
    assert ref.edit_step([1, 2], [False] * 2, [1, 2], [1.0, 1.0], M, 0.5, 0.0, True) == ([], []), "same tokens"
    want = np.zeros((3, 10))
    want[1, M], want[2, 2] = -1.5, -1.5
    close(ref.penalised_logits(np.zeros((3, 10), dtype=np.float32), [M, 2, M], 1.5), want, 0,
          "2-gram penalty on logit[j, tok[j - 1]] for j >= 1, a mask tok[j - 1] too")
    close(ref.penalised_logits(np.ones((2, 3)), [0, 1], 0.0), np.ones((2, 3)), 0, "penalty 0 is off")
    # In the loop the mask token is never a candidate (its logit is -inf after the penalty): penalising
    # a mask token changes nothing. Every row's argmax is "The" with p .9 of the other tokens' mass, so
    # all four rows pass .9001 at step 1 with or without the penalty on the mask logit.
    step = [([EX_THE] * 4, [0.9] * 4)] * 4
    for lam in (0.0, 5.0):
        _, order, _, _ = ref.generate_llada21(ScriptedLLaDA2(step), [], 4, 4, 0.9001, 0.5, True, 0, penalty=lam)
        assert order[0] == [0, 1, 2, 3], (lam, order)


def edit_chains(x, order, edits, P, mask_id, lo_of):
    """Replays order / edits: each position is unmasked once, then edited with old = the previous token
    (old != new), the last edit's new token is the final one (positions of x: LLaDA2's canvas is
    trimmed); every change is in its step's block."""
    state, n_edit = {}, 0
    by_step = {}
    for k, p, a, b in edits:
        by_step.setdefault(k, {})[p] = (a, b)
    for k, step in enumerate(order):
        lo = lo_of(step[0])
        for p in step:
            assert lo <= p and lo_of(p) == lo and p >= P, (k, p)
            e = by_step.get(k, {}).get(p)
            if e is None:
                assert p not in state, f"position {p} unmasked twice"
                state[p] = None  # the token written is the next edit's old or the final one
            else:
                n_edit += 1
                assert e[0] != e[1] and e[0] != mask_id and e[1] != mask_id, e
                assert p in state and state[p] in (None, e[0]), (k, p, state.get(p), e)
                state[p] = e[1]
    assert n_edit == len(edits)
    for p, t in state.items():
        assert t is None or p >= len(x) or x[p] == t, (p, t, x[p])
    return state


def llada21_generate_invariants():
    """generate_llada21 on a tiny LLaDA2: the prompt stays, decided blocks hold no mask, the order and
    edits replay to the canvas, each block runs at most #masks + max_post_steps forwards (max_post 0:
    at most #masks); the EOS early stop; the 2-gram penalty changes the generation."""
    m = ref.Model(make("llada2", "edit_l2"))
    prompt, B = [5, 17, 230, 8, 9], 8
    seen, inner = [], m.forward
    m.forward = lambda t: seen.append(len(t)) or inner(t)
    for et, post in ((0.0, 3), (0.0, 0), (0.03, 16)):
        seen.clear()
        x, order, edits, fw = ref.generate_llada21(m, prompt, 20, B, 0.05, et, True, post, eos_early_stop=False)
        assert x[:5] == prompt and len(x) == 25 and m.mask_id not in x, (et, post)
        assert fw == len(seen) >= len(order) and set(seen) == {8, 16, 24, 32}, (fw, seen)
        state = edit_chains(x, order, edits, 5, m.mask_id, lambda p: p // B * B)
        assert sorted(state) == list(range(5, 32)), "every generated position of the padded canvas"
        for b in range(4):
            masks = B - max(0, 5 - b * B)
            assert seen.count((b + 1) * B) <= masks + post, (et, post, b, seen)
        if et == 0.0:
            assert len(edits) > 10, f"editing at threshold 0 edits (got {len(edits)})"
    want, first, eos = x, seen.count(8), m.eos_id
    m.eos_id = x[6]  # a token of the first block: the first block ends the generation
    x2, _, _, fw2 = ref.generate_llada21(m, prompt, 20, B, 0.05, 0.03, True, 16)
    assert x2[:8] == want[:8] and x2[8:] == [m.mask_id] * 17 and fw2 == first, (x2, fw2)
    m.eos_id = eos
    base = ref.generate_llada21(m, prompt, 20, B, 0.05, 0.03, True, 16)
    assert ref.generate_llada21(m, prompt, 20, B, 0.05, 0.03, True, 16, penalty=5.0) != base, "penalty"
    assert ref.generate_llada21(m, prompt, 20, B, 0.05, 0.03, True, 16, penalty=-1.0) == base, "penalty <= 0"


def llada21_joint_is_the_llada2_loop():
    """Editing disabled with min_transfer 1 decides exactly like generate_llada2 with steps = block
    length (every schedule entry <= 1, so at least one position per step), plus one forward per block
    that changes nothing (post step 1, no edit: 2h); on bidirectional models, threshold 1.0 (nothing
    passes) is generate()'s low_confidence with one position per step."""
    m = ref.Model(make("llada2", "edit_l2"))
    for prompt, thr in (([5, 17, 230, 8, 9], 0.04), ([5, 17, 230], 0.05), (list(range(40, 48)), 0.03)):
        want = ref.generate_llada2(m, prompt, 20, 8, 8, thr)
        x, order, edits, fw = ref.generate_llada21(m, prompt, 20, 8, thr, 0.0, False, 16)
        blocks = len({p // 8 for s in order for p in s})
        assert (x, order) == want and edits == [] and fw == len(order) + blocks, (prompt, thr)
        assert any(len(s) > 1 for s in order), "some step passes the threshold with several positions"
    for fam in ("llada", "dream"):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt = [5, 17, 230]
        want = ref.generate(m, prompt, 16, 16, 8, "low_confidence")
        x, order, edits, fw = ref.generate_edit_bidirectional(m, prompt, 16, 8, 1.0, 0.0, False, 16,
                                                              eos_early_stop=False)
        assert (x, order) == want and fw == 18 and edits == [], fam
        x, order, edits, fw = ref.generate_edit_bidirectional(m, prompt, 16, 8, 0.05, 0.0, True, 2,
                                                              eos_early_stop=False)
        assert x[:3] == prompt and m.mask_id not in x and fw <= 16 + 2 * 2, (fam, fw)
        state = edit_chains(x, order, edits, 3, m.mask_id, lambda p: 3 + (p - 3) // 8 * 8)
        assert sorted(state) == list(range(3, 19)) and edits, fam


def cli_generate_edit():
    """reference.py generate --edit prints generate_llada21's tokens, order, edits and forwards."""
    d = make("llada2", "edit_cli")
    r = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "generate", "--model", d, "--prompt",
                        "5,17,230", "--gen-length", "12", "--block-length", "8", "--threshold", "0.05", "--edit",
                        "--edit-threshold", "0.0", "--max-post-steps", "2", "--edit-penalty", "0.5",
                        "--no-eos-early-stop"], check=True, capture_output=True, text=True)
    x, order, edits, fw = ref.generate_llada21(ref.Model(d), [5, 17, 230], 12, 8, 0.05, 0.0, True, 2, 1, 0.5, False)
    assert json.loads(r.stdout) == {"tokens": x, "order": order, "edits": edits, "forwards": fw}, r.stdout
