"""SIGINT/SIGTERM of a serving process (speculant.termination), in child processes: before it
serves, a signal stops the start at once (unwinding it); once it serves, a signal only asks for
the graceful stop, however soon after SERVING it comes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.assets import ROOT


def run_child(body: str) -> subprocess.CompletedProcess[str]:
    script = "import os, signal, time\nfrom speculant import termination\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_sigterm_while_starting_exits_143_and_unwinds_the_start():
    child = run_child(
        """
        termination.catch()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # a model loading
        finally:
            print("unwound")
        """
    )
    assert child.returncode == 143, child.stderr
    assert child.stdout.strip() == "unwound"


def test_sigint_while_starting_raises_keyboard_interrupt():
    child = run_child(
        """
        termination.catch()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "interrupted"


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_right_after_serving_asks_for_the_graceful_stop(signum):
    # The moment that lost signals before: SERVING reported, the wait not yet begun.
    child = run_child(
        f"""
        termination.catch()
        termination.started_serving()
        os.kill(os.getpid(), signal.{signum})
        time.sleep(0.2)  # logging, the last steps of a start
        termination.wait_for_signal()
        print("stopping gracefully")
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "stopping gracefully"


def test_an_interrupt_raised_where_python_drops_it_still_stops_a_batch_loop():
    # A KeyboardInterrupt raised inside a finalizer is only printed ("Exception ignored"):
    # with Python's default handler the loop below would run to its end.
    child = run_child(
        """
        termination.catch_interrupt()

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the handler runs here, inside the finalizer

        Finalized()
        try:
            for _ in range(300):
                termination.check_interrupt()
                time.sleep(0.1)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    assert child.stdout.strip() == "interrupted", child.stderr
