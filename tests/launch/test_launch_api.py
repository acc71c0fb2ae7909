"""xlarun.launch() from plain Python: each test runs a caller program in a process of its own, which
launches real workers and prints what it got back as JSON."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, TESTS, clean_env, is_alive, slack_s, wait_for

CALLER_TIMEOUT_S = 120


def run_caller(tmp_path: Path, code: str, modules: dict[str, str] | None = None) -> Any:
    """Run ``code`` as a program beside ``modules``; the JSON its last line prints."""
    script = write_caller(tmp_path, code, modules)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=caller_env(),
        cwd=tmp_path,
        timeout=CALLER_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def write_caller(tmp_path: Path, code: str, modules: dict[str, str] | None = None) -> Path:
    for name, text in (modules or {}).items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    script = tmp_path / "caller.py"
    script.write_text("import json, os, sys\nimport xlarun\n" + textwrap.dedent(code))
    return script


def caller_env() -> dict[str, str]:
    return clean_env({"PYTHONPATH": str(REPO)})


def test_a_module_function_a_lambda_and_a_closure_each_return_every_ranks_value(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import ranks

        def closure():
            offset = 10
            return lambda: int(os.environ["RANK"]) + offset

        result = xlarun.launch(ranks.rank, nproc_per_node=4, device="cpu")
        print(json.dumps({"module": result.values, "exit_code": result.exit_code,
                          "lambda": xlarun.launch(lambda: int(os.environ["RANK"]), nproc_per_node=4,
                                                  device="cpu").values,
                          "closure": xlarun.launch(closure(), nproc_per_node=4, device="cpu").values,
                          "args": xlarun.launch(ranks.pair, "a", 2, nproc_per_node=2, device="cpu").values}))
    """,
        {
            "ranks": """
        import os

        def rank():
            return int(os.environ["RANK"])

        def pair(a, b):
            return [a, b, int(os.environ["RANK"])]
    """
        },
    )
    assert got == {
        "module": [0, 1, 2, 3],
        "exit_code": 0,
        "lambda": [0, 1, 2, 3],
        "closure": [10, 11, 12, 13],
        "args": [["a", 2, 0], ["a", 2, 1]],
    }


def test_a_script_and_a_module_run_with_their_arguments(tmp_path: Path) -> None:
    # One write per line: under python -u (torchrun's contract) print() writes each word apart, and the two workers
    # share the caller's stdout.
    (tmp_path / "job.py").write_text(
        "import os, sys\nsys.stdout.write(' '.join(['job', os.environ['RANK'], *sys.argv[1:]]) + '\\n')\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            str(
                write_caller(
                    tmp_path,
                    """
        script = xlarun.launch("job.py", "x", 1, nproc_per_node=2, device="cpu")
        module = xlarun.launch(["-m", "job", "y"], nproc_per_node=2, device="cpu")
        print(json.dumps([script.values, script.exit_code, module.values]))
    """,
                )
            ),
        ],
        capture_output=True,
        text=True,
        env=caller_env(),
        cwd=tmp_path,
        timeout=CALLER_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[None, None], 0, [None, None]]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("job")) == [
        "job 0 x 1",
        "job 0 y",
        "job 1 x 1",
        "job 1 y",
    ]


