"""Fast, bit-exact CPU kernels for SLAYER CUBA-LIF blocks (lava-dl 0.6.0).

SLAYER's CPU neuron dynamics run a Python loop over time steps, each step a dozen
small int64/float32 tensor operations (``leaky_integrator._li_dynamics_fwd`` and
``_li_dynamics_bwd``); the ``Spike`` autograd function, the one-step ``delay`` shift
and the one-channel pooling convolution add several full passes over memory.
:func:`enable` replaces these CPU code paths at run time (module and class
attributes only; no installed file changes) with a small C++ extension:

every patch point is listed, with the lava-dl function it replaces and the tests that
prove it bit-identical, in :data:`neurofed.kernels.patches.PATCHES`. The package:

* ``csrc/`` the C++ (one translation unit, ``module.cpp``): ``simd.h`` the 16-lane
  vectors every kernel is written with (GCC/Clang vector extensions: one zmm register
  on AVX-512, two 8-lane halves elsewhere; x86 intrinsics only where the portable form
  compiles to slow code, each next to its portable twin), ``common.h`` shared helpers,
  ``neuron.h``, ``synapse.h``, ``vnni.h`` (8-bit products: vpdpbusd on AVX-512 VNNI;
  without AVX-512, 16-bit partial sums of vpmaddubsw widened every 64 steps, or their
  portable twin), ``pool.h``, ``quantize.h`` (SLAYER's 8-bit weight hook);
* :mod:`~neurofed.kernels.variants` compiles it per instruction-set variant, cached;
  on a CPU without AVX-512 also the AVX-512 variants with their intrinsics emulated
  by SIMDe (``variants.EMULATED``), which the tests check against stock SLAYER like
  the native builds (SIMDe stores and loads every lane of a masked store or load, and
  has no masked gather, ``reduce_add_ps`` or ``vcvttps2qq``: ``csrc/avx512_emulated.h``
  supplies those five by their definitions);
* :mod:`~neurofed.kernels.ops` the autograd functions calling the kernels;
* :mod:`~neurofed.kernels.patches` the patch points and :func:`enable` / :func:`disable`.

Exactness (checked bit for bit against stock SLAYER by ``tests/test_fast_cuba.py``,
including a digits CNN training step; ``benchmarks/train_throughput.py`` compares
parameters after several Adam steps):

* the neuron kernels perform, per element, the same IEEE float32 / int64 operations
  in the same order as SLAYER's code (notes next to each kernel say why); the only
  transcendental function, ``exp`` in the surrogate gradient, is still evaluated by
  ``torch.exp`` on a same-shaped tensor of identical values;
* the neuron forward runs 16 neurons per vector in int32 lanes when a bound on the
  tile group's inputs and states (checked per group) keeps every integer below
  2^30, else 8 per vector in int64 lanes as SLAYER: the same integers either way
  (0.56 -> 0.43 ms for 32768 neurons x 16 steps);
* the surrogate gradient's argument, which only the neuron backward reads, stays in
  the kernels' [16 neurons][T] tile layout (``torch.exp`` is elementwise, so the
  exact mode still takes it from torch on the same values): no transposes for it on
  either side (digits conv1 neuron backward 0.52 -> 0.38 ms in a training step);
* the C++ is compiled with ``-ffp-contract=off`` (no fused multiply-add) and
  without ``-ffast-math``; vector lanes run across independent neurons;
* the synapse forward kernels run only on 0/1 inputs and on weights for which every
  partial sum is exactly representable (checked at run time: integer multiples of
  2^-k with per-channel sum |w| * 2^k < 2^24, true for SLAYER's 8-bit quantized
  weights; the VNNI kernel also needs every w * 2^k in [-128, 127], i.e. |w| < 4 on
  SLAYER's 2^-5 grid, and sums those integers exactly in int32), so any summation
  order gives the exact sum F.conv3d returns (a zero
  sum could differ in the sign of zero, which nothing downstream observes: the
  neuron reads ``(int64)(w_scale * z)``); otherwise F.conv3d itself runs. Weight and input gradients of Conv/Dense synapses come
  from the very ``aten.convolution_backward`` call autograd would make;
* SLAYER's 8-bit weight hook (``utils.quantize_hook_fx``: round to the step, clamp,
  descale) runs as one pass each way with torch's float32 operations lane by lane
  (round half to even in vector arithmetic): on S-VGG9's 5.9 M weights 39 against
  85 ms per step forward and backward (AVX2, 1 thread); the weight check of the
  synapse kernels is vectorized, and the 8-bit kernel counts the input's spikes
  before it reads a weight, so a sparse input reaches the spike-driven kernel
  without a wasted weight pass (S-VGG9's silent 4096 -> 1024 dense layer: 13 -> 2 ms);
* anything outside these domains (CUDA, float64, graded spikes, norm, trainable or
  per-channel decays, debug mode, ...) falls back to the stock code.

Where the time of a digits CNN step still goes (1 thread; ``benchmarks/
train_throughput.py`` prints the breakdown, ``benchmarks/results/
train_throughput.txt`` records it): from a quarter (AVX-512) to nearly half (AVX2)
in oneDNN's convolution backward (weight and input gradients are sums of arbitrary
floats whose bits depend on oneDNN's summation order, so the stock call stays),
about 30 % in the fused
neuron kernels (fixed-point recurrences; throughput-bound, with the tile
transposes), a tenth each in torch.exp for the surrogate gradient (MKL's
``vmsExp``) and in the synapse forward kernels, the rest in pooling, Adam, the
loss and Python. On AVX2 (AMD EPYC Zen 3, sampled with py-spy and perf):
42 % in the convolution backward, of which oneDNN's im2col for its gemm-based weight
gradient alone is 12 %; 13 % in the neuron forward, 8 % in ``vmsExp``, about 8 % in
the interpreter. Tried and dropped, each measured slower or
no faster with the same bits: a lookup table for the surrogate derivative (it is a
function of the integer voltage, but voltages range too widely below threshold for
a cache-resident table, and the gather costs what exp does: 250k integer voltages
per 520k neurons x steps in the digits CNN's first layer; tried again as a table per
neuron's constants kept across steps and grown on demand: in the benchmark's
training the voltages' span grew from 136k to 228k integers within 100 steps (to
570k at batch 1), and even an L1-resident table's gather, one load per neuron-step,
cost 0.35 ms against exp's 0.5 ms for 524k values: a step gained about 1 %); an
FMA-corrected reciprocal instead of the surrogate argument's division (the
division is 0.1 ms of a 10 ms step on AVX2, measured with a multiply in its place,
too little to carry a correct-rounding proof per tau); ``vmsExp`` called
inside the backward kernel on blocks of rows (MKL's per-call cost outweighs the
saved pass); the spike-driven kernel for
inputs above ~15 % activity and for small fan-ins (oneDNN, and below fan-in 64 the
time-lane kernel, are faster there); float64 lanes instead of int64 for the neuron
states (exact below 2^53, and it passed the exactness tests, but no faster: the
forward kernel is bound by its conversions and tile transposes, not by the 64-bit
multiply; int32 lanes, twice as many per vector, are faster: see Exactness above);
torch's fused CPU Adam (40 vs 102 us per optimizer step, no measurable change in a
training step, and it would shift every recorded accuracy).

AVX-512 code generation, checked without an AVX-512 CPU (none was at hand since the
kernels were rewritten on portable vectors): the x86-64-v4+vnni build's hot inner
loops against those of the earlier intrinsics code (``git show 3478b40^:neurofed/
models/fast_cuba.py``), same flags, in llvm-mca's Ice Lake server model. Portable
forms GCC lowered badly now call their intrinsics in ``simd.h``'s AVX-512 half:
masked selects (int32 neuron step 55.2 -> 41.9 cycles per iteration; old 39.8),
``reduce_add_ps`` (time-lane weight-gradient flush 343 -> 156; old 156), the
int64 conversion and compare (int64 neuron step 73.7 -> 61.1; old 71.2); a float
broadcast written as ``0 + x`` cost an add per weight in the time-lane loops
(every target). The other kernels' hot inner loops match the old ones within half a
cycle per iteration, except ``spike_weight_grad``'s accumulate loop (the same 18 adds,
13.1 against 11.8 cycles) and ``cuba_bwd``'s (one more conversion, from the tile
layout of the surrogate argument). These are model figures; no AVX-512 timing was taken.

Fast gradients (opt-in: ``enable(gradients="fast")``, config ``federation.fast_gradients``)
-------------------------------------------------------------------------------------------
The forward is unchanged (spikes bit-identical to SLAYER, so Lava export fidelity is
unaffected); some backward steps are computed another way:

* the weight gradient of a synapse with fan-in Ci * KH * KW < 64 (a first layer) or
  of a dense layer with fewer than 16 outputs (a classifier head) comes from
  ``tlane_weight_grad``: multiply-adds with the 16 lanes along T and the
  accumulators in registers, float32 over at most 64 vectors then float64, in a
  fixed order (deterministic, independent of the thread count, more accurate than
  oneDNN's: 4e-8 against 1.2e-7 of the sum of |terms| on the tested shapes);
* the input gradient of a 1x1 synapse (a Dense layer) comes from
  ``tlane_input_grad_1x1``, a time-lane product with the transposed weights (float32
  sums over the output channels in order); that of a stride-1 convolution with at
  most 16384 weights on an image of at most 64 pixels from ``tlane_input_grad``,
  which skips the kernel taps on the zero padding (oneDNN multiplies them; at 4x4,
  3x3 a third of all taps) and sums float32 over taps and output channels in order;
* the weight gradient of a 3x3 or 5x5 stride-1 convolution with fan-in >= 64 and
  <= 35 % active inputs comes from ``spike_weight_grad``: only positions with an
  input spike add their output gradient (oneDNN multiplies the zeros too), into
  accumulators held in registers per input channel. Its sum runs in a fixed order
  (float32 within a sample, float64 across samples in fixed chunks), so it is
  deterministic and independent of the thread count, and at least as accurate as
  oneDNN's;
* the surrogate gradient's ``exp`` is evaluated inside the neuron backward kernel
  (Cephes polynomial, 16 lanes, fused multiply-adds where the CPU has them): within 1 ulp of ``torch.exp`` where the result is
  a normal float, 0 where torch.exp returns a subnormal (< 1.2e-38).

Tolerance (``tests/test_fast_gradients.py``): on a 5-block test network every
gradient is within 1e-5 of stock SLAYER's, relative to the tensor's largest entry
(measured 5e-7); the weight-gradient kernel is within 2e-7 of the float64 sum,
relative to the sum of the absolute terms. On the benchmark's S-VGG9 (13 blocks)
the difference reaches 4e-6 to 1e-5. For scale, stock SLAYER's own weight gradients
move by up to 7e-6 between 1 and 2 torch threads (oneDNN's reduction order depends
on the thread count), so bit-identity with SLAYER only ever holds at a fixed thread
count.
Training from the same start then follows a slightly different trajectory, as it
would with another thread count. Measured gain (``benchmarks/train_throughput.py``,
best steps over stock, three runs; see ``benchmarks/results/train_throughput.txt``):
the digits CNN 6.1-6.7x -> 7.8-8.5x at 1 thread and 7.8-8.9x -> 10.4-10.9x at 2;
S-VGG9 2.5-2.8x -> 3.3-3.9x at 1 thread. On the digits CNN all weight gradients and
every input gradient come from these kernels; only the neuron kernels, the synapse
forward and about 1.5 ms of Python and autograd per step remain.

Use::

    from neurofed import kernels
    kernels.build()          # optional: compile now (cached in ~/.cache/neurofed/ext)
    kernels.enable()         # patch SLAYER; falls back to stock with one warning line
    with kernels.enabled(False):
        ...                  # temporarily run stock SLAYER

``make setup`` compiles every variant the CPU runs (about 30 s each on an idle
machine; needs a C++ compiler and ninja). ``NEUROFED_EXT_DIR`` moves the cache,
``NEUROFED_KERNELS`` picks a variant (see :mod:`~neurofed.kernels.variants`).
A built variant loads without a lock; only a build takes one (``build.lock``, an
OS lock that ends with its process), and a process that waits for another's build
says so once and gives up after ``NEUROFED_KERNEL_BUILD_WAIT`` seconds (600), naming
the file; a killed build leaves nothing that looks built. A run's
``federation.fast_kernels`` (:func:`configure`): ``auto`` (stock SLAYER with one
warning line if the kernels cannot be loaded; an error in a Flower app), ``true``
(an error), ``false`` (stock); its ``summary.json`` records the variant loaded.
``enable()`` also calls :func:`tune_malloc` (glibc keeps freed memory; see there).
On an idle 2-core machine the digits CNN steps faster with both threads (fast-grad
3.7-4.1 vs 5.2-5.6 ms), though about 1.5 ms of each step is serial Python; on a busy
machine, or with clients training in parallel, one thread per process
(``torch.set_num_threads(1)``) avoids oversubscribing the cores. enable() does not
change thread settings.
"""

from neurofed.kernels.variants import (VARIANTS, build, build_variant, default_variant, is_available,
                                    runnable_variants)
from neurofed.kernels.patches import (GRADIENTS, PATCHES, configure, disable, enable, enabled, gradients,
                                      is_enabled, tune_malloc)

__all__ = ["build", "build_variant", "variant", "runnable_variants", "default_variant", "VARIANTS", "configure",
           "enable", "disable", "enabled", "is_enabled", "is_available", "tune_malloc", "gradients", "GRADIENTS",
           "PATCHES"]


def variant() -> str | None:
    """The instruction-set variant :func:`build` loaded (None before, or if it failed)."""
    from neurofed.kernels import variants

    return variants.variant
