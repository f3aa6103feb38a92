"""Opt-in strategy: Ansible's `linear` run over Mitogen's connections (docs/benchmarks.md, "Mitogen").

    ANSIBLE_STRATEGY=mitogen_linear ansible-playbook site.yml

Mitogen (the `mitogen` package, pinned in requirements.txt) keeps one Python interpreter per node for the whole
run and sends modules to it instead of copying and starting a fresh interpreter for every task. The play's
results are the same; what it changes is the cost of each task. ansible-core 2.19 warns that strategy plugins
outside ansible.builtin are deprecated: this stays an opt-in, and the default (`linear`) is what the tests pin.

This file is a proxy, as Mitogen's own `ansible_mitogen/plugins/strategy/mitogen_linear.py` is: the real module
is imported under its own name, so Ansible's plugin loader does not load Mitogen's code twice.
"""

from __future__ import annotations

from ansible.errors import AnsibleError

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:  # the controller's Python lacks the pinned package
    raise AnsibleError("Stop: ANSIBLE_STRATEGY=mitogen_linear needs the mitogen package in the Python that runs "
                       "ansible-playbook (%s). Fix: `make venv` (requirements.txt pins it) or unset "
                       "ANSIBLE_STRATEGY." % exc) from None

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    """Ansible's linear strategy with Mitogen's connection and worker model."""
