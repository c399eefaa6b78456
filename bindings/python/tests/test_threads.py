"""Import and use from threads that come and go.

mimalloc, once the extension's allocator, took the first thread that loaded the extension
for the process's main thread; after that thread exited, the next thread got its dead heap
and the process died of SIGSEGV. The order that found it: import on a thread that exits,
then use shardlimit from new threads. It runs in a child process, so a crash fails the test
instead of the suite.
"""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import threading

    mod = {}

    def load():
        import shardlimit
        mod["m"] = shardlimit

    t = threading.Thread(target=load)
    t.start()
    t.join()

    def use(i, out):
        m = mod["m"]
        lim = m.Limiter.memory()
        p = m.Policy("p", m.Limit.fixed_window(2, 60))
        out.append([lim.check("a", p).allowed for _ in range(3)])

    for round in range(5):
        results = []
        threads = [threading.Thread(target=use, args=(i, results)) for i in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert results == [[True, True, False]] * 3, results
    print("ok")
    """
)


def test_import_on_a_thread_that_exits_then_use_from_new_threads() -> None:
    r = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip() == "ok"
