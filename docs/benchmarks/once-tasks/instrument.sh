#!/bin/bash
# apply/remove throwaway instrumentation in the venv's ansible (worker CPU user/sys + templating; per-arg templating)
A=/work/main/.venv/lib/python3.11/site-packages/ansible
# Pristine copies first (the off branch puts them back).
[ -f /tmp/worker.py.orig ] || cp $A/executor/process/worker.py /tmp/worker.py.orig
[ -f /tmp/action_init.py.orig ] || cp $A/plugins/action/__init__.py /tmp/action_init.py.orig
if [ "$1" = off ]; then
  cp /tmp/worker.py.orig $A/executor/process/worker.py
  cp /tmp/action_init.py.orig $A/plugins/action/__init__.py
  grep -c TY_ $A/executor/process/worker.py $A/plugins/action/__init__.py
  exit 0
fi
python3 - <<'PY'
p='/work/main/.venv/lib/python3.11/site-packages/ansible/executor/process/worker.py'
s=open('/tmp/worker.py.orig').read()
old="""        executor_result = TaskExecutor("""
new="""        _pv = [0.0]
        if os.environ.get('TY_WORKER_CPU'):
            import time as _time
            _orig_pv = self._task.post_validate
            def _timed_pv(*a, **k):
                _t0 = _time.process_time()
                try:
                    return _orig_pv(*a, **k)
                finally:
                    _pv[0] += _time.process_time() - _t0
            self._task.post_validate = _timed_pv
        executor_result = TaskExecutor("""
s=s.replace(old,new,1)
old="""        self._host.vars = dict()
        self._host.groups = []
"""
new="""        if os.environ.get('TY_WORKER_CPU'):
            import json as _j, resource as _r
            _t = os.times()
            _ru = _r.getrusage(_r.RUSAGE_SELF)
            with open(os.environ['TY_WORKER_CPU'], 'a') as _fh:
                _fh.write(_j.dumps({'task': self._task.get_name(), 'host': self._host.name, 'cpu': _t[0] + _t[1], 'user': _ru.ru_utime, 'sys': _ru.ru_stime, 'minflt': _ru.ru_minflt, 'child': _t[2] + _t[3], 'skipped': bool(executor_result.get('skipped')), 'pv': _pv[0]}) + '\\n')
        self._host.vars = dict()
        self._host.groups = []
"""
s=s.replace(old,new,1)
open(p,'w').write(s)
p='/work/main/.venv/lib/python3.11/site-packages/ansible/plugins/action/__init__.py'
s=open('/tmp/action_init.py.orig').read()
old='''        The optional `context` value is sourced from `Task.get_finalize_task_args_context`.
        """
        return templar.template(value)'''
new='''        The optional `context` value is sourced from `Task.get_finalize_task_args_context`.
        """
        import os as _os
        if not _os.environ.get('TY_ARG_CPU'):
            return templar.template(value)
        import time as _t, json as _j
        from ansible.executor.process import worker as _w
        _t0 = _t.process_time()
        try:
            return templar.template(value)
        finally:
            _task = getattr(getattr(_w, 'current_worker', None), '_task', None)
            with open(_os.environ['TY_ARG_CPU'], 'a') as _fh:
                _fh.write(_j.dumps({'task': _task.get_name() if _task else '?', 'arg': name,
                                    'dt': _t.process_time() - _t0}) + '\\n')'''
s=s.replace(old,new,1)
open(p,'w').write(s)
PY
grep -c TY_ $A/executor/process/worker.py $A/plugins/action/__init__.py
