// The extension module: every kernel in one translation unit (torch's headers, most
// of the build time, are parsed once), and the Python bindings.
#include <torch/extension.h>

#include "common.h"
#include "neuron.h"
#include "pool.h"
#include "quantize.h"
#include "synapse.h"
#include "vnni.h"

// The optional kernels this build runs: since every kernel has a portable form, all of
// them (the tests check that each returns a result; ops.py picks which to call).
std::vector<std::string> kernels() {
  return {"spike_conv_fwd", "spike_weight_grad", "tlane_conv_fwd", "tlane_input_grad_1x1", "tlane_weight_grad",
          "tlane_input_grad", "vnni_conv_fwd"};
}

// 16-lane vectors the register file holds (32 with AVX-512, 8 with AVX2): ops.py
// leaves to oneDNN the fast-gradient kernels that were measured slower with 8.
int64_t regs() { return v16::REGS; }

#define NF_DEF(name) m.def(#name, torch::wrap_pybind_function(name), #name)
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  NF_DEF(li_fwd);
  NF_DEF(li_bwd);
  NF_DEF(cuba_fwd);
  NF_DEF(cuba_bwd);
  NF_DEF(cuba_reset_bwd);
  NF_DEF(shift1);
  NF_DEF(surrogate_exp_tensor);
  NF_DEF(spike_conv_fwd);
  NF_DEF(spike_weight_grad);
  NF_DEF(tlane_conv_fwd);
  NF_DEF(tlane_weight_grad);
  NF_DEF(tlane_input_grad_1x1);
  NF_DEF(tlane_input_grad);
  NF_DEF(vnni_conv_fwd);
  NF_DEF(pool_fwd);
  NF_DEF(pool_bwd);
  NF_DEF(quantize_fwd);
  NF_DEF(quantize_bwd);
  NF_DEF(kernels);
  NF_DEF(regs);
}
