"""The sandbox's second stage: runs inside the guest interpreter, guards it, then runs the code.

Copied into each sandbox directory as ``_plasmid_guest.py`` and run (after the launcher has
confined the process) as ``python -I _plasmid_guest.py MODE ...``; stdlib only, and written for
any Python 3 the sandbox user can execute.

The guard is a ``sys.addaudithook`` hook, which cannot be removed once added. It refuses sockets,
new processes, signals to other processes, ``ctypes`` and the other modules that reach around
the hook (:data:`REFUSED_MODULES`), writes outside the working directory (a relative path is
resolved against the real cwd or the ``dir_fd`` it is relative to; and since the ``open`` event
does not carry its ``dir_fd``, a relative write is refused while any directory descriptor outside
is held), and reading another process's ``/proc`` entries. It is defence in depth, not
the boundary: the launcher's namespaces, uid and rlimits are. Where those are unavailable (no
root, no user namespaces) it is what refuses sockets and writes outside.

Modes:

- ``stdio SOLUTION``: run ``SOLUTION`` as ``__main__`` (its stdin and stdout are the test's).
- ``asserts SOLUTION PLAN_JSON``: read a nonce from the first line of stdin, load and delete the
  plan (see :mod:`plasmid_code.verdict`: per test snippet, a list of steps ``[kind, source]``),
  run ``SOLUTION`` as module ``solution``, then for each snippet run its steps in that namespace:
  ``exec`` steps (setup statements; one that raises ends the snippet), ``value`` steps (an
  expression whose value is reported in the encoding of :func:`encode`) and ``truth`` steps (an
  expression reported as a bool). One line ``NONCE {"i": I, "done": BOOL, "r": [...]}`` per
  snippet goes to the original stdout. This harness decides nothing: it never sees an expected
  value, and the host compares. A program that forges these lines only claims values for the
  expressions, as a program that computed them would.
"""

import json
import os
import re
import runpy
import stat
import sys

