# The pins that scripts/setup.sh (the development .venv) and scripts/check_installed.sh (a
# fresh venv holding the built wheel) install beside neurofed's own dependencies (pyproject.toml).
# torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
TORCH_PIN="torch==2.13.0"
# lava-nc 0.10.0 and lava-dl 0.6.0 declare Python <3.11 and torch <2.4: installed with
# --no-deps --ignore-requires-python; their real dependencies are neurofed's.
LAVA_PINS=("lava-nc==0.10.0" "lava-dl==0.6.0")
# Norse's NIR importer: its metadata asks for torchvision, which norse.torch never imports
# (nir and nirtorch, its real dependencies, come with neurofed's): installed with --no-deps.
NORSE_PIN="norse==1.1.0"
