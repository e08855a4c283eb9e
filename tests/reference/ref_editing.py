"""LLaDA2.1's "draft and edit" decoding (joint threshold: mask-to-token M2T plus token-to-token T2T
editing) for the numpy reference (reference.py generate --edit / --joint), temperature 0.

Written from shared/specs/llada21-editing.md only (sections 2, 3, 7, 8; the official loop
LLaDA2MoeModelLM.generate of LLaDA2.1 as vendored in lingjiechen2/dllm, and SGLang's JointThreshold),
never from tessera's C++ code. `m` is a reference.Model.

  edit_step            one step's decision (spec 3 d-h) from a forward's candidates and confidences
  penalised_logits     SGLang's optional 2-gram repetition penalty (penalty_lambda)
  generate_llada21     the official per-block loop on LLaDA2's block-causal models (spec 3 / 7)
  generate_edit_bidirectional
                       the same per-block loop on bidirectional models (LLaDA, Dream, LLaDA-MoE):
                       every forward over the whole canvas

Both loops return (tokens, order, edits, forwards):
  tokens   the canvas (prompt included); LLaDA2: trimmed to prompt + gen_length, NOT cut after EOS
  order    for every forward that changed at least one position, the sorted changed positions
           (M2T and T2T together); forwards that changed nothing have no entry
  edits    [k, position, old token, new token] per T2T change (ascending position inside a step),
           k = the index into order of the step that made it
  forwards every forward run, including those that changed nothing (at most one per block: the
           one that ends it by rule 2h)

Resolved details (the spec leaves them implicit):
  - Probabilities are softmax in float64 of the fp32 logits (as the other reference loops); cand =
    argmax of the fp32 logits (lowest token id on ties); conf = the float64 probability of cand;
    thresholds are compared as Python floats with strict `>`.
  - M2T fallback: the min(min_transfer, #masked) most confident masked positions, equal confidences
    lower position first (top_positions). The official code's topk order on ties is unspecified.
  - Editing on/off is separate from edit_threshold: edit_enabled False means no T2T at all; with
    editing on, edit_threshold 0.0 edits whenever the candidate differs (official / SGLang semantics).
  - The mask token is never a candidate: its logit is -inf before the argmax and the softmax (a
    candidate equal to the mask would leave a position masked, and with editing could re-mask a decided
    one, so a deterministic step could repeat forever; trained models never predict it).
  - A prompt holding the mask token is refused (the official loop would fill it; tessera never
    receives one).
"""
import numpy as np

from ref_loops import softmax64, top_positions


def edit_step(old, prompt_mask, cand, conf, mask_id, threshold, edit_threshold, edit_enabled, min_transfer=1):
    """One step's decision over the B positions of the current block (spec 3 e-f, temperature 0).
    old: the block's tokens at step start; prompt_mask: True where the position holds the prompt;
    cand / conf: each position's candidate token and its probability from this step's forward.
    Returns (m2t, t2t), ascending block indices:
      M2T (only when some position is masked at step start): the masked positions with conf >
        threshold if there are >= min_transfer of them, else the min(min_transfer, #masked) most
        confident masked positions (ties: lower position) - at least one mask is filled per step.
      T2T (only when edit_enabled): positions non-mask at step start (so a position unmasked in this
        step is not also edited in it) and not prompt, with conf > edit_threshold and cand != old.
    The two sets are disjoint; the caller writes cand into both at once."""
    n = len(old)
    act = [i for i in range(n) if old[i] == mask_id]
    m2t = []
    if act:
        high = [i for i in act if conf[i] > threshold]
        if len(high) >= min_transfer:
            m2t = high
        else:
            k = min(max(min_transfer, 1), len(act))
            m2t = sorted(act[r] for r in top_positions(act, [conf[i] for i in act], k))
    t2t = []
    if edit_enabled:
        t2t = [i for i in range(n) if old[i] != mask_id and not prompt_mask[i]
               and conf[i] > edit_threshold and cand[i] != old[i]]
    return m2t, t2t


