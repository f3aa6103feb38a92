# First side-by-side runs on one 3-node default simulated cluster (mg), tree 82a39d9 + the strategy file, before the
# bench script existed; each command once, in this order, 06:20-06:24 UTC, load average 3-5 (other work running).
.venv/bin/python tests/sim/simcluster.py up --name mg --nodes 3
.venv/bin/ansible-playbook -i inventory/sim-mg site.yml                                   # first run (not kept)
/usr/bin/time -f "%e s wall %U user %S sys" .venv/bin/ansible-playbook -i inventory/sim-mg site.yml \
  > mg-conv-plain.log 2> mg-conv-plain.time                                               # converged, linear
# The two mitogen runs used Mitogen's own strategy file (the wheel unpacked in /tmp/mitogen/site), before
# strategy_plugins/mitogen_linear.py (the same two classes) was added:
export PYTHONPATH=/tmp/mitogen/site ANSIBLE_STRATEGY_PLUGINS=/tmp/mitogen/site/ansible_mitogen/plugins/strategy
ANSIBLE_STRATEGY=mitogen_linear /usr/bin/time -f "%e s wall %U user %S sys" \
  .venv/bin/ansible-playbook -i inventory/sim-mg site.yml > mg-conv-mitogen.log 2> mg-conv-mitogen.time
ANSIBLE_STRATEGY=mitogen_linear /usr/bin/time -f "%e s wall %U user %S sys" \
  .venv/bin/ansible-playbook -i inventory/sim-mg reset.yml -e reset_confirm=true > mg-reset-mitogen.log 2> mg-reset-mitogen.time
unset PYTHONPATH ANSIBLE_STRATEGY_PLUGINS
.venv/bin/ansible-playbook -i inventory/sim-mg site.yml --tags launch                     # relaunch (see troubleshooting 63)
/usr/bin/time -f "%e s wall %U user %S sys" .venv/bin/ansible-playbook -i inventory/sim-mg reset.yml -e reset_confirm=true \
  > mg-reset-plain.log 2> mg-reset-plain.time
# bench-stderr.log: .venv/bin/python tests/bench/mitogen_strategy.py --repeats 2 --write (07:00-07:32 UTC)
