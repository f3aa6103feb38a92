"""cProfile around TaskExecutor.run in every worker of the tasks whose name contains $WPROF_TASK: one file per
worker in $WPROF_OUT (a measuring aid for docs/benchmarks/compiled-templates/, not part of the product).

    ANSIBLE_CALLBACK_PLUGINS=callback_plugins:docs/benchmarks/compiled-templates/profile \
    WPROF_TASK="Record the engine, GPU, pull" WPROF_OUT=/tmp/wprof ansible-playbook -i inventory/sim-p8 site.yml ...
"""
from __future__ import annotations
import cProfile, os
from ansible.plugins.callback import CallbackBase
from ansible.executor import task_executor
DOCUMENTATION = '''
name: wprof
type: aggregate
short_description: x
description: [x]
'''
_orig = task_executor.TaskExecutor.run
def run(self):
    want = os.environ.get("WPROF_TASK", "")
    if want and want in (self._task.get_name() or ""):
        p = cProfile.Profile()
        p.enable()
        try:
            return _orig(self)
        finally:
            p.disable()
            p.dump_stats(os.path.join(os.environ["WPROF_OUT"], "%s-%d.prof") % (self._host.name, os.getpid()))
    return _orig(self)
task_executor.TaskExecutor.run = run
class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'wprof'
    CALLBACK_NEEDS_ENABLED = False
