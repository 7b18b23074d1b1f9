"""Import-time stand-in for torchvision, on the benchmark environment's PYTHONPATH only.

mosaicml-streaming 0.13 imports ``torchvision.datasets`` and
``torchvision.transforms.functional`` when ``streaming`` is imported (for its vision
datasets, which the benchmarks never use). The real torchvision wheel pins a CUDA torch,
so this stub supplies just the two names; using either raises.
"""
