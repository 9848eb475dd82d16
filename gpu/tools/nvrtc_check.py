#!/usr/bin/env python3
"""Compiles the flash kernels as the GPU backend does (NVRTC, sm_90a, C++17), then runs
ptxas -v on the PTX: compile errors, registers and spills per kernel, and ptxas's wgmma
notes C7520 and C7515 (wgmmas serialized: a performance bug), all without a GPU, for both
builds the backend makes (f32 rows, and bf16 rows with FD_OUT_BF16; -DFD_OUT_BF16 checks
that one alone). Exits 1 on an error, a C7520 or a C7515 in either. With --sass KERNEL it also disassembles that kernel and
prints the shape of its main loop (the instructions from its first tensor-core product to
its last, and the synchronization among them); --sass-out FILE keeps the whole listing,
--ptx-out FILE the PTX (ptxas's notes name PTX line numbers).

Setup, once (the CUDA 13.0 NVRTC and nvcc wheels from PyPI, into /tmp/cuda):
    pip download --no-deps -d /tmp/cuda "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-nvcc==13.0.*"
    pip download --no-deps -d /tmp/cuda "nvidia-cuda-cuobjdump==13.5.*" "nvidia-cuda-nvdisasm==13.5.*"   # --sass only
    for f in /tmp/cuda/*.whl; do unzip -qo "$f" -d /tmp/cuda/x; done
Run, from the repository root (-DNAME defines a diagnostic switch):
    LD_LIBRARY_PATH=/tmp/cuda/x/nvidia/cu13/lib python3 gpu/tools/nvrtc_check.py [-DFW_NO_LOAD] \
        [--sass flash_decode_seesaw [--sass-out FILE]] [--ptx-out FILE]
"""
import collections
import ctypes
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.environ.get("CUDA_WHEELS", "/tmp/cuda/x/nvidia/cu13")
# The order ops/flash.rs concatenates them in (after common.cuh, which the device prepends).
SOURCES = ["common.cuh", "flash_decode.cu", "flash_wgmma.cu", "flash_seesaw.cu", "flash_prefill.cu"]


def nvrtc_ptx(src: str) -> bytes:
    lib = ctypes.CDLL(os.path.join(ROOT, "lib", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"flash.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90a", b"--std=c++17"]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    # NVRTC runs ptxas itself for an sm_ arch: its log holds the same notes.
    for line in log.value.decode().splitlines():
        if line.strip() and "C7519" not in line:
            print(line)
    if status:
        sys.exit("NVRTC failed")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value


def sass_summary(cubin: str, kernel: str, keep: str | None) -> None:
    """Disassembles `kernel` and prints its main loop's size and synchronization."""
    tool = os.path.join(ROOT, "bin", "cuobjdump")
    env = dict(os.environ, PATH=os.path.join(ROOT, "bin") + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run([tool, "-sass", "-fun", kernel, cubin], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"cuobjdump: {out.stderr.strip()}")
    if keep:
        open(keep, "w").write(out.stdout)
    # Instruction lines look like "/*0a10*/  HGMMA.64x64x16.F32.BF16 R152, ... ;"
    pat = r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([^;]*);"
    ins = [m.group(2) for m in re.finditer(pat, out.stdout)]
    mma = [i for i, t in enumerate(ins) if t.startswith("HGMMA")]
    if not mma:
        print(f"{kernel}: {len(ins)} instructions, no HGMMA")
        return
    loop = ins[mma[0]:mma[-1] + 1]
    ops = collections.Counter(t.split()[0] for t in loop)
    # Synchronization, and the copies issued (UTMALDG) among it.
    sync = {k: v for k, v in ops.items() if re.match(r"(WARPGROUP|BAR|SYNCS|DEPBAR|MEMBAR|UTMALDG)", k)}
    uniform = sum(v for k, v in ops.items() if k.startswith("U") and not k.startswith("UTMA"))
    print(f"{kernel}: {len(ins)} instructions; first to last HGMMA {len(loop)} "
          f"({len(mma)} HGMMA, {uniform} uniform-datapath)")
    for k in sorted(sync):
        print(f"  {k}: {sync[k]}")


def main() -> int:
    defines = [a[2:] for a in sys.argv[1:] if a.startswith("-D")]
    args = sys.argv[1:]
    def value(flag: str) -> str | None:
        if flag not in args:
            return None
        at = args.index(flag) + 1
        if at == len(args):
            sys.exit(f"{flag} needs a value")
        return args[at]

    sass, keep, keep_ptx = value("--sass"), value("--sass-out"), value("--ptx-out")
    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels")
    body = "\n".join(open(os.path.join(kernels, f)).read() for f in SOURCES)
    # Both builds the backend makes: f32 rows (gpu-test's f64 checks) and bf16 rows
    # (FD_OUT_BF16: the engine's and gpu-bench's). Code behind `sizeof(fd_out)` differs
    # between them, so a wgmma serialized in one alone shows in that one alone. The
    # listing (--sass, --ptx-out) is the bf16 build's.
    builds = [defines] if "FD_OUT_BF16" in defines else [defines, defines + ["FD_OUT_BF16"]]
    bad = 0
    for build in builds:
        print(f"== build: {' '.join('-D' + d for d in build) or '(no defines)'}")
        src = "".join(f"#define {d} 1\n" for d in build) + body
        last = build is builds[-1]
        with tempfile.TemporaryDirectory() as tmp:
            ptx = os.path.join(tmp, "flash.ptx")
            open(ptx, "wb").write(nvrtc_ptx(src))
            if keep_ptx and last:
                open(keep_ptx, "wb").write(open(ptx, "rb").read())
            out = subprocess.run(
                [os.path.join(ROOT, "bin", "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", os.path.join(tmp, "f.cubin")],
                capture_output=True, text=True)
            if sass and last and not out.returncode:
                sass_summary(os.path.join(tmp, "f.cubin"), sass, keep)
        for line in (out.stdout + out.stderr).splitlines():
            # C7519 (a fence ptxas adds before a wgmma) is routine. C7520 and C7515 serialize
            # every wgmma of the kernel (C7515: other instructions write a wgmma's accumulators
            # while products are in flight); C7517 (a wait ptxas injects where it cannot tell
            # that accumulators are done) usually comes with C7515.
            if "C7519" in line or not re.search(r"Compiling entry|registers|spill|error|C75(15|17|20)", line):
                continue
            print(line)
            bad += bool(re.search(r"error|C7520|C7515", line))
        bad += bool(out.returncode)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
