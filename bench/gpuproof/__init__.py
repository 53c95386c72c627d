"""The GPU proof kit behind ``bench/gpu_proof.py``: what a GPU host has, the ``gpu`` tests,
autotune's probe and tune of the bundled CUDA example, and an interleaved side-by-side of one
rank against several co-located under MPS (and time-sliced), each step recorded with what ran,
what was skipped and why.

Outside the product: it drives autotune only through its command line and reads NVML
(``pynvml``) and MPS (``nvidia-cuda-mps-control``) itself, so it checks the product's claims
rather than repeating them. Standard library, plus ``pynvml`` and torch where present.

Modules: `procs` (every process it starts, and the sweep for leftovers), `nvmlread` (NVML
readings and a sampler), `mpsd` (its own MPS daemon), `facts` (the env step), `steps` (tests,
probe, tune), `measure` (the side-by-side), `record` (step records on disk), `report` (JSON and
markdown).
"""