def penalised_logits(logits, block_tokens, penalty):
    """SGLang's 2-gram repetition penalty (JointThreshold, penalty_lambda; read in sgl-project/sglang
    python/sglang/srt/dllm/algorithm/joint_threshold.py at commits cabd4543152087d411785114ef0b2d8db7bfd80e
    (run() loop) and 17d57211575786d0abf1683309f9e3b1545b8210 (step()), identical in both):

        if self.penalty_lambda > 0:
            prev_ids = curr_input_ids[:-1]
            curr_logits[1:, :].scatter_(1, prev_ids.unsqueeze(-1), -self.penalty_lambda, reduce="add")
        x = argmax(curr_logits); p = softmax(curr_logits)[x]

    i.e. for block rows j = 1 .. B-1: logit[j, tok[j-1]] -= lambda, where tok = the block's tokens at
    the START of the step (curr_input_ids is updated only after the decision), whatever tok[j-1] is:
    a mask id is penalised too (it changes nothing's argmax but lowers the softmax denominator), and so
    are prompt tokens inside the block. Row 0 is never penalised (the previous block's last token is
    not used). The candidate AND its confidence both come from the penalised logits (M2T and T2T
    alike). lambda <= 0: off (SGLang applies it only when > 0). Here: fp32 logits, the penalty
    subtracted in fp32, then the usual float64 softmax."""
    L = np.array(logits, dtype=np.float32, copy=True)
    if penalty > 0:
        lam = np.float32(penalty)
        for j in range(1, len(block_tokens)):
            L[j, block_tokens[j - 1]] = np.float32(L[j, block_tokens[j - 1]] - lam)
    return L


def _run_block(x, lo, hi, P, mask_id, block_logits, threshold, edit_threshold, edit_enabled, max_post_steps,
               min_transfer, penalty, out):
    """The official per-block loop (spec 3 step 2) on x[lo:hi]; block_logits() runs one forward and
    returns the block's [B, V] fp32 logits. Appends to out["order"] / out["edits"], counts
    out["forwards"]."""
    if min_transfer < 1:
        raise SystemExit("min-transfer must be at least 1 (a step must fill a mask)")
    protect = [j < P for j in range(lo, hi)]
    post = 0
    while True:
        old = list(x[lo:hi])
        active = mask_id in old
        if not active:
            post += 1
            if post > max_post_steps:  # 2b: stop without a forward
                break
        L = block_logits()
        out["forwards"] += 1
        L = penalised_logits(L, old, penalty)
        L[:, mask_id] = -np.inf  # the mask token is never a candidate
        cand = L.argmax(axis=-1)  # lowest token id on ties
        conf = softmax64(L)[np.arange(len(cand)), cand]
        m2t, t2t = edit_step(old, protect, cand, conf, mask_id, threshold, edit_threshold, edit_enabled,
                             min_transfer)
        upd = sorted(m2t + t2t)
        for i in upd:
            x[lo + i] = int(cand[i])
        if upd:
            out["order"].append([lo + i for i in upd])
            k = len(out["order"]) - 1
            out["edits"].extend([k, lo + i, int(old[i]), int(cand[i])] for i in t2t)
        if not active and not t2t:  # 2h
            break


def _eos_id(m):
    e = getattr(m, "eos_id", None)
    if e is None:
        e = m.config.get("eos_token_id")
    if isinstance(e, list):
        e = e[0] if e else None
    return None if e is None or e < 0 else int(e)


