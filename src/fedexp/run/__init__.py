"""The wiring: build every component from the config (`components`), the run's callbacks
(`callbacks`, the one place they are built), and the run itself (`lifecycle`)."""

from fedexp.run.components import (
    Components,
    build_components,
    build_data,
    make_orchestrator,
    resolve_device,
    resolve_objective,
    saved_components,
)
from fedexp.run.lifecycle import Experiment, run

__all__ = [
    "Components",
    "Experiment",
    "build_components",
    "build_data",
    "make_orchestrator",
    "resolve_device",
    "resolve_objective",
    "run",
    "saved_components",
]