def test_the_summary_is_what_the_summary_file_holds(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        result = xlarun.launch(lambda: None, nproc_per_node=2, device="cpu", summary_file="summary.json")
        with open("summary.json") as handle:
            print(json.dumps([result.summary, json.load(handle)]))
    """,
    )
    assert got[0] == got[1]
    assert got[0]["result"] == "succeeded" and [w["rank"] for w in got[0]["attempts"][0]["workers"]] == [0, 1]


def test_a_rank_that_raises_is_the_root_cause_and_its_exception_the_cause(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        def fail_on_two():
            if os.environ["RANK"] == "2":
                raise ValueError("bad")
            return 0

        try:
            xlarun.launch(fail_on_two, nproc_per_node=4, device="cpu")
        except xlarun.WorkerFailed as error:
            failed = {"rank": error.root_cause.rank, "traceback": error.root_cause.traceback,
                      "cause": repr(error.__cause__), "is_value_error": isinstance(error.__cause__, ValueError),
                      "exit_code": error.exit_code, "failures": [f.rank for f in error.failures],
                      "message": str(error), "summary_exit": error.summary["exit_code"]}
        try:
            xlarun.launch(fail_on_two, nproc_per_node=4, device="cpu", reraise=True)
        except ValueError as error:
            failed["reraised"] = repr(error)
        print(json.dumps(failed))
    """,
    )
    assert got["rank"] == 2 and got["is_value_error"] and got["cause"] == "ValueError('bad')"
    assert 'raise ValueError("bad")' in got["traceback"]
    assert got["exit_code"] == got["summary_exit"] == 1 and got["failures"] == [2]
    assert got["message"].startswith("rank 2 on ") and got["message"].endswith("ValueError: bad")
    assert got["reraised"] == "ValueError('bad')"


def test_an_exit_and_a_kill_are_named(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import signal

        def end(how):
            if os.environ["RANK"] == "1":
                if how == "exit":
                    os._exit(3)
                os.kill(os.getpid(), signal.SIGKILL)

        ends = {}
        for how in ("exit", "kill"):
            try:
                xlarun.launch(end, how, nproc_per_node=2, device="cpu")
            except xlarun.WorkerFailed as error:
                ends[how] = [error.root_cause.rank, error.root_cause.returncode, error.root_cause.signal,
                             error.exit_code, str(error), error.__cause__ is None]
        print(json.dumps(ends))
    """,
    )
    assert got["exit"] == [1, 3, None, 3, got["exit"][4], True] and got["exit"][4].endswith(" exited with code 3")
    assert got["kill"][:4] == [1, -9, "SIGKILL", 137] and "killed by SIGKILL" in got["kill"][4]


def test_a_hundred_megabyte_value_comes_back(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        values = xlarun.launch(lambda: b"x" * (100 << 20), nproc_per_node=1, device="cpu").values
        print(json.dumps([len(values[0]), values[0][:3].decode()]))
    """,
    )
    assert got == [100 << 20, "xxx"]


def test_a_value_that_cannot_be_pickled_is_named_with_its_rank(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import threading

        try:
            xlarun.launch(lambda: threading.Lock(), nproc_per_node=1, device="cpu")
        except xlarun.WorkerFailed as error:
            print(json.dumps(str(error)))
    """,
    )
    assert "rank 0 returned a _thread.lock, which cannot be pickled" in got and "\n" not in got


def test_the_callers_environment_modules_handlers_and_descriptors_stay_as_they_were(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import signal, socket

        def handlers():
            return {number.name: repr(signal.getsignal(number)) for number in signal.Signals
                    if number not in (signal.SIGKILL, signal.SIGSTOP)}

        wakeup, _ = socket.socketpair()
        wakeup.setblocking(False)
        signal.set_wakeup_fd(wakeup.fileno())
        signal.signal(signal.SIGUSR1, lambda *_: None)
        environ, before = dict(os.environ), handlers()
        xlarun.launch(lambda: 1, nproc_per_node=2, device="cpu")
        modules, descriptors = set(sys.modules), sorted(os.listdir("/proc/self/fd"))
        xlarun.launch(lambda: 1, nproc_per_node=2, device="cpu")
        print(json.dumps({"environ": dict(os.environ) == environ, "new": sorted(set(sys.modules) - modules),
                          "torch": sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "torch_xla")),
                          "handlers": handlers() == before, "wakeup": signal.set_wakeup_fd(-1) == wakeup.fileno(),
                          "descriptors": sorted(os.listdir("/proc/self/fd")) == descriptors}))
    """,
    )
    assert got == {"environ": True, "new": [], "torch": [], "handlers": True, "wakeup": True, "descriptors": True}


