"""Repo-wide pytest set-up (applies to tests/ and to the notebooks nbval collects in book/).

nbval 0.11 sends every cell to the kernel with ``store_history=False``. IPython decides
whether a trailing ``;`` hides a cell's result by looking at the last cell *in
history*, so with ``store_history=False`` a ``;`` is ignored. For example,
``ax.set_title("x");`` then shows ``Text(0.5, 1.0, 'x')``, which Jupyter and
``make execute`` (nbclient) do not show. The notebooks would then disagree with their own
stored outputs. Here nbval executes cells exactly like Jupyter does: ``store_history=True``.
Execution counts are not compared by nbval, so nothing else changes.
"""

from __future__ import annotations

import nbval.kernel


def _execute_cell_input_like_jupyter(self, cell_input, allow_stdin=None):  # noqa: ANN001
    return self.kc.execute(
        cell_input, store_history=True, allow_stdin=allow_stdin, stop_on_error=False
    )


nbval.kernel.RunningKernel.execute_cell_input = _execute_cell_input_like_jupyter