def generate_llada21(m, prompt, gen_length, block_length, threshold, edit_threshold, edit_enabled, max_post_steps,
                     min_transfer=1, penalty=0.0, eos_early_stop=True):
    """LLaDA2.1's joint-threshold decoding on a block-causal LLaDA2 model (spec 3 / 7), temperature 0.
    The canvas is the prompt then masks up to ceil((P + gen_length) / B) whole blocks of B =
    block_length (also the attention block: m.block = B); blocks [b B, (b + 1) B) for b from floor(P / B)
    on (the first may hold the prompt's tail, never decided or edited). Per block, the loop of spec 3:
    each step's forward sees x[:block end] with the block-causal mask, the block's B logit rows
    (penalised_logits when penalty > 0) give cand / conf, edit_step decides, cand is written into M2T
    and T2T positions at once; a step starting without masks counts a post step and the block stops
    without a forward once post steps exceed max_post_steps (2b), or after a forward that starts
    without masks and edits nothing (2h). After a block: if eos_early_stop and x[P:block end] has no
    mask and holds m.eos_id, later blocks are skipped (their positions stay masks).
    Returns (canvas trimmed to P + gen_length, not cut after EOS; order; edits; forwards)."""
    if m.family != "llada2":
        raise SystemExit("generate_llada21: a block-causal LLaDA2 model (else generate_edit_bidirectional)")
    if block_length <= 0:
        raise SystemExit("block-length must be positive")
    if m.mask_id in prompt:
        raise SystemExit("the prompt holds the mask token")
    P, B = len(prompt), block_length
    total = (P + gen_length + B - 1) // B * B
    x = list(prompt) + [m.mask_id] * (total - P)
    m.block = B
    eos = _eos_id(m)
    out = dict(order=[], edits=[], forwards=0)
    for b in range(P // B, total // B):
        lo, hi = b * B, (b + 1) * B
        _run_block(x, lo, hi, P, m.mask_id, lambda: m.forward(x[:hi])[lo:hi], threshold, edit_threshold,
                   edit_enabled, max_post_steps, min_transfer, penalty, out)
        gen = x[P:hi]
        if eos_early_stop and eos is not None and m.mask_id not in gen and eos in gen:
            break
    return x[:P + gen_length], out["order"], out["edits"], out["forwards"]


def generate_edit_bidirectional(m, prompt, gen_length, block_length, threshold, edit_threshold, edit_enabled,
                                max_post_steps, min_transfer=1, penalty=0.0, eos_early_stop=True):
    """The joint-threshold loop of generate_llada21 on a bidirectional model (LLaDA, Dream, LLaDA-MoE):
    the canvas is prompt + gen_length masks (block_length 0: one block of gen_length; it must divide
    gen_length); blocks [P + b B, P + (b + 1) B) (the prompt is never in a block); every forward runs
    over the whole canvas (m.forward: Dream's logits already shifted, row j = position j) and its rows
    [lo, hi) give cand / conf; the same per-block steps, decisions, penalty and stop rules; the same
    EOS early stop over x[P:block end] (EOS = config eos_token_id).
    Returns (canvas, order, edits, forwards)."""
    if m.family == "llada2":
        raise SystemExit("generate_edit_bidirectional: LLaDA2 is block-causal (generate_llada21)")
    if block_length <= 0:
        block_length = gen_length
    if gen_length % block_length:
        raise SystemExit("gen-length must be a multiple of block-length")
    if m.mask_id in prompt:
        raise SystemExit("the prompt holds the mask token")
    P, B = len(prompt), block_length
    x = list(prompt) + [m.mask_id] * gen_length
    eos = _eos_id(m)
    out = dict(order=[], edits=[], forwards=0)
    for b in range(gen_length // B):
        lo, hi = P + b * B, P + (b + 1) * B
        _run_block(x, lo, hi, P, m.mask_id, lambda: m.forward(x)[lo:hi], threshold, edit_threshold,
                   edit_enabled, max_post_steps, min_transfer, penalty, out)
        gen = x[P:hi]
        if eos_early_stop and eos is not None and m.mask_id not in gen and eos in gen:
            break
    return x, out["order"], out["edits"], out["forwards"]
