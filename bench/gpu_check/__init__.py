"""The prepared GPU run: correctness first, then measurements, in one bounded command.

    bash bench/gpu_check.sh OUT                        # on the GPU machine, under 8 minutes
    python -m bench.gpu_check --out OUT [--budget-s 450] [--workdir DIR] [--parts NAME ...]
    python -m bench.gpu_check --out OUT --dry-run      # the same parts, tiny, on the CPU

Each part runs in its own process under its own time limit (``isolation``), so a hang or a
CUDA error in one cannot take the others down; the run goes on with the next part whatever
happened, and records each part as ``ok``, ``failed`` (with the tail of its output),
``timed out`` or ``skipped`` (with why). ``OUT/report.md`` and ``OUT/results.json`` (every
number) are rewritten after every part (``report``), so a run killed midway still leaves
what finished; ``OUT/gpu_check.log`` holds every part's own output. The parts import no
rclpy, ZMQ, cv_bridge, cv2 or PIL: they run with those hidden, as on a bare machine with
only Python, torch, triton, transformers and numpy.

Parts, in order, one module each (limits at ``--budget-s 450``, scaled with it; H200 seconds
from runs A and B where they ran):

============ ======= ========= ================================================================
part         limit s H200 s    what
============ ======= ========= ================================================================
environment  25      7-10      versions, the GPU, the device's copy bandwidth and matmul rate
                               (measured once here; the later parts' floors use them)
kernels      75      26        every kernel against its float32 reference: ragged bf16, fp16,
                               fp32, a CUDA-graph replay of decode, every benchmark shape in
                               bf16 and again in fp16; decode / extend / store times and GB/s
                               against the copy bandwidth (``bench.gpu_kernels``)
checkpoint   55      42-46     the openvla-7b folder with random bf16 weights (15 GB) in the
                               work dir, written once (``bench.lib.checkpoints``)
model        100     44        our runner eager and with CUDA graphs against transformers on
                               openvla-7b (``bench.runner_vs_generate``): last-token logits,
                               greedy agreement, 1 and 16 robots; one robot's runner step
                               against the floor
engine_core  45      29        ``ScheduledCore`` on the folder, 4 robots x 3 steps:
                               ``check_integrity()`` after every scheduler step, every step
                               ends as exactly one result or failure; the vision encoder eager
                               against captured
serving      95      49        the engine core paced at 10 Hz per robot for 1, 4, 8, 12, 16
                               and 32 robots (``bench.engine_paced``), then 1-12 again with
                               mixed passes: latency p50/p99, deadline hits, actions/s, the
                               robot count the matmul rate allows and the share of it served,
                               one robot's step against the floor (``bench.lib.cost_model``)
scheduler    55      35        scheduler host time per decode step, null and 7B runner,
                               overlap on and off (``bench.scheduler_cost``)
============ ======= ========= ================================================================

The dry run uses a tiny OpenVLA-format folder, the Triton interpreter and short windows;
it checks the script, not speed (about two minutes on two CPU cores).
"""
