"""fdp_tf's code under a user's ``tf.function``: AutoGraph converts every function the
user's function calls, fdp_tf's step included. A function it cannot convert is run
unconverted after a warning that asks the user to "report this to the TensorFlow team"
(the trace-slot bookkeeping of fdp_tf.verify did so on every custom loop's first trace).
So every function and method of the package must convert, or be marked
``tf.autograph.experimental.do_not_convert`` (plain Python at trace time)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

pytest.importorskip("tensorflow")

import tensorflow as tf

import fdp_tf


def _functions():
    modules = [fdp_tf] + [importlib.import_module(m.name)
                          for m in pkgutil.walk_packages(fdp_tf.__path__, "fdp_tf.")]
    for module in modules:
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                for key, member in vars(obj).items():
                    if inspect.isfunction(member):
                        yield f"{module.__name__}.{name}.{key}", member


def _has_source(function) -> bool:  # dataclass-generated methods have none (AutoGraph skips them)
    try:
        inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return True


def test_every_function_of_the_package_converts() -> None:
    failed = []
    checked = 0
    for name, function in _functions():
        if inspect.isgeneratorfunction(function) or not _has_source(function):
            continue  # AutoGraph runs these as they are, silently
        checked += 1
        try:
            tf.autograph.to_graph(function)
        except Exception as err:  # noqa: BLE001 (any failure is the finding)
            failed.append(f"{name}: {str(err).splitlines()[0]}")
    assert checked > 200  # the walk found the package
    assert not failed, failed
