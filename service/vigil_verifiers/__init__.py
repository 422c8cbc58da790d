"""The verifiers taskset id of Vigil's ``verifiers`` export (verifiers imports a taskset by a top-level module
name): ``vf-eval vigil_verifiers --env.taskset.path FILE``. The taskset is
:mod:`vigil.export.harness.verifiers_env`."""

from vigil.export.harness.verifiers_env import VigilTaskset

__all__ = ["VigilTaskset"]
