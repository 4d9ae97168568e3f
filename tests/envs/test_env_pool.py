"""EnvPool hands every env index out exactly once per run, across the caller and its workers."""
import threading
import time

import pytest

from quadforge.envs.backends.env_pool import EnvPool


def _recording_job(seen: list, threads: set, delay: float = 0.0):
    def job(envs):
        for i in envs:
            seen.append(i)
            threads.add(threading.get_ident())
            if delay:
                time.sleep(delay)  # releases the GIL, as MuJoCo's step does
    return job


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_every_index_once_per_run(num_threads):
    pool = EnvPool(num_threads)
    try:
        for n in (0, 1, 5, 64):
            seen, threads = [], set()
            pool.run(_recording_job(seen, threads), n)
            assert sorted(seen) == list(range(n))
    finally:
        pool.close()


def test_workers_share_the_envs():
    pool = EnvPool(2)
    try:
        seen, threads = [], set()
        pool.run(_recording_job(seen, threads, delay=0.002), 40)
        assert sorted(seen) == list(range(40))
        assert len(threads) == 2        # with GIL-free work both threads take envs
    finally:
        pool.close()


def test_one_thread_runs_on_the_caller():
    pool = EnvPool(1)
    seen, threads = [], set()
    pool.run(_recording_job(seen, threads), 3)
    assert threads == {threading.get_ident()}
    pool.close()


def test_worker_error_reaches_the_caller_and_the_pool_still_works():
    pool = EnvPool(2)
    try:
        def job(envs):
            for i in envs:
                time.sleep(0.001)
                if i == 7:
                    raise KeyError("env 7 failed")
        with pytest.raises(KeyError, match="env 7"):
            pool.run(job, 20)
        seen, threads = [], set()
        pool.run(_recording_job(seen, threads), 10)
        assert sorted(seen) == list(range(10))
    finally:
        pool.close()


def test_close_joins_workers_and_run_after_close_is_an_error():
    pool = EnvPool(3)
    workers = list(pool._threads)
    pool.close()
    pool.close()  # idempotent
    assert not any(t.is_alive() for t in workers)
    with pytest.raises(RuntimeError, match="after close"):
        pool.run(lambda envs: None, 1)
    with pytest.raises(ValueError, match="num_threads"):
        EnvPool(0)


def test_tail_runs_once_on_the_caller_after_its_envs():
    pool = EnvPool(2)
    try:
        seen, threads, calls = [], set(), []

        def tail():
            calls.append((threading.get_ident(), len(seen)))

        pool.run(_recording_job(seen, threads, delay=0.001), 10, tail=tail)
        assert sorted(seen) == list(range(10))
        assert len(calls) == 1 and calls[0][0] == threading.get_ident()
        assert calls[0][1] >= 9              # every env was handed out before it ran

        def failing():
            raise ValueError("tail failed")
        with pytest.raises(ValueError, match="tail failed"):
            pool.run(_recording_job([], set()), 5, tail=failing)
        seen = []
        pool.run(_recording_job(seen, set()), 4)                       # still usable
        assert sorted(seen) == list(range(4))
    finally:
        pool.close()
