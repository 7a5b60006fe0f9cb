"""Makes polars, optuna, gymnasium and databento unimportable in any Python process started with this directory
on PYTHONPATH, as on the GPU machine (which has torch, numpy, pyarrow and nvidia-ml-py only).

Used by tests/test_gpu_check.py. The ImportError names the blocked module and the project module that imported
it (e.g. ``import of 'gymnasium' blocked by the test (imported by marketrl.env)``), so a failure says which
import still pulls a heavy dependency in.
"""

import sys
from importlib.abc import MetaPathFinder

BLOCKED = ("polars", "optuna", "gymnasium", "databento", "databento_dbn")


def _importer() -> str:
    """The first module on the stack outside the import machinery and this file."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != __name__:
            return name
        frame = frame.f_back
    return "?"


class _BlockHeavyDependencies(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"import of {fullname!r} blocked by the test (imported by {_importer()})")
        return None


sys.meta_path.insert(0, _BlockHeavyDependencies())
