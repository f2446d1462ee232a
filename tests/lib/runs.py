"""Checks of a `dcr run` result JSON that the shell tests share (tests/lib/runs.sh puts this
folder on PYTHONPATH)."""
import json


def load_steps(path, steps):
    """The runs of the result at `path`: one per step 1..steps, none with an error."""
    runs = json.load(open(path))["runs"]
    assert [r["step"] for r in runs] == list(range(1, steps + 1)), [r["step"] for r in runs]
    for r in runs:
        assert not r.get("error"), r.get("error")
    return runs


def held(run):
    """The receivers of a run that hold the version (not absent: a late joiner before it joined)."""
    return [x for x in run["receiver_results"] if x.get("catch_up") != "absent"]


def assert_bit_exact(run, receivers=None, committed=False):
    """Every receiver holding the run's version verified it byte for byte against the step's
    target checkpoint; with `committed`, each also committed it; with `receivers`, at least that
    many hold it. Returns those receivers."""
    h = held(run)
    assert run["receivers_verified"] == run["receivers"] == len(h), run
    if receivers is not None:
        assert len(h) >= receivers, (len(h), receivers)
    for x in h:
        assert x["verified"], x
        assert x["committed"] or not committed, x
    return h


def kill_restarts(runs, rank):
    """The restart lines of all runs that name a kill -9 of `rank`."""
    died = "node %s: killed by signal 9" % rank
    return [l for r in runs for l in r.get("restarts", []) if l.startswith(died)]