def test_bad_options_are_one_line_value_errors(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import threading

        refused = []
        for options in ({"nproc_per_node": "x"}, {"nproc_pre_node": 2}, {"standalone": "yes"},
                        {"hosts": ["127.0.0.2", "127.0.0.2"]}):
            try:
                xlarun.launch(lambda: 0, device="cpu", **options)
            except ValueError as error:
                refused.append(str(error))
        os.environ["LOCAL_RANK"] = "0"
        try:
            xlarun.launch(lambda: 0, device="cpu")
        except RuntimeError as error:
            refused.append(str(error))
        del os.environ["LOCAL_RANK"]
        caught = []

        def from_thread():
            try:
                xlarun.launch(lambda: 0, device="cpu")
            except RuntimeError as error:
                caught.append(str(error))

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join()
        print(json.dumps(refused + caught))
    """,
    )
    assert got[0].startswith("--nproc-per-node='x' is invalid")
    assert got[1].startswith("unknown option nproc_pre_node=")
    assert got[2].startswith("--standalone is a switch")
    assert got[3].startswith("--hosts='127.0.0.2,127.0.0.2' is invalid") and "names 127.0.0.2 twice" in got[3]
    assert got[4].startswith("xlarun.launch() called inside a worker (LOCAL_RANK is set)")
    assert got[5].startswith("xlarun.launch() runs in the main thread only")
    assert all("\n" not in line for line in got)


def test_every_refused_input_is_a_one_line_value_error_and_leaves_nothing(tmp_path: Path) -> None:
    """What launch() refuses, of its own or by the command line's rules, is a ValueError (docs/python.md),
    before any worker starts and with no private directory left behind."""
    private = tmp_path / "tmp"
    private.mkdir()
    got = run_caller(
        tmp_path,
        f"""
        import tempfile
        import threading
        tempfile.tempdir = {str(private)!r}

        def rank():
            return 0

        refused = {{}}
        for name, target, options in [
            ("dry_run", rank, {{"dry_run": True}}),
            ("module", rank, {{"module": True}}),
            ("no_python", rank, {{"no_python": True}}),
            ("run_path", rank, {{"run_path": True}}),
            ("script_list", ["w.py", "--epochs", "3"], {{}}),
            ("empty_list", [], {{}}),
            ("module_without_name", ["-m"], {{}}),
            ("number", 42, {{}}),
            ("none", None, {{}}),
            ("bad_value", rank, {{"nproc_per_node": "x"}}),
            ("unknown_option", rank, {{"nproc_pre_node": 2}}),
            ("switch_given_text", rank, {{"standalone": "yes"}}),
            ("host_twice", "w.py", {{"hosts": ["127.0.0.2", "127.0.0.2"]}}),
            ("no_shared_directory", rank, {{"hosts": ["127.0.0.2"], "remote_cwd": "/no/such/directory"}}),
            ("unpicklable_argument", rank, {{"args": (threading.Lock(),)}}),
        ]:
            try:
                xlarun.launch(target, *options.pop("args", ()), device="cpu", **options)
                refused[name] = "launched"
            except Exception as error:
                refused[name] = [type(error).__name__, isinstance(error, ValueError), str(error)]
        print(json.dumps(refused))
    """,
    )
    assert {name: (kind, is_value_error) for name, (kind, is_value_error, _) in got.items()} == {
        name: ("ValueError", True) for name in got
    }, got
    assert all(message and "\n" not in message for _, _, message in got.values()), got
    assert got["dry_run"][2].startswith("dry_run plans a command line")
    assert got["module"][2].startswith("module= says how a script runs")
    assert "neither a function, a script's path nor ['-m', module, ...]" in got["script_list"][2]
    assert got["bad_value"][2].startswith("--nproc-per-node='x' is invalid")
    assert got["no_shared_directory"][2].startswith("remote_cwd='/no/such/directory' takes no directory here")
    assert got["unpicklable_argument"][2].startswith("the call cannot travel to the workers (cannot pickle")
    assert os.listdir(private) == []


def test_a_job_on_several_hosts_returns_every_ranks_value_and_a_failure_names_its_host_and_rank(tmp_path: Path) -> None:
    """Each host's agent starts on this machine through ``env -i ... sh -c`` (no PYTHONPATH: the installed
    xlarun runs there); the payload and the values travel through the working directory the hosts share."""
    got = run_caller(
        tmp_path,
        """
        hosts = {"hosts": ["127.0.0.2", "127.0.0.3"], "rsh": "env -i PATH=/usr/bin:/bin sh -c {command}",
                 "nproc_per_node": 2, "device": "cpu", "remote_python": sys.executable}

        def fail_on_rank_three():
            if os.environ["RANK"] == "3":
                raise ValueError("rank three says no")
            return int(os.environ["RANK"])

        result = xlarun.launch(lambda: int(os.environ["RANK"]), **hosts)
        try:
            xlarun.launch(fail_on_rank_three, **hosts)
            failed = None
        except xlarun.WorkerFailed as error:
            failed = {"rank": error.root_cause.rank, "host": error.root_cause.host, "message": str(error),
                      "cause": repr(error.__cause__), "traceback": "rank three says no" in error.root_cause.traceback,
                      "summary": [error.summary["result"], error.summary["root_cause"]]}
        print(json.dumps({"values": result.values, "exit_code": result.exit_code,
                          "summary": [result.summary["result"], [host["host"] for host in result.summary["hosts"]]],
                          "failed": failed, "left": sorted(os.listdir("."))}))
    """,
    )
    assert got["values"] == [0, 1, 2, 3]
    assert got["exit_code"] == 0
    assert got["summary"] == ["succeeded", ["127.0.0.2", "127.0.0.3"]]
    failed = got["failed"]
    assert failed is not None
    assert (failed["rank"], failed["host"]) == (3, "127.0.0.3")
    assert failed["message"].startswith("rank 3 on 127.0.0.3 exited with code 1")
    assert failed["cause"] == "ValueError('rank three says no')"
    assert failed["traceback"]
    assert failed["summary"] == ["failed", {"host": "127.0.0.3", "node_rank": 1, "rank": 3}]
    assert got["left"] == ["caller.py"]  # the shared private directory is gone


def test_a_job_on_several_hosts_lists_every_failed_worker_with_its_host(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import signal
        import threading
        import time

        hosts = {"hosts": ["127.0.0.2", "127.0.0.3"], "rsh": "env -i PATH=/usr/bin:/bin sh -c {command}",
                 "nproc_per_node": 2, "device": "cpu", "remote_python": sys.executable}
        failing = (1, 3)  # one rank on each host

        def fail_on_one_and_three():
            rank = int(os.environ["RANK"])
            if rank not in failing:
                time.sleep(120)
            with open(f"ready-{rank}.tmp", "w") as handle:
                handle.write(f"{os.getpid()} {os.getppid()}")
            os.rename(f"ready-{rank}.tmp", f"ready-{rank}")
            while not os.path.exists("go"):
                time.sleep(0.01)
            os._exit(5)

        def state(pid):
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0]

        def fail_both_before_either_node_hears():
            # Each node's launcher is stopped while its worker fails, so each sees its own worker's
            # failure before it can hear of the other's, however slowly either worker runs.
            while not all(os.path.exists(f"ready-{rank}") for rank in failing):
                time.sleep(0.01)
            pids = [[int(pid) for pid in open(f"ready-{rank}").read().split()] for rank in failing]
            for _, node in pids:
                os.kill(node, signal.SIGSTOP)
            while not all(state(node) == "T" for _, node in pids):
                time.sleep(0.01)
            open("go", "w").close()
            while not all(state(worker) == "Z" for worker, _ in pids):  # unreaped: their launchers are stopped
                time.sleep(0.01)
            for _, node in pids:
                os.kill(node, signal.SIGCONT)

        threading.Thread(target=fail_both_before_either_node_hears, daemon=True).start()
        try:
            xlarun.launch(fail_on_one_and_three, **hosts)
        except xlarun.WorkerFailed as error:
            print(json.dumps({"root": [error.root_cause.rank, error.root_cause.host],
                              "failures": [[failure.rank, failure.host, failure.returncode]
                                           for failure in error.failures]}))
    """,
    )
    assert got["failures"][0] == [*got["root"], 5]
    assert sorted(got["failures"]) == [[1, "127.0.0.2", 5], [3, "127.0.0.3", 5]]


