"""The module's runtime: the interpreter exits promptly with leases held,
a metronome running and an acquire waiting, leaving no thread behind."""

from __future__ import annotations

import subprocess
import textwrap

from conftest import PYTHON


def test_the_interpreter_exits_with_work_in_flight(server, tmp_path):
    script = textwrap.dedent(
        f"""
        import threading
        import bagel
        client = bagel.Client({server.url!r})
        held = client.acquire("exit-held", ttl=5)
        store = bagel.open_store({str(tmp_path)!r}, client=client)
        metronome = store.metronome("log")
        metronome.start()
        # An acquire that would wait forever, in a daemon thread: at exit
        # it raises Closed.
        def wait():
            try:
                client.acquire("exit-held", wait=None)
            except bagel.Closed:
                pass
        threading.Thread(target=wait, daemon=True).start()
        """
    )
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr


def test_after_shutdown_calls_raise_closed(server):
    script = textwrap.dedent(
        f"""
        import bagel
        client = bagel.Client({server.url!r})
        bagel._bagel._shutdown()
        try:
            client.acquire("after-shutdown", ttl=5)
        except bagel.Closed:
            print("closed")
        """
    )
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "closed"


def test_ctrl_c_interrupts_a_blocking_wait(server):
    import signal

    # A child started from a shell's background job inherits SIGINT
    # ignored, and Python then installs no handler for it: the script
    # installs Python's own, the one an interactive user has.
    script = textwrap.dedent(
        f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import bagel
        client = bagel.Client({server.url!r})
        held = client.acquire("ctrl-c", ttl=5)
        try:
            print("waiting", flush=True)
            client.acquire("ctrl-c", ttl=5, wait=None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    child = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        child.send_signal(signal.SIGINT)
        # Bounded: a wait the signal does not end fails here, not hangs.
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.strip() == "interrupted"
    assert child.returncode == 0


def test_the_api_reference_is_generated_from_these_docstrings():
    """docs/python.md is what client/python/docs.py renders now."""
    from conftest import REPO

    out = subprocess.run(
        [PYTHON, str(REPO / "client" / "python" / "docs.py")], capture_output=True, text=True, check=True
    )
    assert out.stdout == (REPO / "docs" / "python.md").read_text(), (
        "docs/python.md is stale: python client/python/docs.py > docs/python.md"
    )
