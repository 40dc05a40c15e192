"""SLAYER on NVIDIA GPUs: the fixes that make lava-dl 0.6.0's CUDA path run on every GPU
and give the CPU path's (hence Lava's) spikes, applied by :func:`neurofed.compat.slayer`.

* :mod:`~neurofed.gpu.slayer_cuda` — the JIT arch list from the devices present (lava-dl
  pins sm_80 only), a one-line error when a CUDA kernel cannot be built, and the exact
  integer threshold for SLAYER's CUDA leaky integrator.
* :mod:`~neurofed.gpu.cuba_triton` — the fused CUBA neuron on CUDA in Triton
  (``federation.gpu_kernels``), bit-exact with the CPU kernel.
* :mod:`~neurofed.gpu.rng` — rate-coded spikes from a counter-based generator: the same
  spikes on any device (not yet used by the input encoding).
"""
