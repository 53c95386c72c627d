"""autotune's ``sitecustomize``: meters Python processes that a rank's command starts.

The controller puts this directory first on each rank's ``PYTHONPATH``, so Python imports this
module at start-up (``site``) in every process of the rank. It arms `probes.autostart` (which
does nothing without the autotune channel in the environment), then runs the ``sitecustomize``
that would have been imported without autotune, if any, so the user's own start-up code still
runs.
"""


def _arm() -> None:
    try:
        from probes import autostart
    except ImportError:  # autotune's tree is not on the path: nothing to meter with
        return
    autostart.activate()


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules["sitecustomize"] = ours
        raise


_arm()
_chain()