def start_sleepers(
    tmp_path: Path, options: str = "", ignore_term: bool = False, temporary: Path | None = None
) -> tuple[subprocess.Popen[str], list[int]]:
    """A caller whose launch's two workers sleep (SIGTERM and SIGINT, which the launcher passes on, ignored if asked), and their pids once both run;
    an interrupt of the launch prints ``interrupted``, and a second launch's values follow. ``temporary``: the
    caller's temporary directory (``TMPDIR``), where its launch keeps its private directory."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write_caller(
        tmp_path,
        f"""
        import signal, time

        def sleep():
            if {ignore_term}:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            with open(os.path.join({str(pids)!r}, os.environ["RANK"]), "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(600)

        try:
            xlarun.launch(sleep, nproc_per_node=2, device="cpu"{options})
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print(json.dumps(xlarun.launch(lambda: int(os.environ["RANK"]), nproc_per_node=2, device="cpu").values))
    """,
    )
    caller = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**caller_env(), **({} if temporary is None else {"TMPDIR": str(temporary)})},
        cwd=tmp_path,
    )
    wait_for(
        lambda: len(list(pids.iterdir())) == 2 and all(p.read_text() for p in pids.iterdir()), "both workers to start"
    )
    return caller, [int(p.read_text()) for p in pids.iterdir()]


def test_an_interrupt_stops_every_worker_and_the_next_launch_works(tmp_path: Path) -> None:
    caller, workers = start_sleepers(tmp_path)
    try:
        caller.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        wait_for(lambda: not any(is_alive(pid) for pid in workers), "the workers to end")
        assert time.monotonic() - interrupted < slack_s(2)
        out, err = caller.communicate(timeout=CALLER_TIMEOUT_S)
    finally:
        if caller.poll() is None:
            caller.kill()
    assert caller.returncode == 0, err
    assert out.splitlines()[-2:] == ["interrupted", "[0, 1]"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_caller_stopped_by_a_signal_ends_by_it_with_its_private_directory_gone(
    tmp_path: Path, stop: signal.Signals
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    caller, workers = start_sleepers(tmp_path, temporary=temporary)
    try:
        [private] = temporary.glob("xlarun-launch-*")  # the launch's own: the call's payload, the summary to come
        assert (private / "call").exists()
        caller.send_signal(stop)
        caller.communicate(timeout=CALLER_TIMEOUT_S)
    finally:
        if caller.poll() is None:
            caller.kill()
    assert caller.returncode == -stop  # the signal raised again under the caller's own disposition
    assert not any(is_alive(pid) for pid in workers)
    assert not private.exists()


def test_output_reaches_a_sys_stdout_that_is_no_descriptor(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(
                write_caller(
                    tmp_path,
                    """
        import io

        caught_out, caught_err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = caught_out, caught_err

        def speak():
            print("out of", os.environ["RANK"])
            print("err of", os.environ["RANK"], file=sys.stderr)

        xlarun.launch(speak, nproc_per_node=2, device="cpu", tee="3")
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        print(json.dumps([caught_out.getvalue(), caught_err.getvalue()]))
    """,
                )
            ),
        ],
        capture_output=True,
        text=True,
        env=caller_env(),
        cwd=tmp_path,
        timeout=CALLER_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 and done.stderr == ""
    out, err = json.loads(done.stdout)
    assert sorted(out.splitlines()) == ["[default0]:out of 0", "[default1]:out of 1"]
    assert "[default0]:err of 0" in err.splitlines() and "[default1]:err of 1" in err.splitlines()
    assert "xlarun: OMP_NUM_THREADS=1" in err


def test_a_second_interrupt_skips_the_grace(tmp_path: Path) -> None:
    caller, workers = start_sleepers(tmp_path, ", shutdown_timeout=60", ignore_term=True)
    try:
        caller.send_signal(signal.SIGINT)
        time.sleep(1)
        assert all(is_alive(pid) for pid in workers)  # the signals ignored: the grace period runs
        caller.send_signal(signal.SIGINT)
        again = time.monotonic()
        wait_for(lambda: not any(is_alive(pid) for pid in workers), "the workers to end")
        assert time.monotonic() - again < slack_s(2)  # not the 60 s of grace
        out, err = caller.communicate(timeout=CALLER_TIMEOUT_S)
    finally:
        if caller.poll() is None:
            caller.kill()
    assert caller.returncode == 0, err
    assert out.splitlines()[-2:] == ["interrupted", "[0, 1]"]


def test_a_killed_caller_leaves_no_worker(tmp_path: Path) -> None:
    caller, workers = start_sleepers(tmp_path)
    caller.kill()
    caller.communicate(timeout=CALLER_TIMEOUT_S)
    wait_for(lambda: not any(is_alive(pid) for pid in workers), "the orphan guard to end the workers")


def test_a_caller_that_holds_the_device_is_named(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(TESTS / "fixtures" / "hosts" / "tpu-v4-vm", root)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "accel0").touch()
    (root / "libtpu.so").touch()  # stands in for libtpu, as TorchTPU's preflight wants a file; no worker loads it
    env = {**caller_env(), "XLARUN_HOST_ROOT": str(root), "TPU_LIBRARY_PATH": str(root / "libtpu.so")}
    done = subprocess.run(
        [
            sys.executable,
            str(
                write_caller(
                    tmp_path,
                    f"""
        held = open({str(root / "dev" / "accel0")!r})
        try:
            xlarun.launch(lambda: 0, device="tpu", nproc_per_node=1)
        except RuntimeError as error:
            print(json.dumps([str(error), os.getpid()]))
    """,
                )
            ),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=CALLER_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    refusal, pid = json.loads(done.stdout.splitlines()[-1])
    assert refusal.startswith("the tpu device is in use by 1 ")
    assert (
        f"xlarun: this Python process (pid {pid}) holds {root.resolve() / 'dev' / 'accel0'}, which its workers need"
        in done.stderr
    )


def test_without_cloudpickle_a_lambda_is_refused_naming_the_extra_and_a_module_function_still_runs(
    tmp_path: Path,
) -> None:
    got = run_caller(
        tmp_path,
        """
        sys.modules["cloudpickle"] = None  # as if it were not installed
        try:
            xlarun.launch(lambda: 1, nproc_per_node=1, device="cpu")
        except ImportError as error:
            refused = str(error)
        print(json.dumps([refused, xlarun.launch(os.getpid, nproc_per_node=2, device="cpu").values[0] > 0]))
    """,
    )
    assert (
        got[0].endswith(
            "travels to the workers by value with cloudpickle, which is not installed: pip install 'xlarun[notebook]'"
        )
        and "\n" not in got[0]
    )
    assert got[1] is True


def test_compile_cache_is_a_keyword_and_the_summary_counts_its_entries(tmp_path: Path) -> None:
    got = run_caller(
        tmp_path,
        """
        import cached

        result = xlarun.launch(cached.variables, nproc_per_node=2, device="cpu", compile_cache="cache")
        print(json.dumps({"values": result.values, "summary": result.summary["compile_cache"]}))
        """,
        {
            "cached": """
            import os

            def variables():
                cache = os.path.dirname(os.environ["XLA_PERSISTENT_CACHE_PATH"])
                with open(os.path.join(cache, os.environ["RANK"]), "w"):
                    pass
                return [os.environ[name] for name in ("XLA_PERSISTENT_CACHE_PATH", "XLA_PERSISTENT_CACHE_READ_ONLY")]
            """
        },
    )
    cache = str(tmp_path / "cache")
    assert got["values"] == [[f"{cache}/torch_xla", "0"], [f"{cache}/torch_xla", "1"]]
    # Each rank left a file in the directory, which the launcher created before they started.
    assert got["summary"] == {"directory": cache, "entries_before": 0, "entries_after": 2}
