"""The participation options (`sampling`, `dropout`, `availability`), checked before anything is
built: one line each. The round loop's use of them: `fedexp.engine.participation`."""

from __future__ import annotations

from omegaconf import OmegaConf

from fedexp.data.availability import KEY as AVAILABILITY
from fedexp.data.availability import read_availability
from fedexp.errors import ConfigError

SAMPLINGS = ("uniform", "size")


def check_participation(cfg) -> None:
    """`sampling`, `dropout` and `availability` (missing keys: a run dir saved before them),
    checked before anything is built: one line each."""
    sampling = cfg.get("sampling", "uniform")
    if sampling not in SAMPLINGS:
        raise ConfigError(f"sampling: must be uniform or size, got {sampling!r}")
    dropout = cfg.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ConfigError(f"dropout: must be a fraction in [0, 1), got {dropout!r}")
    path = cfg.get(AVAILABILITY)
    if path is not None:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{AVAILABILITY}: must be a path to a CSV file or null, got {path!r}")
        read_availability(path, int(cfg.num_clients))
        if OmegaConf.select(cfg, "attack.redraw_majority", default=False) is True:
            raise ConfigError(
                f"{AVAILABILITY}: not with attack.redraw_majority=true (a round's available "
                "clients may hold no cohort the redraw accepts)"
            )
