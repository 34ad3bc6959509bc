"""The compiled row-norm kernel (dtg_gpu.graph.native): numbers against float64 references, the
same bits for a row wherever it sits and however the rows are split, and every fallback
(switched off, no compiler, a failed compile, a corrupt or foreign cache) keeps the answer."""

from __future__ import annotations

import multiprocessing
import os
import platform
import shutil
import stat

import pytest
import torch

import dtg_gpu.graph.native as native
from dtg_gpu.graph import filter_norms, row_norms
from dtg_gpu.topology import channel_topology


def _cpu_has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


CAN_BUILD = (
    platform.machine().lower() in ("x86_64", "amd64")
    and _cpu_has_avx2()
    and any(shutil.which(c) for c in ("cc", "gcc", "clang"))
)
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason="no x86-64 AVX2 CPU with a C compiler here")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The module as in a new process, with its own cache folder; the loaded kernel is back after."""
    monkeypatch.setattr(native, "_status", "not loaded yet")
    monkeypatch.setattr(native, "_kernels", None)
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    return tmp_path / "cache"


def _reference(m: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(m.double(), dim=-1)


@needs_kernel
def test_the_kernel_is_built_where_a_compiler_and_avx2_are():
    assert native.native_status().startswith("native kernel"), native.native_status()
    assert native.native_row_norms(torch.ones(3, 9), torch.empty(3))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 9, 16, 25, 32, 49, 400])
def test_native_row_norms_match_a_float64_reference(dtype, k):
    g = torch.Generator().manual_seed(k)
    eps = torch.finfo(dtype).eps
    for rows in (0, 1, 7, 8, 9, 13, 2 * native.ELEMENTS_PER_THREAD // k + 5):  # tails, and parts on two threads
        m = torch.randn(rows, k, generator=g, dtype=dtype) * torch.logspace(-3, 3, k, dtype=dtype)
        out = torch.full((rows,), -1.0, dtype=dtype)
        assert native.native_row_norms(m, out)
        torch.testing.assert_close(out.double(), _reference(m), rtol=(k + 4) * eps, atol=0.0)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [3, 9, 25])
def test_a_rows_norm_is_the_same_bits_wherever_it_sits_and_however_rows_are_split(dtype, k):
    m = torch.randn(
        2 * native.ELEMENTS_PER_THREAD // k + 11, k, generator=torch.Generator().manual_seed(1), dtype=dtype
    )
    whole = torch.empty(m.shape[0], dtype=dtype)
    assert native.native_row_norms(m, whole)
    for start in range(1, 9):  # every position in a group of eight rows, and the tail
        part = torch.empty(m.shape[0] - start, dtype=dtype)
        assert native.native_row_norms(m[start:], part)
        assert torch.equal(part, whole[start:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = torch.empty_like(whole)
        assert native.native_row_norms(m, serial)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(serial, whole)


@needs_kernel
def test_nan_inf_zero_and_overflowing_rows():
    m = torch.zeros(10, 9)
    m[1, 4] = float("nan")
    m[2, 8] = float("inf")
    m[3, 0] = -float("inf")
    m[4] = 1e30  # squares overflow float32: inf, which filter_norms detects and rescales
    m[5] = torch.arange(9.0)
    out = torch.empty(10)
    assert native.native_row_norms(m, out)
    assert out[0] == 0 and out[1].isnan() and out[2] == float("inf") and out[3] == float("inf")
    assert out[4] == float("inf")
    assert out[5] == pytest.approx(float(torch.arange(9.0).norm()))
    conv = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, bias=False))
    layer = channel_topology(conv).layers[0]
    w = torch.randn(2, 3, 2, 3, 3, generator=torch.Generator().manual_seed(0)) * 1e30
    torch.testing.assert_close(
        filter_norms(w, layer).double(), torch.linalg.vector_norm(w.double().flatten(-2), dim=-1), rtol=1e-6, atol=0
    )


def test_tensors_the_kernel_does_not_take_are_left_to_torch():
    m = torch.randn(16, 9)
    out = torch.full((16,), -1.0)
    assert not native.native_row_norms(m[:, :8], torch.empty(16))  # strided rows
    assert not native.native_row_norms(m, torch.empty(16, dtype=torch.float64))  # dtype mismatch
    assert not native.native_row_norms(m.half(), torch.empty(16, dtype=torch.half))
    assert not native.native_row_norms(m, torch.empty(8))  # wrong length
    assert not native.native_row_norms(m, torch.empty(32)[::2])  # strided out
    assert not native.native_row_norms(m.view(4, 4, 9), out)  # not [rows, k]
    assert (out == -1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_row_norms_any_layout_and_out(dtype):
    w = torch.randn(3, 5, 9, generator=torch.Generator().manual_seed(2)).to(dtype)
    ref = torch.linalg.vector_norm(w.double(), dim=-1)
    tol = {"rtol": 1e-3, "atol": 0.0} if dtype == torch.float16 else {"rtol": 1e-6, "atol": 0.0}
    torch.testing.assert_close(row_norms(w).double(), ref, **tol)
    torch.testing.assert_close(row_norms(w.transpose(0, 1)).double(), ref.transpose(0, 1), **tol)
    out = torch.empty(3, 5, dtype=dtype)  # contiguous out of w's dtype: written in place
    assert row_norms(w, out=out) is out
    torch.testing.assert_close(out.double(), ref, **tol)
    out = torch.empty(5, 3, dtype=dtype).t()  # non-contiguous out
    assert row_norms(w, out=out) is out
    torch.testing.assert_close(out.double(), ref, **tol)
    out64 = torch.empty(3, 5, dtype=torch.float64)  # out of another dtype
    row_norms(w, out=out64)
    torch.testing.assert_close(out64, ref, **tol)
    g = w.float().requires_grad_()
    (row_norms(g).sum()).backward()  # under autograd torch's kernels keep the graph
    torch.testing.assert_close(g.grad, w.float() / torch.linalg.vector_norm(w.float(), dim=-1, keepdim=True))


def _same_norms_as_with_the_kernel():
    w = torch.randn(4, 64, 32, 3, 3, generator=torch.Generator().manual_seed(3))
    got = row_norms(w.flatten(-2))
    torch.testing.assert_close(
        got.double(), torch.linalg.vector_norm(w.double().flatten(-2), dim=-1), rtol=2e-6, atol=0
    )


def test_switched_off_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native.native_status().startswith("off")
    assert not native.native_row_norms(torch.ones(2, 9), torch.empty(2))
    _same_norms_as_with_the_kernel()
    assert not fresh.exists()  # nothing compiled, nothing written


def test_no_compiler_or_a_failing_one_falls_back(fresh, monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "no C compiler" in native.native_status()
    _same_norms_as_with_the_kernel()
    monkeypatch.undo()  # the real compiler lookup again, then a compiler that always fails
    monkeypatch.setattr(native, "_status", "not loaded yet")
    monkeypatch.setattr(native, "_kernels", None)
    monkeypatch.setenv(native.ENV_CACHE, str(fresh))
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    status = native.native_status()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert status.startswith("no native kernel") and "failed" in status, status
        assert [p.name for p in fresh.iterdir()] == []  # no half-written library left behind
    assert not native.native_row_norms(torch.ones(2, 9), torch.empty(2))
    _same_norms_as_with_the_kernel()


@needs_kernel
def test_the_library_is_cached_private_and_reused(fresh, monkeypatch):
    assert "compiled to" in native.native_status()
    (lib,) = fresh.iterdir()
    assert lib.name.startswith("row_norms-") and lib.suffix == ".so"
    assert not fresh.stat().st_mode & 0o077 and not lib.stat().st_mode & 0o077
    monkeypatch.setattr(native, "_status", "not loaded yet")
    monkeypatch.setattr(native, "_kernels", None)

    def no_compile(*a, **k):
        raise AssertionError("compiled again although the cache holds the library")

    monkeypatch.setattr(native, "_compile", no_compile)
    assert native.native_status() == f"native kernel ({lib})"
    _same_norms_as_with_the_kernel()


@needs_kernel
def test_a_corrupt_cached_library_is_compiled_again(fresh):
    fresh.mkdir(mode=0o700, parents=True)
    lib = fresh / native.library_name()
    lib.write_bytes(b"\x7fELF truncated")
    lib.chmod(0o700)
    assert "compiled to" in native.native_status()
    assert lib.stat().st_size > 1000
    _same_norms_as_with_the_kernel()


@needs_kernel
@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_cache_others_can_write_is_not_loaded(fresh):
    fresh.mkdir(parents=True)
    planted = fresh / "planted.so"
    planted.write_bytes(b"")
    os.chmod(fresh, 0o777)
    status = native.native_status()
    assert "compiled for this process" in status and "not private" in status, status
    assert sorted(p.name for p in fresh.iterdir()) == ["planted.so"]  # nothing written to a shared folder
    assert native.native_row_norms(torch.ones(2, 9), torch.empty(2))
    os.chmod(fresh, stat.S_IRWXU)


_BIG = torch.randn(native.ELEMENTS_PER_THREAD // 3, 9, generator=torch.Generator().manual_seed(4))


def _child(q):
    # only our kernel in the child: torch's own OpenMP ops are not fork-safe once the parent ran them
    out = torch.empty(_BIG.shape[0])
    q.put(out.numpy().tobytes() if native.native_row_norms(_BIG, out) else None)


@needs_kernel
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_gets_its_own_threads():
    parent = torch.empty(_BIG.shape[0])
    assert native.native_row_norms(_BIG, parent)  # the parent's pool of threads exists now
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    try:
        got = q.get(timeout=60)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
    assert got is not None and got == parent.numpy().tobytes()


@needs_kernel
def test_a_library_that_computes_wrong_norms_is_refused(fresh, monkeypatch, tmp_path):
    wrong = tmp_path / "wrong.c"  # the real kernel with the square root left out
    wrong.write_text(native.SOURCE.read_text().replace("_mm256_sqrt_ps(", "(").replace("_mm256_sqrt_pd(", "("))
    monkeypatch.setattr(native, "SOURCE", wrong)
    status = native.native_status()
    assert status.startswith("no native kernel") and "self-test" in status, status
    assert not native.native_row_norms(torch.ones(2, 9), torch.empty(2))
    _same_norms_as_with_the_kernel()
