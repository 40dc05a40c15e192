#!/bin/bash
cd /work/main
export OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 NEUROFED_KERNELS=x86-64-v3 OPENBLAS_CORETYPE=Haswell
export NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"
/work/main/.venv/bin/python -c "import torch; print('torch cpu capability', torch.backends.cpu.get_cpu_capability())"
/work/main/.venv/bin/neurofed lava /work/runs/vgg5_avx2 --samples 100 --tie-break voltage --workers 1 --quiet
/work/main/.venv/bin/python - <<'PY'
import json, h5py, numpy as np
a=json.load(open('/work/runs/vgg5_avx2/lava.json')); b=json.load(open('/work/runs/vgg5_flag0/lava.json'))
print({k:a[k] for k in ('samples','accuracy','torch_accuracy','agreement','spike_for_spike','tie_break','conv_model')})
print('predictions same as AVX-512 run:', a['predictions']==b['predictions'][:100])
print('layer spikes same:', a['layer_spikes']==b['layer_spikes'][:100])
def arrays(path):
    out={}
    with h5py.File(path,'r') as h:
        h.visit(lambda n: out.__setitem__(n, h[n][()]) if isinstance(h[n], h5py.Dataset) else None)
    return out
x, y = arrays('/work/runs/vgg5_avx2/model.net'), arrays('/work/runs/vgg5_flag0/model.net')
diff=[k for k in x if k in y and not np.array_equal(np.asarray(x[k]), np.asarray(y[k]))]
print('netx datasets:', len(x), 'differing:', diff[:10])
PY
