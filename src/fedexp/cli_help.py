"""`python -m fedexp --help`, rendered from conf/hydra/help/fedexp.yaml without Hydra.

Hydra's own help lists the groups by building a config repository per group (it deep-copies the
whole repository each time: seconds for ~140 groups); the groups are folders of YAML files, so
listing them directly gives the same page in milliseconds. Groups a run never picks by hand (the
per-paper and per-method value tables the defaults list selects itself) and shared partials
(`_*.yaml`) are left out.
"""

from __future__ import annotations

from pathlib import Path

# selected by the defaults list from other choices, not on the command line
INTERNAL = {
    "algorithm_dataset",
    "attack_paper",
    "debug_algorithm",
    "experiment_algorithm",
    "paper",
    "paper_algorithm",
}
HYDRA_GROUPS = ("launcher", "sweeper")  # the hydra/ groups a user picks


def options(folder: Path) -> list[str]:
    return sorted(f.stem for f in folder.glob("*.yaml") if not f.stem.startswith("_"))


def help_text(conf: Path) -> str:
    import yaml

    spec = yaml.safe_load((conf / "hydra" / "help" / "fedexp.yaml").read_text())
    lines = [
        f"{d.name}: {', '.join(options(d))}"
        for d in sorted(conf.iterdir())
        if d.is_dir() and d.name != "hydra" and d.name not in INTERNAL and options(d)
    ]
    lines += [
        f"hydra/{g}: {', '.join(options(conf / 'hydra' / g))}"
        for g in HYDRA_GROUPS
        if (conf / "hydra" / g).is_dir()
    ]
    return (
        spec["template"]
        .replace("${hydra.help.header}", spec["header"])
        .replace("${hydra.help.footer}", spec["footer"].rstrip("\n"))
        .replace("$APP_CONFIG_GROUPS", "\n".join(lines))
    )


def wants_help(args: list[str]) -> bool:
    return "--help" in args or "-h" in args
