"""Offline compiles for compute capability 9.0 (no GPU needed): a Gluon kernel built in a
subprocess with its own Triton cache, read back as SASS and resource usage by the nvdisasm
and cuobjdump Triton ships."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# what a compile script has in scope: the project on its path, torch, triton, Gluon's
# language (gl), its AST source and Hopper tensor descriptors, mangle_type and GPUTarget
PRELUDE = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
"""


def sass_of(body: str, cache: Path) -> tuple[str, str]:
    """(nvdisasm's SASS, cuobjdump's resource usage) of the kernel ``body`` compiles: a
    script after :data:`PRELUDE` that leaves the compiled kernel in ``ck``."""
    code = PRELUDE + body + '\nsys.stdout.buffer.write(ck.asm["cubin"])\n'
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    cubin = cache / "k.cubin"
    cubin.write_bytes(proc.stdout)
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    sass = subprocess.run([str(tools / "nvdisasm"), "-c", str(cubin)], capture_output=True,
                          text=True, check=True).stdout
    usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", str(cubin)],
                           capture_output=True, text=True, check=True).stdout
    return sass, usage


def ops(sass: str) -> list[tuple[str, str]]:
    """(opcode, operands) of every instruction, predicates dropped."""
    return re.findall(r"\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
