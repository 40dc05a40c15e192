// The extension module: every kernel in one translation unit (torch's headers, most
// of the build time, are parsed once), and the Python bindings.
#include "common.h"
#include "neuron.h"
#include "pool.h"
#include "synapse.h"
#include "vnni.h"

// The optional kernels this build runs (the others return None everywhere and the
// caller takes the next kernel or the stock call); the tests check exactly these.
std::vector<std::string> kernels() {
  std::vector<std::string> k = {"spike_conv_fwd", "spike_weight_grad", "tlane_conv_fwd", "tlane_input_grad_1x1",
                                "tlane_weight_grad", "tlane_input_grad"};
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  k.push_back("vnni_conv_fwd");
#endif
  return k;
}

#define NF_DEF(name) m.def(#name, torch::wrap_pybind_function(name), #name)
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  NF_DEF(li_fwd);
  NF_DEF(li_bwd);
  NF_DEF(cuba_fwd);
  NF_DEF(cuba_bwd);
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
  NF_DEF(kernels);
}
