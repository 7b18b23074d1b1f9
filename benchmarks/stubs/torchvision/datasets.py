"""Stub: ``VisionDataset`` exists so ``streaming.vision`` imports; it cannot be built."""


class VisionDataset:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError("torchvision is a stub in the benchmark environment")
