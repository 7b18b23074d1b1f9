"""Stub: ``to_tensor`` exists so ``streaming.vision`` imports; calling it raises."""


def to_tensor(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("torchvision is a stub in the benchmark environment")
