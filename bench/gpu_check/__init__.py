"""The prepared GPU run: correctness first, then measurements, in one bounded command.

    bash bench/gpu_check.sh OUT                        # on the GPU machine, under 9 minutes
    python -m bench.gpu_check --out OUT [--budget-s 510] [--workdir DIR] [--parts NAME ...]
    python -m bench.gpu_check --out OUT --dry-run      # the same parts, tiny, on the CPU

Each part runs in its own process under its own time limit (``isolation``), so a hang or a
CUDA error in one cannot take the others down; the run goes on with the next part whatever
happened, and records each part as ``ok``, ``failed`` (with the tail of its output),
``timed out`` or ``skipped`` (with why). ``OUT/report.md`` and ``OUT/results.json`` (every
number) are rewritten after every part (``report``), so a run killed midway still leaves
what finished; ``OUT/gpu_check.log`` holds every part's own output. A part also saves what it
has measured so far after each unit of work (``PartContext.save_partial``: each check or
sweep row of ``kernels``, each robot count of ``model``, each step of ``profile``, each
window and capacity of ``serving``, each measure of ``oft``, ``pi0`` and ``smolvla``), so
a part that runs out of time or fails, or is stopped with the whole run, keeps it: its entry
gains ``partial``, its report section is rendered from it marked "partial (the part ran out
of time after ...)", and the targets it gives are read from it and marked as from a partial
part. The parts import no rclpy, ZMQ, cv_bridge, cv2 or PIL: they run with those hidden, as
on a bare machine with only Python, torch, triton, transformers and numpy.

Parts, in order, one module each (limits at ``--budget-s 510``, scaled with it; H200 seconds
from runs A and B where they ran):

============ ======= ========= ================================================================
part         limit s H200 s    what
============ ======= ========= ================================================================
environment  27      7-10      versions, the GPU; first, before any timing, the decode kernel's
                               builds on it (``builds``: each variant's registers, spills and
                               resident programs, and whether it fits as the split rule
                               plans); then the device's copy bandwidth and matmul rate
                               (measured once here; the later parts' floors use them)
kernels      70      26        every kernel against its float32 reference: ragged bf16, fp16,
                               fp32, a CUDA-graph replay of decode, every benchmark shape in
                               bf16 and again in fp16; decode / extend / store times and GB/s
                               against the copy bandwidth, SDPA over the same slots as the
                               baseline; then a sweep of launch configs, started until 55 s
                               in (``bench.gpu_kernels``)
checkpoint   50      42-46     the openvla-7b folder with random bf16 weights (15 GB) in the
                               work dir, written once (``bench.lib.checkpoints``)
model        48      44        our runner eager and with CUDA graphs against transformers on
                               openvla-7b (``bench.runner_vs_generate``): last-token logits,
                               greedy agreement, 1 and 16 robots; their steps against the
                               floor of one robot and of a batch of 16
profile      30      -         torch.profiler's CUDA kernel table (calls, total and mean time,
                               share) of a decode step of 1 and 16 requests replayed from its
                               graph and of a prefill of 1 and 16 robots with vision
engine_core  32      29        ``ScheduledCore`` on the folder, 4 robots x 3 steps:
                               ``check_integrity()`` after every scheduler step, every step
                               ends as exactly one result or failure; the vision encoder eager
                               against captured
serving      93      49 (*)    the capacity at 10 Hz by the one capacity rule
                               (``bench.lib.capacity``), by bisection up to 16 robots, on a core
                               with separate prefill and decode passes and on one with mixed
                               passes (``bench.engine_paced``); the robot count the matmul rate
                               allows, one robot's step against the floor
oft          45      -         OpenVLA-OFT on the folder (linked, with a random head of
                               151 M parameters; the LIBERO preset: 2 cameras, chunks of 8),
                               bf16, as served: its passes captured as CUDA graphs, checked
                               against the eager pass on the same batch; one robot's step and
                               16 robots' replayed from the graphs against their floors (with
                               their padding), one robot's eager step beside them; the
                               capacity at 10 Hz of chunks on the engine core (with its
                               graphs) by the one capacity rule (bisection up to the FLOP
                               ceiling)
scheduler    37      35        scheduler host time per decode step, null and 7B runner,
                               overlap on and off (``bench.scheduler_cost``)
pi0          50      -         pi0.5 at real sizes (Gemma 2B, the 300M expert, SigLIP) with
                               random bf16 mixed weights, written in the work dir with the tiny
                               tokenizer (its digits single pieces, so the prompt has the real
                               length), served by the engine core with its prefix, denoising
                               and tower passes replayed as CUDA graphs: checked against an
                               eager core on the same steps; one robot's step against its floor
                               and SGLang's 43 ms, 16 robots submitted together, the capacity at
                               10 Hz of chunks by the one capacity rule
smolvla      28      -         SmolVLA at real sizes (``lerobot/smolvla_base``: SmolVLM2-500M's
                               tower and 16 text layers, the expert) with random bf16 weights,
                               written in the work dir (``bench.smolvla_step``), served by the
                               engine core with its prefix, denoising and tower passes
                               replayed as CUDA graphs: checked against an eager core on the
                               same steps; one robot's step against its floor, 16 robots
                               submitted together, the capacity at 10 Hz of chunks by the one
                               capacity rule (bisection up to 32, 32 tried right after 1)
============ ======= ========= ================================================================

(*) run B's serving part paced 10 fixed robot counts on one core; two cores (loaded in
about 20 s each) with at most 6 windows of about 4.5 s each are expected to take 80-110 s.
The pi0 part's 55 s came from the others' margins over their last measured times (a few
seconds each) and from the unmeasured serving (120 to 100 s) and oft (60 to 50 s) parts; the
smolvla part's 28 s from pi0 (55 to 50 s), serving (100 to 93 s), oft (50 to 45 s), profile
(35 to 30 s) and a second or two of model, checkpoint, engine_core and scheduler's margins
(docs/benchmarks.md). It runs last, so a part that overruns shortens only it.

``report.md`` opens with issue 22's targets (``targets``): each measure with its value, its
floor, the target and whether it is met, then OpenVLA-OFT's measures as information rows (no
target); ``results.json`` holds them under ``targets``.

The dry run uses a tiny OpenVLA-format folder, the Triton interpreter and short windows;
it checks the script, not speed (about two minutes on two CPU cores).
"""
