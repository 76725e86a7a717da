"""The options of the ``code`` reward, declared once: flags, help, checks and typed values."""

from __future__ import annotations

import math
from typing import Literal

from plasmid.options import Options, option
from plasmid_code.sandbox import Limits


class CodeOptions(Options, group="code", description="the 'code' reward: tests run in a sandbox"):
    code_timeout: float = option(5.0, "wall-clock seconds per test run", gt=0)
    code_memory_mb: int = option(512, "address-space limit of each sandbox process (MiB)", min=1)
    code_processes: int = option(16, "processes the sandbox user may have at once (bounds fork bombs)", min=1)
    code_max_output_kb: int = option(1024, "stdout kept per run (KiB); more fails the run", min=1)
    code_concurrency: int = option(2, "sandboxed runs at once (per process)", min=1)
    code_python: str | None = option(None, "Python that runs the code; the sandbox user must be able to execute it",
                                     default_text="this one, else /usr/bin/python3")
    code_disk_mb: int = option(64, "space the guest may write in its directory (MiB, files and inodes); "
                                   "filling it scores the response 0", min=1)
    code_require_isolation: Literal["none", "full"] = option(
        "none", "'full': refuse to start unless the network, PID, IPC and mount namespaces and the minimal root "
                "are all in force; 'none': a degraded set is a warning")
    code_sandbox_uid: int = option(61000, "first of the 1000 uids sandboxed runs get, one per run, unique on the "
                                          "host, when plasmid runs as root; they must belong to no user", min=1)

    @property
    def limits(self) -> Limits:
        """The sandbox limits of one run: ``--code-timeout`` of wall clock and as many CPU seconds
        (rounded up, at least 1), memory in bytes, processes, output in bytes."""
        return Limits(
            wall_seconds=self.code_timeout,
            cpu_seconds=max(1, math.ceil(self.code_timeout)),
            memory_bytes=self.code_memory_mb * 1024**2,
            processes=self.code_processes,
            output_bytes=self.code_max_output_kb * 1024,
            disk_bytes=self.code_disk_mb * 1024**2,
        )


class PythonToolOptions(Options, group="python tool", description="the 'python' tool: model code run in the sandbox"):
    python_tool_timeout: float = option(5.0, "wall-clock seconds per call of the 'python' tool (as many CPU "
                                             "seconds, rounded up); keep it under --tool-timeout", gt=0)
    python_tool_memory_mb: int = option(512, "address-space limit of each process of a 'python' call (MiB)", min=1)
    python_tool_max_output_kb: int = option(64, "output a 'python' call may print (KiB); more stops the program",
                                            min=1)
    python_tool_concurrency: int = option(2, "'python' calls running at once (per process)", min=1)

    def limits(self, processes: int) -> Limits:
        """The sandbox limits of one call: ``--python-tool-timeout`` of wall clock and as many CPU
        seconds (rounded up, at least 1), memory and output in bytes, and ``processes``
        (``--code-processes``)."""
        return Limits(
            wall_seconds=self.python_tool_timeout,
            cpu_seconds=max(1, math.ceil(self.python_tool_timeout)),
            memory_bytes=self.python_tool_memory_mb * 1024**2,
            processes=processes,
            output_bytes=self.python_tool_max_output_kb * 1024,
        )
