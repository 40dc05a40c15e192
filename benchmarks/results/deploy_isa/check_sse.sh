#!/bin/bash
cd /work/main
export OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default NEUROFED_KERNELS=generic OPENBLAS_CORETYPE=Prescott
export NPY_DISABLE_CPU_FEATURES="SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"
/work/main/.venv/bin/python -c "import torch; print('torch cpu capability', torch.backends.cpu.get_cpu_capability())"
/work/main/.venv/bin/neurofed lava /work/runs/vgg5_sse --samples 100 --tie-break voltage --workers 1 --quiet
/work/main/.venv/bin/python - <<'PY'
import json, h5py, numpy as np
a=json.load(open('/work/runs/vgg5_sse/lava.json')); b=json.load(open('/work/runs/vgg5_flag0/lava.json'))
print({k:a[k] for k in ('samples','accuracy','torch_accuracy','agreement','spike_for_spike','tie_break','conv_model')})
print('predictions same as AVX-512 run:', a['predictions']==b['predictions'][:100])
print('layer spikes same:', a['layer_spikes']==b['layer_spikes'][:100])
def arrays(path):
    out={}
    with h5py.File(path,'r') as h:
        h.visit(lambda n: out.__setitem__(n, h[n][()]) if isinstance(h[n], h5py.Dataset) else None)
    return out
x, y = arrays('/work/runs/vgg5_sse/model.net'), arrays('/work/runs/vgg5_flag0/model.net')
diff=[k for k in x if k in y and not np.array_equal(np.asarray(x[k]), np.asarray(y[k]))]
print('netx datasets:', len(x), 'differing:', diff[:10])
PY
