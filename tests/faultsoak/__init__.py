"""A fault soak in the Jepsen manner, shared by `tests/test_soak.py` and
`bench/soak.py`.

A fleet of real `dblockrun daemon` processes (:mod:`faultsoak.fleet`) runs a
mix of jobs (:mod:`faultsoak.workload`) against a server database while a
nemesis (:mod:`faultsoak.nemesis`), following a schedule derived from a
printed random seed, kills and restarts daemons, freezes them, cuts their
database connections, shifts their clocks and reloads the jobs file. Then the
checker (:mod:`faultsoak.checker`) reads every run record and the commands'
own log and lists each broken guarantee, by job, slot and what went wrong.
:func:`faultsoak.soak.run_soak` puts them together.
"""