REFUSED_EVENTS = frozenset({
    "socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg",
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle",
})
#: Modules that reach around the audit events (``_posixsubprocess.fork_exec`` starts processes
#: with no event; ``_ctypes`` calls anything; sub-interpreters run without this hook; the test
#: modules poke at the interpreter's internals). Loading one is refused (``ImportError``; see
#: :func:`lock_imports` for the ways around the ``import`` event), and any already loaded, and
#: every module holding one, is dropped from ``sys.modules``; ``_posixsubprocess`` is replaced by
#: a stub.
REFUSED_MODULES = frozenset({
    "_posixsubprocess", "_ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels",
    "_interpqueues", "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_testbuffer",
    "_testimportmultiple",
})
#: audit events whose arguments at these positions are paths that get written.
WRITING_PATH_EVENTS = {
    "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.mkdir": (0,), "os.remove": (0,),
    "os.rename": (0, 1), "os.rmdir": (0,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}
#: For those events, the position of the ``dir_fd`` each path argument is relative to.
DIR_FD_POSITIONS = {
    "os.chmod": (2,), "os.chown": (3,), "os.link": (2, 3), "os.mkdir": (2,), "os.remove": (1,),
    "os.rename": (2, 3), "os.rmdir": (1,), "os.symlink": (2,), "os.utime": (3,), "shutil.rmtree": (1,),
    "os.mkfifo": (2,), "os.mknod": (3,),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ALLOWED_WRITES = ("/dev/null",)
OTHER_PROCESS = re.compile(r"^/proc/(\d+)(/|$)")


def install_guard(workdir):
    own_pid = str(os.getpid())

    def within(real):
        return real == workdir or real.startswith(workdir + os.sep) or real in ALLOWED_WRITES

    def fd_path(fd):
        return os.readlink(f"/proc/self/fd/{fd}")

    def inside(path, dir_fd=None):
        if isinstance(path, int):  # an operation on an open descriptor: where does it point?
            try:
                return within(os.path.realpath(fd_path(path)))
            except OSError:
                return False
        text = os.fsdecode(path)
        if not os.path.isabs(text):
            if isinstance(dir_fd, int) and dir_fd >= 0:
                try:
                    base = fd_path(dir_fd)
                except OSError:
                    return False
            else:
                base = os.getcwd()  # not workdir: a chdir() elsewhere must not make writes look inside
            text = os.path.join(base, text)
        return within(os.path.realpath(text))

    def outside_directory_open():
        """A directory descriptor this process holds outside ``workdir`` (an ``open`` with
        ``dir_fd=`` reaches through it, and the open event does not carry the dir_fd)."""
        try:
            descriptors = os.listdir("/proc/self/fd")
        except OSError:
            return "unknown (no /proc/self/fd)"
        for entry in descriptors:
            try:
                fd = int(entry)
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    continue
                target = fd_path(fd)
            except (OSError, ValueError):
                continue
            if not within(os.path.realpath(target)):
                return target
        return None

    trusted = tuple(dict.fromkeys(os.path.realpath(prefix) for prefix in (
        sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)))

    def extension_problem(short_name, path):
        """Why the shared library ``path`` may not be loaded as module ``short_name``: only the
        interpreter's own extension modules, each under its own name (a refused one loaded as
        ``pkg._posixsubprocess`` or from a copy would run with no audit event), and nothing
        written in the sandbox's directory."""
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return "not a path"
        stem = os.path.basename(real).partition(".")[0]
        if stem in REFUSED_MODULES:
            return f"it is {stem}"
        if stem != short_name:
            return f"it is module {stem}"
        if within(real) or not any(real.startswith(prefix + os.sep) for prefix in trusted):
            return "outside the interpreter's prefix"
        return None

    def refuse(what):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event in REFUSED_EVENTS:
            refuse(event)
        if event == "import":
            name = args[0] if args else ""
            parts = name.split(".") if isinstance(name, str) else [""]
            if any(part in REFUSED_MODULES for part in parts):
                raise ImportError(f"sandbox: importing {name} is not allowed", name=name)
            path = args[1] if len(args) > 1 else None
            if path is not None:  # _imp.create_dynamic: an extension module's shared library
                problem = extension_problem(parts[-1], path)
                if problem:
                    raise ImportError(f"sandbox: loading {name} from {path!r} is not allowed ({problem})", name=name)
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int):
                return
            text = os.fsdecode(path)
            match = OTHER_PROCESS.match(os.path.realpath(text))
            if match and match.group(1) != own_pid:
                refuse(f"reading {text}")
            writing = (isinstance(mode, str) and any(char in mode for char in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & WRITE_FLAGS)
            if writing:
                if not inside(path):
                    refuse(f"writing {text}")
                if not os.path.isabs(text):
                    held = outside_directory_open()
                    if held:
                        refuse(f"writing {text} while holding a descriptor of directory {held}")
        elif event in WRITING_PATH_EVENTS:
            dir_fds = DIR_FD_POSITIONS.get(event, ())
            for number, position in enumerate(WRITING_PATH_EVENTS[event]):
                if position < len(args) and isinstance(args[position], (str, bytes, os.PathLike, int)):
                    dir_position = dir_fds[min(number, len(dir_fds) - 1)] if dir_fds else None
                    dir_fd = args[dir_position] if dir_position is not None and dir_position < len(args) else None
                    if not inside(args[position], dir_fd):
                        refuse(f"{event} on {args[position]!r}")

    lock_imports()
    sys.addaudithook(hook)


def lock_imports():
    """Make the refused modules unreachable before the hook goes in: drop them (and the modules
    holding them) from ``sys.modules``; load every other built-in module now and replace
    ``_imp.create_builtin``, which builds a built-in module with no audit event (extension
    modules go through ``_imp.create_dynamic``, which raises the ``import`` event); and put a
    stub ``_posixsubprocess`` in place so that ``subprocess`` and ``asyncio`` still import (their
    ``Popen`` is refused by its own event)."""
    import _imp
    import types
    import warnings

    refused = {id(module) for name, module in sys.modules.items() if name.partition(".")[0] in REFUSED_MODULES}
    for name, module in list(sys.modules.items()):
        holds = name.partition(".")[0] in REFUSED_MODULES or any(
            id(value) in refused for value in list(getattr(module, "__dict__", {}).values()))
        if holds:
            del sys.modules[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sys.builtin_module_names:
            if name.partition(".")[0] not in REFUSED_MODULES and name not in sys.modules:
                try:
                    __import__(name)
                except Exception:  # noqa: BLE001 - a built-in that cannot load here is not needed
                    pass

    def create_builtin(spec):
        raise PermissionError(f"sandbox: creating built-in module {getattr(spec, 'name', spec)} is not allowed")

    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: _posixsubprocess.fork_exec is not allowed")

    _imp.create_builtin = create_builtin
    stub = types.ModuleType("_posixsubprocess", "sandbox stand-in: starting processes is not allowed")
    stub.fork_exec = fork_exec
    sys.modules["_posixsubprocess"] = stub


def run_stdio(solution):
    sys.argv = [solution]
    runpy.run_path(solution, run_name="__main__")


MAX_DEPTH = 32
MAX_ITEMS = 100_000


def encode(value, depth=0, budget=None):
    """``value`` in the JSON form :func:`plasmid_code.verdict.decode` reads (capped in depth and items)."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        return {"$": "opaque", "type": "too deep or too large"}
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        number = int.__index__(value)
        return number if -2**62 < number < 2**62 else {"$": "int", "v": hex(number)}
    if isinstance(value, float):
        return {"$": "float", "v": float.hex(value)}
    if isinstance(value, complex):
        return {"$": "complex", "v": [float.hex(value.real), float.hex(value.imag)]}
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "v": bytes(value).hex()}
    if value is Ellipsis:
        return {"$": "ellipsis"}
    if isinstance(value, list):
        return [encode(item, depth + 1, budget) for item in list.__iter__(value)]
    for kind, tag in ((tuple, "tuple"), (frozenset, "frozenset"), (set, "set")):
        if isinstance(value, kind):
            return {"$": tag, "v": [encode(item, depth + 1, budget) for item in kind.__iter__(value)]}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)]
                                   for k, v in dict.items(value)]}
    kind = (type(value).__module__, type(value).__name__)
    if kind == ("fractions", "Fraction"):
        return {"$": "fraction", "v": [encode(value.numerator), encode(value.denominator)]}
    if kind in (("decimal", "Decimal"), ("_decimal", "Decimal"), ("_pydecimal", "Decimal")):
        return {"$": "decimal", "v": str(value)}
    if hasattr(type(value), "__index__") and not hasattr(type(value), "__len__"):  # e.g. numpy integers
        return encode(int(value.__index__()), depth, budget)
    if type(value).__name__ in ("bool_", "bool8"):
        return bool(value)
    if hasattr(type(value), "__float__") and type(value).__module__ == "numpy":  # numpy floats
        return encode(float(value), depth, budget)
    return {"$": "opaque", "type": type(value).__name__}


def run_asserts(solution, plan_path):
    nonce = sys.stdin.readline().strip()
    with open(plan_path) as handle:
        plan = json.load(handle)
    os.remove(plan_path)
    report = os.dup(1)
    namespace = {"__name__": "solution"}
    with open(solution) as handle:
        source = handle.read()
    try:
        exec(compile(source, solution, "exec"), namespace)
    except BaseException:  # noqa: BLE001 - a solution that fails to load passes no test
        return
    for position, steps in enumerate(plan):
        name = f"<test {position}>"
        results = []
        done = True
        for kind, step in steps:
            if kind == "exec":
                try:
                    exec(compile(step, name, "exec"), namespace)
                except BaseException:  # noqa: BLE001 - a failing setup fails the snippet
                    done = False
                    break
                results.append(None)
                continue
            try:
                value = eval(compile(step, name, "eval"), namespace)  # noqa: S307 - the guest runs test code
                results.append(bool(value) if kind == "truth" else encode(value))
            except BaseException:  # noqa: BLE001 - judged by the host, only if the check reaches it
                results.append({"$": "error"})
        try:
            line = json.dumps({"i": position, "done": done, "r": results})
        except BaseException:  # noqa: BLE001 - unencodable: the snippet fails
            line = json.dumps({"i": position, "done": False, "r": []})
        os.write(report, f"{nonce} {line}\n".encode())


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
