"""Build components from `_target_` nodes, passing runtime objects (tensors, contexts) directly.

Hydra's `instantiate` merges keyword arguments into the config, which rejects non-primitive values
such as tensors and arrays; `build` resolves the node to plain values and calls the target itself.
A key the target does not take is a one-line `ConfigError` naming the config group and the
target's options, not a traceback.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fedexp.errors import ConfigError

_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']+)'")


def find_conf() -> str:
    """conf/ ships inside the wheel (fedexp/conf) and sits at the repo root in a checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parents[1] / "conf"):
        if (candidate / "config.yaml").exists():
            return str(candidate)
    raise FileNotFoundError("fedexp: conf/config.yaml not found next to the package")


def build(node: DictConfig | dict, name: str | None = None, **runtime: Any) -> Any:
    """Call `node._target_(**node, **runtime)`; with `_partial_: true` return a partial.

    Args:
        node: the config node with `_target_` and the target's keyword arguments.
        name: the config group the node comes from (`algorithm`, `model`, ...), used in errors.
        **runtime: objects passed as they are (a BuildContext, the seed, the run dir).
    """
    params = (
        OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    )
    target_name = params.pop("_target_")
    is_partial = params.pop("_partial_", False)
    group = name or "_target_"
    try:
        target = get_object(target_name)
    except Exception as err:
        raise ConfigError(f"{group}._target_: cannot import {target_name!r} ({err})") from None
    options, closed = accepted_options(target)
    if closed:  # the signature says it all: refuse unknown keys before calling anything
        for key in params:
            if key not in options:
                raise not_an_option(group, key, target_name, options, runtime)
    if is_partial:
        return functools.partial(target, **params, **runtime)
    try:
        return target(**params, **runtime)
    except TypeError as err:
        # a target taking **kwargs passes them on (FedProx -> FedAvg, fedhenn -> FedHeNN...):
        # the callee that finally refuses one of the node's keys names it in its TypeError
        found = _UNEXPECTED.search(str(err))
        if found is None or found.group(1) not in params:
            raise
        raise not_an_option(group, found.group(1), target_name, options, runtime) from None


def dataset_label(choice: str | None, target: str | None, conf_dir: str | None = None):
    """The dataset's name in run titles, W&B names and reports: the `dataset=` choice, or the
    last component of `dataset._target_` where it names another loader than that choice's YAML
    (`dataset=custom dataset._target_=my_data.two_blobs` is `two_blobs`)."""
    if not target or choice is None:
        return choice
    path = Path(conf_dir or find_conf()) / "dataset" / f"{choice}.yaml"
    return choice if target == _yaml_target(path) else str(target).rsplit(".", 1)[-1]


def labelled_choices(choices: dict, target: str | None) -> dict:
    """`choices` with the dataset's label (`dataset_label`) for `dataset._target_` = target."""
    if "dataset" not in choices:
        return choices
    return {**choices, "dataset": dataset_label(choices["dataset"], target)}


def _yaml_target(path: Path, depth: int = 0) -> str | None:
    """`_target_` of a `conf/dataset/*.yaml` (a `_global_` one under `dataset:`), or of the
    option its defaults list extends (shakespeare: hf)."""
    import yaml

    if not path.is_file() or depth > 4:
        return None
    data = yaml.safe_load(path.read_text()) or {}
    node = data.get("dataset", data) if isinstance(data.get("dataset"), dict) else data
    if "_target_" in node:
        return str(node["_target_"])
    for entry in data.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            found = _yaml_target(path.parent / f"{entry}.yaml", depth + 1)
            if found is not None:
                return found
    return None


def default_family(name: str, data_args: dict) -> Callable:
    """The model family `conf/model/<name>.yaml`, built and bound to the data's model arguments.

    Lets a heterogeneous algorithm run on the defaults when the chosen model is one architecture.
    `auto`: `lstm_family` when the data are token sequences (the dataset gives `vocab_size`),
    `mlp_family` for flat inputs (an `input_shape` of one dimension, e.g. MNIST-1D), else
    `cnn_family`.
    """
    if name == "auto":
        if "vocab_size" in data_args:
            name = "lstm_family"
        else:
            flat = len(tuple(data_args.get("input_shape", ()))) == 1
            name = "mlp_family" if flat else "cnn_family"
    path = Path(find_conf()) / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"algorithm.default_family: no model config {name!r}")
    return build(OmegaConf.load(path), **data_args)


