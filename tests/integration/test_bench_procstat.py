"""latency_bench's CPU split (``procstat.cpu_split``) on a real child process: its CPU is charged to the
children, not to the process that waited; the per-stage table prints both.
"""


def test_the_sweep_charges_the_servers_and_its_childrens_cpu_to_each_turn():
    """``procstat.cpu_split``: a process's own CPU apart from its live children's (the server and llama-server),
    read from /proc; the per-stage table prints it per answered turn for each level."""
    import os
    import subprocess
    import sys

    from latency_bench import procstat
    from latency_bench.report import stage_time_table

    before = procstat.cpu_split(os.getpid())
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint(1, flush=True)\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "1"
        after = procstat.cpu_split(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert after["children"] - before["children"] >= 0.3  # the child's spin, plus its start-up
    assert after["server"] - before["server"] < 0.25  # this process only waited
    assert procstat.cpu_split(None) is None

    table = stage_time_table({"sweep": {"4": {"stage_times": {"thinker": {"compute": {"p50_ms": 100, "p95_ms": 150, "count": 24}}},
                                              "cpu_ms_per_turn": {"server": 612, "children": 705}}}})
    rows = {line.split("  ")[0]: line for line in table.splitlines()}
    assert "612" in rows["CPU per turn: server process"] and "705" in rows["CPU per turn: its children (llama-server)"]
