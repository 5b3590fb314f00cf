#!/usr/bin/env python3
"""Generates the validation section of docs/whatif.md (between the whatif-validation markers).

Self-consistency of the trace-driven what-if on synthetic jobs: for each case, configuration A is
written as kernel-level traces (`lumos synth --detail kernel`), `lumos whatif` rewrites them to
configuration B, and the prediction is compared with B simulated directly (`lumos synth` of B
with the same detail, replayed by `lumos replay`, which reproduces `synth`'s own simulation).
A what-if flag that `lumos whatif` does not accept yet gives the row "not built yet".

    scripts/whatif_tables.py [--lumos build/release/examples/lumos] [--doc docs/whatif.md] [--print | --check]

--check (ctest whatif_tables) writes nothing: it fails when the document's section differs from the
one generated now, byte for byte, or when a case is not built or misses its bound.

Deterministic: the same binary gives the same section.
"""

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Configuration A of every case (small enough that the script runs in well under a minute, large
# enough that GEMMs dominate as in a real job): GPT-style, 8 layers, hidden 2048, 16 heads,
# sequence 2048, TP 2, PP 2, DP 2, 8 micro-batches of 1 per replica, H100, bf16.
BASE = {
    "--layers": "8", "--hidden": "2048", "--heads": "16", "--seq": "2048",
    "--tp": "2", "--pp": "2", "--dp": "2", "--micro-batch": "1", "--global-batch": "16",
    "--gpu": "h100-sxm", "--precision": "bf16",
}

# The context-parallel cases' configuration A: a small Llama-3-8B-like job at sequence 8192.
LLAMA = {"--model": "llama3-8b", "--layers": "4", "--ffn": "7168", "--seq": "8192", "--pp": "1", "--global-batch": "4"}
# Its CP 2 x DP 2 variant (4 ranks, 2 micro-batches per replica).
LLAMA_CP2_DP2 = dict(LLAMA, **{"--cp": "2", "--dp": "2"})
# Its CP 2 variant with the all-gather exchange.
LLAMA_CP2_AG = dict(LLAMA, **{"--cp": "2", "--cp-comm": "allgather"})
# The FSDP cases' A: Llama 3 8B's layer (hidden 4096, SwiGLU, 8 KV heads, vocabulary 128256) with 4
# layers, no TP or PP, 2 micro-batches per replica, parameters sharded over the DP ranks.
FSDP4 = {"--model": "llama3-8b", "--layers": "4", "--hidden": "4096", "--heads": "32", "--tp": "1", "--pp": "1",
         "--dp": "4", "--global-batch": "8", "--fsdp": "on"}
FSDP8 = dict(FSDP4, **{"--dp": "8", "--global-batch": "16"})
# The same job without FSDP: Megatron's distributed optimizer (ZeRO-1), synth's default.
ZERO1 = dict(FSDP4, **{"--fsdp": "off"})
# Hybrid sharding: DP 8 as 2 shard groups of 4 ranks, each unit's shard all-reduced over 2 replicas.
HSDP = dict(FSDP8, **{"--hsdp": "4"})
# The same with 2 pipeline stages (16 ranks, 4 micro-batches per replica).
FSDP4_PP2 = dict(FSDP4, **{"--pp": "2", "--global-batch": "16"})
FSDP8_PP2 = dict(FSDP8, **{"--pp": "2", "--global-batch": "32"})
HSDP_PP2 = dict(FSDP8_PP2, **{"--hsdp": "4"})

# (name, changes of A relative to BASE, what-if flags = changes from A to B). B = A + flags
# (`target`: --fsdp off drops A's --hsdp, a shard group size of FSDP that synth refuses without it,
# and CP 1 A's --cp-comm, an exchange synth refuses without CP).
CASES = [
    ("DP ×2", {}, {"--dp": "4", "--global-batch": "32"}),
    ("DP ×4", {}, {"--dp": "8", "--global-batch": "64"}),
    # From traces with stages, each traced stage is cut into the target stages of its block, in
    # the graph (the traced transfers between blocks kept; with model chunks replaced); merged
    # stages are each made from one traced stage with its layers repeated.
    ("PP 2→4 (in the graph)", {}, {"--pp": "4"}),
    ("PP 4→2 (in the graph)", {"--pp": "4"}, {"--pp": "2"}),
    ("PP 4→2, GPipe (in the graph)", {"--pp": "4"}, {"--pp": "2", "--schedule": "gpipe"}),
    ("PP 4→2, interleaved 2 chunks (in the graph)", {"--pp": "4"}, {"--pp": "2", "--vp": "2", "--schedule": "interleaved"}),
    ("PP 4→2 with layers ×2 (in the graph)", {"--pp": "4"}, {"--pp": "2", "--layers": "16"}),
    ("PP 4→2, ZB-H1 (in the graph)", {"--pp": "4"}, {"--pp": "2", "--schedule": "zb-h1"}),
    ("PP 8→2, 16 layers (in the graph)", {"--pp": "8", "--layers": "16"}, {"--pp": "2"}),
    ("PP 8→4, 16 layers (in the graph)", {"--pp": "8", "--layers": "16"}, {"--pp": "4"}),
    ("PP 4→2 with DP ×2 (in the graph)", {"--pp": "4"}, {"--pp": "2", "--dp": "4", "--global-batch": "32"}),
    ("PP 4→2 with TP 2→4 (in the graph)", {"--pp": "4"}, {"--pp": "2", "--tp": "4"}),
    ("PP 4→2 with DP ×2, same global batch (merged stages, 8 → 4 micro-batches, in the graph)", {"--pp": "4"}, {"--pp": "2", "--dp": "4"}),
    ("1F1B → interleaved (2 chunks, in the graph)", {}, {"--vp": "2", "--schedule": "interleaved"}),
    ("PP 4, 1F1B → interleaved (2 chunks, in the graph)", {"--pp": "4"}, {"--vp": "2", "--schedule": "interleaved"}),
    ("PP 2→4, interleaved 2 chunks (in the graph)", {}, {"--pp": "4", "--vp": "2", "--schedule": "interleaved"}),
    ("1F1B → GPipe (in the graph)", {}, {"--schedule": "gpipe"}),
    ("1F1B → ZB-H1 (in the graph)", {}, {"--schedule": "zb-h1"}),
    ("1F1B → ZB-H2 (in the graph)", {}, {"--schedule": "zb-h2"}),
    ("PP 2→4, ZB-H1 (in the graph)", {}, {"--pp": "4", "--schedule": "zb-h1"}),
    ("PP 2→4 with layers ×2 (in the graph)", {}, {"--pp": "4", "--layers": "16"}),
    ("PP 2→4 with layers ×0.5 (in the graph)", {}, {"--pp": "4", "--layers": "4"}),
    ("1F1B → ZB-H1 with layers ×2 (in the graph)", {}, {"--schedule": "zb-h1", "--layers": "16"}),
    ("layers ×2", {}, {"--layers": "16"}),
    ("layers ×0.5", {}, {"--layers": "4"}),
    ("hidden ×2 (FFN 4h)", {}, {"--hidden": "4096", "--ffn": "16384"}),
    ("sequence ×2", {}, {"--seq": "4096"}),
    ("micro-batch ×2 (same global batch, 8 → 4 micro-batches, in the graph)", {}, {"--micro-batch": "2"}),
    ("TP 2→4", {}, {"--tp": "4"}),
    ("TP 4→2", {"--tp": "4"}, {"--tp": "2"}),
    # From TP 1 the all-reduces are inserted into every layer (none to resize in the traces).
    ("TP 1→2", {"--tp": "1"}, {"--tp": "2"}),
    ("TP 1→4", {"--tp": "1"}, {"--tp": "4"}),
    ("TP 1→2 with PP 2→4 (in the graph)", {"--tp": "1"}, {"--tp": "2", "--pp": "4"}),
    # With sequence parallelism reduce-scatters replace them, all-gathers precede the GEMMs that
    # read the whole activation, and norms, residuals and dropout work on 1/TP of the tokens.
    ("TP 1→2 with SP", {"--tp": "1"}, {"--tp": "2", "--sp": "on"}),
    ("TP 1→4 with SP", {"--tp": "1"}, {"--tp": "4", "--sp": "on"}),
    ("H100 → H200", {}, {"--gpu": "h200-sxm"}),
    # fp8 training (Transformer Engine): the layers' linear GEMMs rescaled by the kernel model's
    # fp8/bf16 ratio, their cast kernels inserted before them (whatif/precision.hpp).
    ("bf16 → fp8", {}, {"--precision": "fp8"}),
    ("bf16 → fp8 on H200", {}, {"--precision": "fp8", "--gpu": "h200-sxm"}),
    ("bf16 → fp8, hidden ×2 (FFN 4h)", {}, {"--precision": "fp8", "--hidden": "4096", "--ffn": "16384"}),
    # Context parallelism (whatif/context_parallel.hpp) on a small Llama-3-8B-like job (4 layers,
    # hidden 2048, FFN 7168, grouped-query attention, sequence 8192, no pipeline, 2 micro-batches):
    # the tokens per rank and the attention's 1/CP of the causal work through the kernel model, the
    # ring exchanges re-timed, inserted or emptied, the gradients reduced over DP x CP.
    ("CP 1→2 (Llama-like, sequence 8192)", LLAMA, {"--cp": "2"}),
    ("CP 2→4 with the sequence ×2 (Llama-like)", dict(LLAMA, **{"--cp": "2"}), {"--cp": "4", "--seq": "16384"}),
    ("CP 2→1 (Llama-like)", dict(LLAMA, **{"--cp": "2"}), {"--cp": "1"}),
    ("CP 1→2 on H200 (Llama-like)", LLAMA, {"--cp": "2", "--gpu": "h200-sxm"}),
    # The all-gather variant (Llama 3's: K and V all-gathered over the CP group before the forward
    # attention, dK and dV reduce-scattered after the backward one, on the compute stream): the
    # ring's exchanges emptied and the collectives inserted, or the reverse; re-timed or emptied.
    ("CP 2, ring → all-gather (Llama-like)", dict(LLAMA, **{"--cp": "2"}), {"--cp-comm": "allgather"}),
    ("CP 2, all-gather → ring (Llama-like)", LLAMA_CP2_AG, {"--cp-comm": "p2p"}),
    ("CP 2→4 all-gather with the sequence ×2 (Llama-like)", LLAMA_CP2_AG, {"--cp": "4", "--seq": "16384"}),
    ("CP 2→1 from all-gather (Llama-like)", LLAMA_CP2_AG, {"--cp": "1"}),
    ("CP 1→2 with all-gather (Llama-like)", LLAMA, {"--cp": "2", "--cp-comm": "allgather"}),
    ("CP 1→2 with all-gather and PP 1→2 (Llama-like, in the graph)", LLAMA, {"--cp": "2", "--cp-comm": "allgather", "--pp": "2"}),
    # Composed with DP and the global batch: the gradient group holds DP x CP ranks and is resized
    # once to the target's; the micro-batches per replica follow the replicas (DP), not CP.
    ("CP 2 with DP 2→4, same global batch (Llama-like, 2 → 1 micro-batches)", LLAMA_CP2_DP2, {"--dp": "4"}),
    ("CP 2→4 with DP 2→1 (Llama-like, DP × CP kept, 2 → 4 micro-batches)", LLAMA_CP2_DP2, {"--cp": "4", "--dp": "1"}),
    ("CP 2→1 with DP 2→4 (Llama-like)", LLAMA_CP2_DP2, {"--cp": "1", "--dp": "4"}),
    ("CP 1→2 with DP 1→2 (Llama-like, buckets inserted)", LLAMA, {"--cp": "2", "--dp": "2"}),
    ("CP 2, global batch ×2 (Llama-like, 2 → 4 micro-batches)", LLAMA_CP2_DP2, {"--global-batch": "8"}),
    ("CP 1→2, global batch ×2 (Llama-like, the inserted exchanges repeated with the micro-batches)", LLAMA,
     {"--cp": "2", "--global-batch": "8"}),
    # Composed with pipeline changes in the graph: the exchanges travel with the passes they sit in.
    ("CP 2, PP 1→2 (Llama-like, in the graph)", LLAMA_CP2_DP2, {"--pp": "2"}),
    ("CP 1→2 with PP 1→2 (Llama-like, in the graph)", LLAMA, {"--cp": "2", "--pp": "2"}),
    ("CP 2→4 with PP 1→2 (Llama-like, in the graph)", dict(LLAMA, **{"--cp": "2"}), {"--cp": "4", "--pp": "2"}),
    ("CP 2, PP 2→4 (Llama-like, in the graph)", dict(LLAMA_CP2_DP2, **{"--pp": "2"}), {"--pp": "4"}),
    ("CP 2, PP 2, 1F1B → interleaved 2 chunks (Llama-like, in the graph)", dict(LLAMA_CP2_DP2, **{"--pp": "2"}),
     {"--vp": "2", "--schedule": "interleaved"}),
    ("CP 2, PP 2, 1F1B → ZB-H1 (Llama-like, in the graph)", dict(LLAMA, **{"--cp": "2", "--pp": "2"}), {"--schedule": "zb-h1"}),
    ("CP 2, PP 2, global batch ×2 (Llama-like, 2 → 4 micro-batches, in the graph)", dict(LLAMA_CP2_DP2, **{"--pp": "2"}),
     {"--global-batch": "8"}),
    ("layers ×2 on H200", {}, {"--layers": "16", "--gpu": "h200-sxm"}),
    ("PP 2→4 with DP ×2 (in the graph)", {}, {"--pp": "4", "--dp": "4", "--global-batch": "32"}),
    # From traces without pipeline stages a PP change is made in the graph itself: every rank of
    # every stage with its own layers' launches and kernels (whatif/pipeline_graph.hpp).
    ("PP 1→2 (in the graph)", {"--pp": "1"}, {"--pp": "2"}),
    ("PP 1→4 (in the graph)", {"--pp": "1"}, {"--pp": "4"}),
    ("PP 1→4, GPipe (in the graph)", {"--pp": "1"}, {"--pp": "4", "--schedule": "gpipe"}),
    ("PP 1→2 with DP ×2 (in the graph)", {"--pp": "1"}, {"--pp": "2", "--dp": "4", "--global-batch": "32"}),
    ("PP 1→2 with TP 2→4 (in the graph)", {"--pp": "1"}, {"--pp": "2", "--tp": "4"}),
    ("PP 1→2 with TP 1→2 (in the graph)", {"--pp": "1", "--tp": "1"}, {"--pp": "2", "--tp": "2"}),
    ("PP 1→2 with layers ×2 (in the graph)", {"--pp": "1"}, {"--pp": "2", "--layers": "16"}),
    ("PP 1→2 with TP 1→2 and SP (in the graph)", {"--pp": "1", "--tp": "1"}, {"--pp": "2", "--tp": "2", "--sp": "on"}),
    ("PP 1→2, interleaved 2 chunks (in the graph)", {"--pp": "1"}, {"--pp": "2", "--vp": "2", "--schedule": "interleaved"}),
    ("PP 1→4, interleaved 2 chunks (in the graph)", {"--pp": "1"}, {"--pp": "4", "--vp": "2", "--schedule": "interleaved"}),
    # Zero bubble: each backward pass split into B and W by its weight-gradient kernels.
    ("PP 1→2, ZB-H1 (in the graph)", {"--pp": "1"}, {"--pp": "2", "--schedule": "zb-h1"}),
    ("PP 1→4, ZB-H1 (in the graph)", {"--pp": "1"}, {"--pp": "4", "--schedule": "zb-h1"}),
    ("PP 1→4, ZB-H2 (in the graph)", {"--pp": "1"}, {"--pp": "4", "--schedule": "zb-h2"}),
    ("PP 1→4, ZB-H2 with layers ×2 (in the graph)", {"--pp": "1"}, {"--pp": "4", "--schedule": "zb-h2", "--layers": "16"}),
    # Traces that ran a zero-bubble schedule (each pass marked on its own, as lumos synth writes
    # them): structure discovery tells their W passes. To ZB-H1 or ZB-H2 the split orders them in
    # the graph (their own W passes kept); to a schedule without W passes the pass-level model
    # measures them.
    ("ZB-H1 traces → 1F1B (pass-level)", {"--schedule": "zb-h1"}, {"--schedule": "1f1b"}),
    ("ZB-H1 traces → ZB-H2 (in the graph)", {"--schedule": "zb-h1"}, {"--schedule": "zb-h2"}),
    ("ZB-H1 traces, PP 2→4 (in the graph)", {"--schedule": "zb-h1"}, {"--pp": "4"}),
    ("ZB-H1 traces, DP ×2, same global batch (8 → 4 micro-batches, in the graph)", {"--schedule": "zb-h1"}, {"--dp": "4"}),
    ("ZB-H1 traces, global batch ×2 (8 → 16 micro-batches, in the graph)", {"--schedule": "zb-h1"}, {"--global-batch": "32"}),
    ("ZB-H1 traces, layers ×2", {"--schedule": "zb-h1"}, {"--layers": "16"}),
    ("ZB-H2 traces → ZB-H1 (in the graph)", {"--schedule": "zb-h2"}, {"--schedule": "zb-h1"}),
    ("ZB-H2 traces, PP 2→4 (in the graph)", {"--schedule": "zb-h2"}, {"--pp": "4"}),
    ("ZB-H2 traces, DP ×2, same global batch (8 → 4 micro-batches, in the graph)", {"--schedule": "zb-h2"}, {"--dp": "4"}),
    ("ZB-H2 traces, global batch ×2 (8 → 16 micro-batches, in the graph)", {"--schedule": "zb-h2"}, {"--global-batch": "32"}),
    # With another count of micro-batches per replica: the periods repeated or removed first.
    ("PP 1→2 with DP ×2, same global batch (8 → 4 micro-batches, in the graph)", {"--pp": "1"}, {"--pp": "2", "--dp": "4"}),
    ("PP 1→2, global batch ×2 (8 → 16 micro-batches, in the graph)", {"--pp": "1"}, {"--pp": "2", "--global-batch": "32"}),
    ("PP 1→2 with layers ×2, global batch ×2 (8 → 16 micro-batches, in the graph)", {"--pp": "1"},
     {"--pp": "2", "--layers": "16", "--global-batch": "32"}),
    ("PP 1→4 with layers ×2, ZB-H1, global batch ×0.5 (8 → 4 micro-batches, in the graph)", {"--pp": "1"},
     {"--pp": "4", "--layers": "16", "--schedule": "zb-h1", "--global-batch": "8"}),
    ("PP 1→4 from one micro-batch per replica (1 → 8, in the graph)", {"--pp": "1", "--global-batch": "2"},
     {"--pp": "4", "--global-batch": "16"}),
    # With traced stages a count change repeats or removes a micro-batch's forward and backward
    # passes on every stage, then the traces' schedule orders the new count.
    ("DP ×2, same global batch (8 → 4 micro-batches, in the graph)", {}, {"--dp": "4"}),
    ("global batch ×2 (8 → 16 micro-batches, in the graph)", {}, {"--global-batch": "32"}),
    ("GPipe, global batch ×2 (8 → 16 micro-batches, in the graph)", {"--schedule": "gpipe"}, {"--global-batch": "32"}),
    ("PP 4, micro-batch ×2 (8 → 4 micro-batches, in the graph)", {"--pp": "4"}, {"--micro-batch": "2"}),
    ("PP 2→4, global batch ×2 (8 → 16 micro-batches, in the graph)", {}, {"--pp": "4", "--global-batch": "32"}),
    # A layer change too: the layers repeated first, then the passes over their copies.
    ("layers ×2, global batch ×2 (8 → 16 micro-batches, in the graph)", {}, {"--layers": "16", "--global-batch": "32"}),
    ("1F1B → GPipe, layers ×2, global batch ×2 (in the graph)", {}, {"--schedule": "gpipe", "--layers": "16", "--global-batch": "32"}),
    ("PP 2→4, layers ×2, global batch ×2 (in the graph)", {}, {"--pp": "4", "--layers": "16", "--global-batch": "32"}),
    ("PP 4→2, global batch ×2 (merged stages, in the graph)", {"--pp": "4"}, {"--pp": "2", "--global-batch": "32"}),
    ("PP 4→2, layers ×2, global batch ×0.5 (merged stages, in the graph)", {"--pp": "4"},
     {"--pp": "2", "--layers": "16", "--global-batch": "8"}),
    # Without pipeline stages the micro-batches run in sequence (gradient accumulation): a count
    # change repeats or removes whole micro-batches in the graph.
    ("DP ×2, same global batch (8 → 4 micro-batches)", {"--pp": "1"}, {"--dp": "4"}),
    # Sequence parallelism gathers and reduce-scatters activations over TP: no FSDP shard group.
    ("DP ×2 with SP, global batch ×2", {"--pp": "1", "--sp": "on"}, {"--dp": "4", "--global-batch": "32"}),
    ("global batch ×2 (8 → 16 micro-batches)", {"--pp": "1"}, {"--global-batch": "32"}),
    ("micro-batch ×2, same global batch (8 → 4 micro-batches)", {"--pp": "1"}, {"--micro-batch": "2"}),
    ("layers ×2, global batch ×2 (8 → 16 micro-batches)", {"--pp": "1"}, {"--layers": "16", "--global-batch": "32"}),
    # From one replica the traces reduce no gradients: the distributed optimizer's buckets are
    # inserted (reduce-scatters as the backward completes their layers, all-gathers after the step).
    ("DP 1→2, same global batch (buckets inserted, 8 → 4 micro-batches)", {"--pp": "1", "--dp": "1", "--global-batch": "8"}, {"--dp": "2"}),
    ("DP 1→4, global batch ×4 (buckets inserted)", {"--pp": "1", "--dp": "1", "--global-batch": "8"}, {"--dp": "4", "--global-batch": "32"}),
    ("DP 1→2 with traced stages, global batch ×2 (buckets inserted)", {"--dp": "1", "--global-batch": "8"}, {"--dp": "2", "--global-batch": "16"}),
    ("DP 1→2 with PP 1→2 (buckets inserted, in the graph)", {"--pp": "1", "--dp": "1", "--global-batch": "8"}, {"--dp": "2", "--pp": "2"}),
    ("DP 1→2 with TP 2→4 (buckets inserted)", {"--pp": "1", "--dp": "1", "--global-batch": "8"}, {"--dp": "2", "--tp": "4"}),
    # One micro-batch per replica (a plain training loop): its passes are the period.
    ("global batch ×8 from one micro-batch per replica (1 → 8 micro-batches)", {"--pp": "1", "--global-batch": "2"},
     {"--global-batch": "16"}),
    ("micro-batch ×2 and global batch ×4 from one micro-batch per replica (1 → 2 micro-batches)",
     {"--pp": "1", "--global-batch": "2"}, {"--micro-batch": "2", "--global-batch": "8"}),
    # FSDP (whatif/fsdp.hpp): a Llama 3 8B-shaped job of 4 layers, every rank sharding the
    # parameters. --dp resizes each unit's all-gathers and reduce-scatters (count kept, shard 1/N);
    # --fsdp off replaces them with the distributed optimizer's buckets; reshard after forward off
    # removes the backward's gathers.
    ("FSDP degree 4→8", FSDP4, {"--dp": "8", "--global-batch": "16"}),
    ("FSDP degree 8→4", FSDP8, {"--dp": "4", "--global-batch": "8"}),
    ("FSDP degree 4→16 (two nodes)", FSDP4, {"--dp": "16", "--global-batch": "32"}),
    ("FSDP degree 4→8 on H200", FSDP4, {"--dp": "8", "--global-batch": "16", "--gpu": "h200-sxm"}),
    ("FSDP on → off (distributed optimizer)", FSDP4, {"--fsdp": "off"}),
    ("FSDP on → off with DP 8→4", FSDP8, {"--fsdp": "off", "--dp": "4", "--global-batch": "8"}),
    ("FSDP, reshard after forward on → off", FSDP4, {"--reshard-after-forward": "off"}),
    # --fsdp on from the distributed optimizer: its buckets removed, each unit's collectives inserted.
    ("FSDP off → on (from the distributed optimizer)", ZERO1, {"--fsdp": "on"}),
    ("FSDP off → on, reshard after forward off", ZERO1, {"--fsdp": "on", "--reshard-after-forward": "off"}),
    ("FSDP off → on with DP 4→8", ZERO1, {"--fsdp": "on", "--dp": "8", "--global-batch": "16"}),
    # HSDP (whatif/hsdp.hpp): the shard groups' collectives resized, the replica all-reduces
    # inserted after the final backward's reduce-scatters (those of HSDP traces removed first).
    ("FSDP → HSDP, shard group 8→4 (2 replicas)", FSDP8, {"--hsdp": "4"}),
    ("HSDP → FSDP, shard group 4→8", HSDP, {"--hsdp": "8"}),
    ("HSDP shard group 4→2 (4 replicas)", HSDP, {"--hsdp": "2"}),
    ("HSDP, DP 8→16 (4 replicas)", HSDP, {"--dp": "16", "--global-batch": "32"}),
    ("HSDP → off (distributed optimizer)", HSDP, {"--fsdp": "off"}),
    # With pipeline stages: each stage's shard group resized (4 micro-batches per replica), and
    # for HSDP each stage all-reduces its own units after its final backward.
    ("FSDP degree 8→4 with PP 2", FSDP8_PP2, {"--dp": "4", "--global-batch": "16"}),
    ("FSDP degree 4→8 with PP 2", FSDP4_PP2, {"--dp": "8", "--global-batch": "32"}),
    ("FSDP → HSDP with PP 2, shard group 8→4 (2 replicas)", FSDP8_PP2, {"--hsdp": "4"}),
    ("HSDP → FSDP with PP 2, shard group 4→8", HSDP_PP2, {"--hsdp": "8"}),
    ("HSDP with PP 2, shard group 4→2 (4 replicas)", HSDP_PP2, {"--hsdp": "2"}),
    ("HSDP with PP 2, DP 8→16 (4 replicas)", HSDP_PP2, {"--dp": "16", "--global-batch": "64"}),
    ("HSDP with PP 2 → off (distributed optimizer)", HSDP_PP2, {"--fsdp": "off"}),
]

# Mixture of experts: configuration M, a MoE job (Qwen3-30B-A3B's layer shape, 128 experts, top-8,
# expert FFN 768; 2 layers so that the script stays quick), TP 1, DP 4, EP 2, 2 micro-batches of 1
# per replica, H100, bf16. The MOE_CASES start from M instead of A.
MOE_BASE = {
    "--model": "qwen3-30b-a3b", "--layers": "2", "--seq": "4096", "--tp": "1", "--pp": "1", "--dp": "4", "--ep": "2",
    "--micro-batch": "1", "--global-batch": "8", "--gpu": "h100-sxm", "--precision": "bf16",
}
DDP = {"--distributed-optimizer": "off"}  # a case's traces and target without the distributed optimizer
# M at TP 2 (sequence parallel) with expert TP 1 and DP 2: the same 4 ranks, the experts unsharded.
ETP1 = {"--tp": "2", "--sp": "on", "--expert-tp": "1", "--dp": "2", "--global-batch": "4"}
MOE_CASES = [
    ("MoE: EP 2→4", {}, {"--ep": "4"}),
    # From EP 4 over DP 8 (two replicas of each expert shard: the expert gradients are reduced).
    ("MoE: EP 4→2", {"--ep": "4", "--dp": "8", "--global-batch": "16"}, {"--ep": "2"}),
    # From EP = DP (one replica of each expert shard: no expert gradient in the traces) the expert
    # gradients' reduction over the new expert-data-parallel group is inserted.
    ("MoE: EP 4→2 over DP 4 (expert gradients inserted)", {"--ep": "4"}, {"--ep": "2"}),
    # With the target's DP (the data-parallel pass shards the optimizer) and layers (the inserted
    # reduce-scatters go with their layers, the all-gathers are the target layers').
    ("MoE: EP 4→2 with DP 4→8 (expert gradients inserted)", {"--ep": "4"}, {"--ep": "2", "--dp": "8"}),
    ("MoE: EP 4→2 with layers 2→4 (expert gradients inserted)", {"--ep": "4"}, {"--ep": "2", "--layers": "4"}),
    ("MoE: EP 4→2 with DP 4→8 and layers 2→4", {"--ep": "4"}, {"--ep": "2", "--dp": "8", "--layers": "4"}),
    # Each rank steps experts / EP over DP x CP / EP replicas: the optimizer's expert share stays.
    ("MoE: EP 4→1 over DP 4", {"--ep": "4"}, {"--ep": "1"}),
    ("MoE: EP 2→1 (all-to-alls removed)", {}, {"--ep": "1"}),
    # The MoE pass re-times the traced expert gradients for the target's expert-DP group (DP x CP
    # / EP of the target): the data-parallel pass leaves them, and shards the optimizer once.
    ("MoE: EP 2→1 with DP 4→8", {}, {"--ep": "1", "--dp": "8", "--global-batch": "16"}),
    ("MoE: EP 2→4 with DP 4→8", {}, {"--ep": "4", "--dp": "8", "--global-batch": "16"}),
    # From EP 1 the dispatch and combine are inserted around each MoE layer pass's experts.
    ("MoE: EP 1→2 (all-to-alls inserted)", {"--ep": "1"}, {"--ep": "2"}),
    ("MoE: EP 1→4 (all-to-alls inserted)", {"--ep": "1"}, {"--ep": "4"}),
    ("MoE: experts 128→64", {}, {"--experts": "64"}),
    ("MoE: top-8→4", {}, {"--top-k": "4"}),
    ("MoE: expert FFN 768→1536", {}, {"--expert-ffn": "1536"}),
    ("MoE: EP 2→4 on H200", {}, {"--ep": "4", "--gpu": "h200-sxm"}),
    # From EP = DP (no expert gradient traced to tell the experts' share of the optimizer) the
    # model counts the parameters each rank steps; a larger DP inserts the experts' reduction.
    ("MoE: expert FFN 768→1536 over EP = DP 4 (optimizer by the model's parameters)", {"--ep": "4"}, {"--expert-ffn": "1536"}),
    ("MoE: DP 4→8 over EP 4 (expert gradients inserted)", {"--ep": "4"}, {"--dp": "8", "--global-batch": "16"}),
    # Context parallelism (whatif/context_parallel.hpp with the MoE pass): the tokens per rank, and
    # so the expert GEMMs, router and all-to-alls, follow seq / CP; the expert gradients' group is
    # DP x CP / EP.
    ("MoE: CP 1→2", {}, {"--cp": "2"}),
    ("MoE: CP 2→1", {"--cp": "2"}, {"--cp": "1"}),
    ("MoE: CP 2→4 with the sequence ×2", {"--cp": "2"}, {"--cp": "4", "--seq": "8192"}),
    ("MoE: CP 1→2 with EP 2→4", {}, {"--cp": "2", "--ep": "4"}),
    ("MoE: CP 2, EP 2→4", {"--cp": "2"}, {"--ep": "4"}),
    ("MoE: CP 1→2 with EP 1→2 (all-to-alls inserted)", {"--ep": "1"}, {"--cp": "2", "--ep": "2"}),
    ("MoE: CP 1→2 with all-gather", {}, {"--cp": "2", "--cp-comm": "allgather"}),
    # The expert-data-parallel group's members are TP x EP apart: 8 of them span two nodes.
    ("MoE: CP 2, DP 4→8 (two nodes)", {"--cp": "2"}, {"--dp": "8", "--global-batch": "16"}),
    ("MoE: sequence ×2", {}, {"--seq": "8192"}),
    # The optimizer steps the target layers' parameters (experts included), the experts' all-gathers
    # after it are every layer's.
    ("MoE: layers 2→4", {}, {"--layers": "4"}),
    # A stage split: each stage's optimizer steps, and its buckets reduce, its own layers'
    # parameters (the embedding on the first stage, the head on the last).
    ("MoE: PP 1→2 (in the graph)", {}, {"--pp": "2"}),
    ("MoE: PP 1→2 with EP 2→4 (in the graph)", {}, {"--pp": "2", "--ep": "4"}),
    ("MoE: PP 1→2 from EP 1 (in the graph)", {"--ep": "1"}, {"--pp": "2"}),
    # Interleaved: each chunk's buckets, the first layer's experts reduced before the embedding's.
    ("MoE: PP 1→2, interleaved 2 chunks (in the graph)", {"--layers": "4"}, {"--pp": "2", "--vp": "2"}),
    # With the target's DP: each stage's buckets over the target's groups, the optimizer sharded once.
    ("MoE: PP 1→2 with DP 4→8 (in the graph)", {}, {"--pp": "2", "--dp": "8", "--global-batch": "16"}),
    # Stages of one layer: the vocabulary (the embedding and head's parameters) from the logits GEMM,
    # not the routers' (outside the undelimited layer of such a stage's backward).
    ("MoE: PP 4→2 at 4 layers, in the graph", {"--layers": "4", "--pp": "4"}, {"--pp": "2"}),
    # DDP (`--distributed-optimizer off`, traces and target): the dense and the experts' gradients
    # all-reduced over their DP groups, every rank stepping all its parameters' optimizer states.
    ("MoE DDP: EP 4→2", dict(DDP, **{"--ep": "4", "--dp": "8", "--global-batch": "16"}), {"--ep": "2"}),
    ("MoE DDP: EP 4, DP 4→8 (expert gradients inserted)", dict(DDP, **{"--ep": "4"}), {"--dp": "8", "--global-batch": "16"}),
    ("MoE DDP: PP 1→2 (in the graph)", DDP, {"--pp": "2"}),
    # Expert TP other than TP (Megatron's --expert-tensor-parallel-size): whatif reads it from the
    # traces and regroups the folded expert grid (expert TP x EP x expert DP over TP x DP x CP).
    ("MoE, expert TP 1 under TP 2: EP 2→4", ETP1, {"--ep": "4"}),
    ("MoE, expert TP 1 under TP 2: EP 2→1", ETP1, {"--ep": "1"}),
    ("MoE, expert TP 1 under TP 2: DP 2→4", ETP1, {"--dp": "4", "--global-batch": "8"}),
    ("MoE, expert TP 1 under TP 2: CP 1→2", ETP1, {"--cp": "2"}),
    ("MoE, expert TP 1 under TP 2: expert FFN 768→1536", ETP1, {"--expert-ffn": "1536"}),
    ("MoE, expert TP 2 over TP 1: DP 4→8", {"--expert-tp": "2"}, {"--dp": "8", "--global-batch": "16"}),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 3.0  # percent


def flags(d):
    out = []
    for k, v in d.items():
        out += [k, v]
    return out


def target(a, change):
    """Configuration B of a case: A with the what-if's flags."""
    b = dict(a, **change)
    if b.get("--fsdp") == "off":
        b.pop("--hsdp", None)
    if b.get("--cp", "1") == "1":
        b.pop("--cp-comm", None)
    return b


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def synth(lumos, conf, out):
    r = run([lumos, "synth"] + flags(conf) + ["--detail", "kernel", "--unfold", "--out", out])
    if r.returncode != 0:
        raise SystemExit("lumos synth failed: " + " ".join(flags(conf)) + "\n" + r.stderr)


def replay_ns(lumos, path):
    r = run([lumos, "replay", path, "--json"])
    if r.returncode != 0:
        raise SystemExit("lumos replay failed on " + path + "\n" + r.stderr)
    return json.loads(r.stdout)["job"]["simulated_ns"]


# Bounds of --check: the target for each case, and the mean.
CHECK_EACH = TARGET
CHECK_MEAN = 1.5


def markers(doc, path):
    """(start, end) offsets of the generated section between the whatif-validation markers of `doc`."""
    begin = re.search(r"<!-- whatif-validation:begin[^>]*-->\n", doc)
    end = doc.find("<!-- whatif-validation:end -->")
    if begin is None or end < 0 or end < begin.end():
        raise SystemExit(path + ": no <!-- whatif-validation:begin ... --> / <!-- whatif-validation:end --> markers")
    return begin.end(), end


def current_section(path):
    """The generated section of the document as it stands."""
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin, end = markers(doc, path)
    return doc[begin:end]


def ms(ns):
    return "%.3f" % (ns / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lumos", default="build/release/examples/lumos", help="the lumos binary")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "whatif.md"), help="the document whose section is replaced")
    ap.add_argument("--print", action="store_true", help="print the section instead of writing the document")
    ap.add_argument("--check", action="store_true",
                    help="the test (ctest whatif_tables): the document's section equals the one generated now, every "
                         "case built, each within %g %%%% and the mean within %g %%%%; writes nothing" % (CHECK_EACH, CHECK_MEAN))
    args = ap.parse_args()
    lumos = os.path.abspath(args.lumos)
    if not os.access(lumos, os.X_OK):
        raise SystemExit(lumos + ": not an executable (build it: cmake --build build/release --target lumos)")

    rows = []
    wrong_model = []  # cases named "(in the graph)" that were not, or the reverse
    within = built = 0
    errors = []
    with tempfile.TemporaryDirectory(prefix="lumos-whatif-tables-") as tmp:
        made = {}

        def traces(conf):
            key = tuple(sorted(conf.items()))
            if key not in made:
                d = os.path.join(tmp, "job%d" % len(made))
                synth(lumos, conf, d)
                made[key] = (d, replay_ns(lumos, d))
            return made[key]

        for case in [c + (BASE,) for c in CASES] + [c + (MOE_BASE,) for c in MOE_CASES]:
            name, a_changes, change, origin_base = case
            a = dict(origin_base, **a_changes)
            b = target(a, change)
            a_dir, base_ns = traces(a)
            _, direct_ns = traces(b)
            cmd = [lumos, "whatif", a_dir] + flags(change) + ["--json"]
            r = run(cmd)
            shown = " ".join(shlex.quote(x) for x in flags(change))
            origin = "M" if origin_base is MOE_BASE else "A"
            a_text = origin if not a_changes else origin + " with " + " ".join(flags(a_changes))
            if r.returncode != 0:
                first = (r.stderr.strip().splitlines() or ["(no message)"])[0]
                first = re.sub(r"/[^ ]*lumos-whatif-tables-[^ /]*/", "", first)
                rows.append("| %s | %s | `%s` | %s | not built yet (exit %d: %s) | %s | | |" %
                            (name, a_text, shown, ms(base_ns), r.returncode, first.replace("|", "\\|"), ms(direct_ns)))
                continue
            built += 1
            out = json.loads(r.stdout)
            pred_ns = out["predicted"]["iteration_ns"]
            model = (out.get("pipeline") or {}).get("model")
            if ("in the graph" in name) != (model == "graph"):
                wrong_model.append("%s: pipeline model %s" % (name, model))
            err = 100.0 * (pred_ns - direct_ns) / direct_ns
            ok = abs(err) <= TARGET
            within += ok
            errors.append(abs(err))
            rows.append("| %s | %s | `%s` | %s | %s | %s | %+.2f %% | %s |" %
                        (name, a_text, shown, ms(base_ns), ms(pred_ns), ms(direct_ns), err, "yes" if ok else "**no**"))


    base_text = " ".join(flags(BASE))
    lines = [
        "Generated by `scripts/whatif_tables.py` (do not edit by hand; run `python3 scripts/whatif_tables.py`",
        "after building `lumos`). Configuration A: `lumos synth %s --detail kernel --unfold`" % base_text,
        "(GPT-style, FFN 4h, vocabulary 51200; one trace file per rank, 8 ranks). For each case: baseline = `lumos replay` of A's",
        "traces; predicted = `lumos whatif A_DIR FLAGS --json`; direct = `lumos synth` of B (A with FLAGS) with the same",
        "detail, replayed; error = (predicted − direct) / direct. Times are the iteration in ms. The MoE cases start from",
        "configuration M: `lumos synth %s --detail kernel --unfold` (4 ranks)." % " ".join(flags(MOE_BASE)),
        "",
        "| case | from | what-if flags | baseline | predicted | direct | error | ≤ %g %% |" % TARGET,
        "|---|---|---|---:|---:|---:|---:|:---:|",
    ] + rows + [
        "",
        "%d of %d cases built; %d within %g %%%s." % (
            built, len(CASES) + len(MOE_CASES), within, TARGET,
            ("; mean |error| %.2f %%" % (sum(errors) / len(errors))) if errors else ""),
    ]
    section = "\n".join(lines) + "\n"
    if args.check:
        mean = sum(errors) / len(errors) if errors else float("inf")
        problems = []
        have = current_section(args.doc)
        if have != section:
            diff = difflib.unified_diff((have or "").splitlines(), section.splitlines(), "document", "generated now", lineterm="", n=0)
            problems.append("%s's section differs from what the script generates now (run python3 scripts/whatif_tables.py):\n  %s"
                            % (args.doc, "\n  ".join(list(diff)[:40])))
        if built != len(CASES) + len(MOE_CASES):
            problems.append("%d of %d cases built" % (built, len(CASES) + len(MOE_CASES)))
        problems += wrong_model
        if errors and max(errors) > CHECK_EACH:
            problems.append("a case misses by %.2f %% (> %g %%)" % (max(errors), CHECK_EACH))
        if mean > CHECK_MEAN:
            problems.append("mean |error| %.2f %% (> %g %%)" % (mean, CHECK_MEAN))
        print("whatif_tables: " + ("; ".join(problems) if problems else "passed"))
        sys.exit(1 if problems else 0)
    if args.print:
        sys.stdout.write(section)
        return
    with open(args.doc, encoding="utf-8") as f:
        doc = f.read()
    begin, end = markers(doc, args.doc)
    doc = doc[:begin] + section + doc[end:]
    with open(args.doc, "w", encoding="utf-8") as f:
        f.write(doc)
    sys.stdout.write(section)


if __name__ == "__main__":
    main()