def accepted_options(target: Any) -> tuple[set[str], bool]:
    """(keyword names `target` takes, whether that set is complete).

    For a class, the `__init__` chain is followed through `**kwargs` along the MRO (a subclass that
    passes `**kwargs` to `super().__init__` also takes its parent's keywords). The set is
    incomplete when a function takes `**kwargs` or the chain ends in `**kwargs`; a `**_`
    catch-all (a dataset loader ignoring the runtime arguments it does not need) counts as none.
    """
    if inspect.isclass(target):
        inits = [vars(k)["__init__"] for k in target.__mro__ if "__init__" in vars(k)]
        inits = [f for f in inits if f is not object.__init__]
    else:
        inits = [target]
    names: set[str] = set()
    for fn in inits:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            return names, False
        names |= {
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
        # `**_` swallows the runtime's extras (a dataset loader's seed, ...) by convention
        if not any(p.kind is p.VAR_KEYWORD and p.name != "_" for p in params):
            return names, True
    return names, not inits


def annotations_of(target: Any) -> dict[str, Any]:
    """Keyword name -> type annotation of what `target` takes (the `__init__` chain of a class,
    as in `accepted_options`); names without a readable annotation are left out."""
    fns = (
        [vars(k)["__init__"] for k in target.__mro__ if "__init__" in vars(k)]
        if inspect.isclass(target)
        else [target]
    )
    out: dict[str, Any] = {}
    for fn in fns:
        if fn is object.__init__:
            continue
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            break
        namespace = getattr(inspect.unwrap(fn), "__globals__", {})
        for p in params:
            if p.name in out or p.annotation is p.empty:
                continue
            ann = p.annotation
            if isinstance(ann, str):  # `from __future__ import annotations`
                try:
                    ann = eval(ann, namespace)  # noqa: S307 - the target's own annotation
                except Exception:  # a name imported only for type checkers
                    continue
            out[p.name] = ann
        if not any(p.kind is p.VAR_KEYWORD and p.name != "_" for p in params):
            break
    return out


def not_an_option(group: str, key: str, target_name: str, options: set, runtime: dict):
    shown = sorted(options - set(runtime))
    return ConfigError(
        f"{group}.{key}: not an option of {target_name}; options: {', '.join(shown) or 'none'}"
    )


def _all_plain(args: list[str], conf_dir: str) -> bool:
    """Every override selects a group or sets a top-level key of config.yaml (no dotted key),
    or is Hydra's own (`hydra.run.dir=...`, `hydra/launcher=...`: Hydra checks those)."""
    import yaml

    args = [a for a in args if not a.startswith(("hydra.", "hydra/"))]
    keys = [a.partition("=")[0] for a in args]
    if any("." in k or "/" in k or k[:1] in "+~" or "=" not in a for k, a in zip(keys, args)):
        return False
    conf = Path(conf_dir)
    top = yaml.safe_load((conf / "config.yaml").read_text()) or {}
    return all(k in top or (conf / k).is_dir() for k in keys)


def add_target_keys(args: list[str], conf_dir: str) -> list[str]:
    """Let `group.key=value` reach `build` when the group's YAML lacks `key`.

    Hydra refuses an override of a key missing from the composed config (a multi-line error
    asking for `+group.key=value`). For a node with a `_target_`, `build` knows better: the key
    may be one of the target's options the YAML leaves at its default (then it is used), or
    not (then a one-line error lists the options). Such overrides get the `+`; any other missing
    key is a one-line ConfigError here. Multirun and flag arguments are left to Hydra.
    """
    if any(a.startswith("-") for a in args):
        return args
    if _all_plain(args, conf_dir):  # nothing a composition could find missing: skip it (~0.7 s)
        return args
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    args, added = list(args), []
    for _ in range(len(args) + 1):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(conf_dir, version_base="1.3"):
                cfg = compose("config", overrides=args)
        except ConfigCompositionException as err:
            cause = err.__cause__
            key = str(getattr(cause, "full_key", ""))
            where = [i for i, a in enumerate(args) if a.partition("=")[0] == key]
            if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not where:
                return args  # Hydra reports the rest when it composes again
            args[where[0]] = "+" + args[where[0]]
            added.append(key)
            continue
        finally:
            GlobalHydra.instance().clear()
        for key in added:
            parent = key.rpartition(".")[0]
            node = OmegaConf.select(cfg, parent) if parent else None
            if not isinstance(node, DictConfig) or "_target_" not in node:
                raise ConfigError(f"{key}: no such key in the config")
        return args
    return args
