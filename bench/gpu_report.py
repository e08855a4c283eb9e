#!/usr/bin/env python3
"""Side-by-side table of tessera's CUDA forward step (forward_bench --json) and the PyTorch eager
baseline (torch_llada.py --json) for the LLaDA-8B geometry, with the roofline floor of each step:
FLOPs (GEMMs + bidirectional attention + mask-only LM head) over the measured cuBLASLt bf16 GEMM rate
(cuda_bench --json). Usage: gpu_report.py FWD.json TORCH.json CUDA_BENCH.json
"""
import json
import sys

D, F, LAYERS, V = 4096, 12288, 32, 126464


def step_flops(L, ratio):
    gemm = 2 * L * (4 * D * D + 3 * D * F) * LAYERS
    attn = 4 * L * L * D * LAYERS
    logits = 2 * int(L * ratio) * V * D
    return gemm + attn + logits


def main():
    fwd, tch, cb = (json.load(open(p)) for p in sys.argv[1:4])
    rate = cb["gemm_tflops"] * 1e12
    torch_rows = {(r["L"], r["mask_ratio"]): r for r in tch["rows"]}
    print(f"GEMM ceiling {cb['gemm_tflops']:.0f} TFLOP/s ({cb['device']})")
    print("| L | mask | tessera ms | torch ms (masked logits) | torch ms (full logits) | speed-up vs torch masked "
          "| floor ms | tessera % of floor | torch % of floor | tessera act. peak | torch peak - weights |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in fwd["rows"]:
        L, ratio = r["L"], r["mask_ratio"]
        t = torch_rows.get((L, ratio))
        floor = step_flops(L, ratio) / rate * 1e3
        tm = t["masked_ms"] if t else None
        tf = t["full_ms"] if t else None
        tpeak = (t["masked_peak"] - tch["weight_bytes"]) / 2**30 if t and t["masked_peak"] else None
        fmt = lambda v, s: "-" if v is None else s % v  # noqa: E731
        print(f"| {L} | {ratio} | {r['mask_ms']:.1f} | {fmt(tm, '%.1f')} | {fmt(tf, '%.1f')} | "
              f"{fmt(tm / r['mask_ms'] if tm else None, '%.2fx')} | {floor:.1f} | {100 * floor / r['mask_ms']:.0f}% | "
              f"{fmt(100 * floor / tm if tm else None, '%.0f%%')} | {r['mask_peak'] / 2**30:.2f} GiB | "
              f"{fmt(tpeak, '%.2f GiB')} |")


if __name__ == "__main__":
    main()
