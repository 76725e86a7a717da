"""The sandbox's second stage: runs inside the guest interpreter, guards it, then runs the code.

Copied into each sandbox directory as ``_plasmid_guest.py`` and run (after the launcher has
confined the process) as ``python -I _plasmid_guest.py MODE ...``; stdlib only, and written for
any Python 3 the sandbox user can execute.

The guard is a ``sys.addaudithook`` hook, which cannot be removed once added. It refuses sockets,
new processes, signals to other processes, ``ctypes`` (a way around the hook), writes outside the
working directory, and reading another process's ``/proc`` entries. It is defence in depth, not
the boundary: the launcher's namespaces, uid and rlimits are. Where those are unavailable (no
root, no user namespaces) it is what refuses sockets and writes outside.

Modes:

- ``stdio SOLUTION``: run ``SOLUTION`` as ``__main__`` (its stdin and stdout are the test's).
- ``asserts SOLUTION TESTS_JSON``: read a nonce from the first line of stdin, load and delete
  the JSON list of test snippets, run ``SOLUTION`` as module ``solution``, then run each snippet
  in its namespace and write ``NONCE passed I`` on the original stdout for each one that raises
  nothing. An early exit, or a snippet that raises, simply writes no marker for it. The nonce
  defeats exiting early and printing look-alike markers; it does not defeat a program that
  inspects this harness's stack frames.
"""

import json
import os
import re
import runpy
import sys

REFUSED_EVENTS = frozenset({
    "socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg",
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle",
})
#: audit events whose arguments at these positions are paths that get written.
WRITING_PATH_EVENTS = {
    "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.mkdir": (0,), "os.remove": (0,),
    "os.rename": (0, 1), "os.rmdir": (0,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ALLOWED_WRITES = ("/dev/null",)
OTHER_PROCESS = re.compile(r"^/proc/(\d+)(/|$)")


def install_guard(workdir):
    own_pid = str(os.getpid())

    def inside(path):
        real = os.path.realpath(os.path.join(workdir, os.fsdecode(path)))
        return real == workdir or real.startswith(workdir + os.sep) or real in ALLOWED_WRITES

    def refuse(what):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event in REFUSED_EVENTS:
            refuse(event)
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int):
                return
            text = os.fsdecode(path)
            match = OTHER_PROCESS.match(os.path.realpath(text))
            if match and match.group(1) != own_pid:
                refuse(f"reading {text}")
            writing = (isinstance(mode, str) and any(char in mode for char in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & WRITE_FLAGS)
            if writing and not inside(path):
                refuse(f"writing {text}")
        elif event in WRITING_PATH_EVENTS:
            for position in WRITING_PATH_EVENTS[event]:
                if position < len(args) and isinstance(args[position], (str, bytes, os.PathLike)):
                    if not inside(args[position]):
                        refuse(f"{event} on {os.fsdecode(args[position])}")

    sys.addaudithook(hook)


def run_stdio(solution):
    sys.argv = [solution]
    runpy.run_path(solution, run_name="__main__")


def run_asserts(solution, tests_path):
    nonce = sys.stdin.readline().strip()
    with open(tests_path) as handle:
        tests = json.load(handle)
    os.remove(tests_path)
    report = os.dup(1)
    namespace = {"__name__": "solution"}
    with open(solution) as handle:
        source = handle.read()
    try:
        exec(compile(source, solution, "exec"), namespace)
    except BaseException:  # noqa: BLE001 - a solution that fails to load passes no test
        return
    for position, snippet in enumerate(tests):
        try:
            exec(compile(snippet, f"<test {position}>", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - a failing test is simply not reported as passed
            continue
        os.write(report, f"{nonce} passed {position}\n".encode())


def main(argv):
    workdir = os.path.realpath(os.getcwd())
    if os.environ.get("PLASMID_SANDBOX_GUARD", "1") == "1":
        install_guard(workdir)
    if argv[0] == "stdio":
        run_stdio(argv[1])
    else:
        run_asserts(argv[1], argv[2])


if __name__ == "__main__":
    main(sys.argv[1:])
