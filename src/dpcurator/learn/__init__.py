"""DP-SGD for PyTorch: differentially private training, with secure noise and tight accounting.

    from dpcurator.learn import PrivacyEngine

    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader,
        target_epsilon=3.0, delta=1e-5, epochs=10, max_grad_norm=1.0)
    ...                     # train as usual: zero_grad, loss.backward(), optimizer.step()
    engine.epsilon()        # epsilon spent so far; engine.history has one report per epoch

Needs the extra ``pip install 'dpcurator[learn]'`` (PyTorch). ``import dpcurator.learn`` alone
does not import PyTorch: its names load on first use (``dpcurator._lazy``).

- ``PrivacyEngine``: ``make_private`` returns the module (recording what per-example
  gradients need: its ``nn.Linear`` and ``nn.Conv2d`` layers tapped, other layers hooked), a
  ``DPOptimizer`` and a ``DPDataLoader`` (Poisson sampling); ``epsilon()``; ``history``.
- ``audit_dpsgd``: an empirical lower bound on a DP-SGD step's epsilon from canary gradients.
- ``sample_wide_discrete_gaussian``: the exact, fast discrete Gaussian the noise comes from.
"""

from typing import TYPE_CHECKING

from dpcurator._lazy import exports

if TYPE_CHECKING:
    from dpcurator.learn._audit import DpsgdAudit, audit_dpsgd
    from dpcurator.learn._engine import EpochReport, PrivacyEngine
    from dpcurator.learn._noise import sample_wide_discrete_gaussian
    from dpcurator.learn._optimizer import DPOptimizer
    from dpcurator.learn._sampling import DPDataLoader

__all__ = [
    "DPDataLoader",
    "DPOptimizer",
    "DpsgdAudit",
    "EpochReport",
    "PrivacyEngine",
    "audit_dpsgd",
    "sample_wide_discrete_gaussian",
]

__getattr__, __dir__ = exports(__name__, {
    "DPDataLoader": "dpcurator.learn._sampling",
    "DPOptimizer": "dpcurator.learn._optimizer",
    "DpsgdAudit": "dpcurator.learn._audit",
    "EpochReport": "dpcurator.learn._engine",
    "PrivacyEngine": "dpcurator.learn._engine",
    "audit_dpsgd": "dpcurator.learn._audit",
    "sample_wide_discrete_gaussian": "dpcurator.learn._noise",
})
