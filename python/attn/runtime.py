"""attn's process-wide settings and what it sees of the machine, over the C++ library's attn/info.h.

    attn.set_num_threads(4)      # the thread count of every later call (0: back to the default)
    attn.set_isa("avx2")         # the instruction-set level of every later call ("" or None: the best one)
    attn.info()                  # the CPU, the levels, the level in use and the thread count, as a dict

The environment variables ATTN_NUM_THREADS and ATTN_ISA (read once, at the first call) set the same defaults; a
value set here takes precedence over them, for the rest of the process or until set again.
"""

from __future__ import annotations

from . import _attn
from .functional import _int


def set_num_threads(n):
    """Sets the number of threads every later attn call uses (in this process, all threads of it): n in 1..4096,
    or 0 or None for the default again (ATTN_NUM_THREADS, else OpenMP's default for the calling thread: the number
    of cores, unless torch.set_num_threads, which sets the same OpenMP value, changed it on that thread). A bad n
    is a ValueError (TypeError for a non-int) that changes nothing."""
    n = 0 if n is None else _int("n", n, -2**31, 2**31, "1..4096, or 0 for the default")
    _attn.set_num_threads(n)


def get_num_threads():
    """The number of threads an attn call uses now."""
    return _attn.info()["threads"]


def set_isa(level):
    """Lowers the instruction-set level of the CPU kernels every later call uses: one of info()["isa_levels"]
    ('sse2', 'avx2', 'avx512', 'avx512bf16', 'amx') that this CPU supports (info()["supported_isa"]), or "" or
    None for the best again (or ATTN_ISA's). Results agree across levels within the library's tolerances, not
    bit for bit. An unknown or unsupported level is a ValueError naming it; nothing changes then."""
    if level is None:
        level = ""
    if not isinstance(level, str):
        raise TypeError(f"level: got {type(level).__name__} {level!r}; expected a level name (str) or None")
    _attn.set_isa(level)


def info():
    """What attn sees and would use, as a dict: 'version'; the CPU ('vendor', 'brand', CPUID's signature 'family',
    'model', 'stepping', the 'microarchitecture' it names ('' when attn's table does not), 'cpu': one line of them
    all, 'cpuid': the CPUID flags attn reads, 'l1d_bytes', 'l2_bytes', 'l3_bytes', 0 = unknown); what the OS enables ('osxsave', 'xcr0', 'os_avx',
    'os_avx512', 'os_amx', and Linux's AMX permission: 'amx_kernel_supports', 'amx_permitted_before_request',
    'amx_request_ok', None when not asked); the kernel levels ('isa_levels', lowest first, 'supported_isa',
    'best_isa', 'active_isa': the one calls use now) and 'threads', the thread count of a call. The command-line
    tool's `attn info --json` has most of the same keys (and 'ATTN_ISA', 'omp_max_threads', 'online_cpus'; 'xcr0'
    there is a hex string, here an int)."""
    return _attn.info()
