"""Input files are checked against the signature from their .npy headers, before any
data is read or decompressed, so what a file claims can never cost more memory
than the signature needs.

"Before any data is read" is tested by making the data unreadable (truncated,
or a corrupt deflate stream): the error must still be the header's.
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy
import numpy.lib.format
import pytest

from exirc.errors import InputError
from exirc.serialize.npy import load_array, load_array_files, load_arrays
from exirc.serialize.npy_expected import ExpectedArray, ExpectedArrays
from exirc.serialize.symbolic_shapes import SymbolRange
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program

F32 = numpy.dtype(numpy.float32)
X = ExpectedArray("input_0", "f32[2, 3]", (2, 3), dtype=F32)


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    numpy.lib.format.write_array_header_1_0(
        out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _bomb(path: Path, shape: tuple[int, ...], *, key: str = "input_0") -> int:
    """A deflated .npz member of `shape` float32 zeros, written without ever
    holding them; returns the bytes it inflates to."""
    nbytes = 4 * int(numpy.prod(shape))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open(f"{key}.npy", "w", force_zip64=True) as member:
        member.write(_header(shape))
        chunk = bytes(1 << 24)
        left = nbytes
        while left:
            member.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
    return nbytes


def _npz_with_garbage_data(path: Path, garbage: str, **arrays: numpy.ndarray) -> None:
    """A compressed .npz whose member `garbage` has a good header, then garbage."""
    numpy.savez_compressed(path, **arrays)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{garbage}.npy")
    raw = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", raw, info.header_offset + 26)
    start = info.header_offset + 30 + name_length + extra_length
    # The .npy header is the first ~128 bytes of the stream; ruin the second half.
    raw[start + info.compress_size // 2: start + info.compress_size] = \
        b"\xff" * (info.compress_size - info.compress_size // 2)
    path.write_bytes(bytes(raw))


# --------------------------------------------------------------------------- one array


@pytest.mark.parametrize("shape, descr, words", [
    ((3, 2), "<f4", "input_0 has shape [3, 2], expected [2, 3] (f32[2, 3])"),
    ((2, 3, 1), "<f4", "input_0 has rank 3 (shape [2, 3, 1]), expected rank 2 (f32[2, 3])"),
    ((2, 3), "<f8", "input_0 has dtype float64, expected float32 (f32[2, 3])"),
    ((1 << 30, 1 << 30), "<f4", "input_0 has shape [1073741824, 1073741824], expected [2, 3]"),
])
def test_a_npy_that_does_not_fit_is_refused_from_its_header(tmp_path: Path,
                                                            shape: tuple[int, ...],
                                                            descr: str, words: str) -> None:
    path = tmp_path / "x.npy"
    path.write_bytes(_header(shape, descr) + b"\0" * 8)  # the data is not even there
    with pytest.raises(InputError) as raised:
        load_array(path, X)
    assert raised.value.message.startswith(words)


def test_a_big_endian_array_of_the_right_dtype_is_read(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.arange(6, dtype=">f4").reshape(2, 3))
    array = load_array(path, X)
    assert array.dtype == F32 and array.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_dynamic_dims_are_upper_bounds_and_scalars_take_their_kinds(tmp_path: Path) -> None:
    dynamic = ExpectedArray("input_0", "f32[<=4, 3]", (4, 3), at_most=True, dtype=F32)
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.zeros((3, 3), dtype=numpy.float32))
    assert load_array(path, dynamic).shape == (3, 3)
    numpy.save(path, numpy.zeros((5, 3), dtype=numpy.float32))
    with pytest.raises(InputError, match=r"dim 0 may be at most 4 \(f32\[<=4, 3\]\)"):
        load_array(path, dynamic)
    integer = ExpectedArray("input_1", "int", (), kinds="iu")
    numpy.save(path, numpy.int64(7))
    assert load_array(path, integer) == 7
    numpy.save(path, numpy.float64(7))
    with pytest.raises(InputError, match="input_1 must be a single int, got an array of "
                                         f"float64 from {path}"):
        load_array(path, integer)


# --------------------------------------------------------------------------- archives


def test_a_zip_bomb_of_the_wrong_shape_is_never_inflated(tmp_path: Path) -> None:
    """The issue's case, measured: a 256 MiB array in a ~256 KB archive."""
    bomb = tmp_path / "bomb.npz"
    inflated = _bomb(bomb, (16384, 4096))
    assert bomb.stat().st_size < inflated // 500
    code = textwrap.dedent(f"""
        import resource, time
        import numpy
        from exirc.errors import InputError
        from exirc.serialize.npy import load_arrays
        from exirc.serialize.npy_expected import ExpectedArray, ExpectedArrays
        x = ExpectedArray("input_0", "f32[2, 3]", (2, 3), dtype=numpy.dtype("float32"))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.process_time()  # CPU time: inflating 256 MiB would show
        try:
            load_arrays({str(bomb)!r}, ExpectedArrays("method 'forward'", [x]))
        except InputError as error:
            print(error.message)
        print(time.process_time() - start)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    message, seconds, grown_kib = done.stdout.splitlines()
    assert message == "input_0 has shape [16384, 4096], expected [2, 3] (f32[2, 3])", done.stderr
    assert float(seconds) < 1.0
    assert int(grown_kib) < 8 * 1024  # not 256 MiB


def test_every_header_is_checked_before_any_member_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    noise = numpy.random.default_rng(0).standard_normal((2, 4096)).astype(numpy.float32)
    expect = ExpectedArrays("method 'forward'", [
        ExpectedArray("input_0", "f32[2, 4096]", (2, 4096), dtype=F32),
        ExpectedArray("input_1", "f32[4]", (4,), dtype=F32)])
    _npz_with_garbage_data(path, "input_0", input_0=noise,
                           input_1=numpy.zeros((9, 9), dtype=numpy.float32))
    with pytest.raises(InputError) as raised:
        load_arrays(path, expect)
    # input_0's data is garbage, but input_1's header is what is reported.
    assert raised.value.message.startswith("input_1 has rank 2 (shape [9, 9]), expected rank 1")
    # With a fitting input_1, input_0's garbage is found, as a corrupt entry.
    _npz_with_garbage_data(path, "input_0", input_0=noise,
                           input_1=numpy.zeros(4, dtype=numpy.float32))
    with pytest.raises(InputError, match="member 'input_0.npy' .*corrupt or unsupported zip"):
        load_arrays(path, expect)


def test_the_archives_names_are_checked_before_anything_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    _bomb(path, (1024, 1024), key="x")
    with pytest.raises(InputError) as raised:
        load_arrays(path, ExpectedArrays("method 'forward'", [X]))
    assert raised.value.message == f"{path} has the keys x, but method 'forward' takes input_0"
    assert raised.value.hint == "save one array per input: numpy.savez(path, input_0=...)"


def test_inputs_that_fit_are_read(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    numpy.savez_compressed(path, input_0=numpy.ones((2, 3), dtype=numpy.float32))
    arrays = load_arrays(path, ExpectedArrays("method 'forward'", [X]))
    assert arrays["input_0"].tolist() == [[1, 1, 1], [1, 1, 1]]


# --------------------------------------------------------------------------- related dims


ROWS = ExpectedArrays(
    "method 'forward'",
    [ExpectedArray(f"input_{i}", "f32[s0<=16, 4]", (16, 4), at_most=True, dtype=F32,
                   symbol_dims=("s0", 4)) for i in range(2)],
    {"s0": SymbolRange(1, 16)})


def test_related_dims_are_checked_across_files_before_their_data(tmp_path: Path) -> None:
    first, second = tmp_path / "a.npy", tmp_path / "b.npy"
    numpy.save(first, numpy.zeros((3, 4), dtype=numpy.float32))
    second.write_bytes(_header((5, 4)) + bytes(80))
    with pytest.raises(InputError) as raised:
        load_array_files([first, second], ROWS)
    assert raised.value.message == (
        "input_1 dim 0 is 5, but must be s0 = 3 (bound by input_0 dim 0) "
        "(method 'forward': input_0: f32[s0<=16, 4], input_1: f32[s0<=16, 4])")
    assert raised.value.hint == ("inputs sharing a symbol must have related sizes, as when "
                                 "the program was exported")
    second.write_bytes(_header((3, 4)) + bytes(48))
    assert [a.shape for a in load_array_files([first, second], ROWS)] == [(3, 4), (3, 4)]


def test_the_count_of_files_is_checked_first(tmp_path: Path) -> None:
    first = tmp_path / "a.npy"
    numpy.save(first, numpy.zeros((3, 4), dtype=numpy.float32))
    with pytest.raises(InputError, match="method 'forward' takes 2 inputs, got 1"):
        load_array_files([first], ROWS)


# --------------------------------------------------------------------------- the command


def _peak_run(*args: str) -> tuple[list[str], int, int]:
    """(stderr lines, exit code, peak KiB) of `exirc ARGS`, measured from a wrapper
    process so that the peak is this run's alone."""
    exirc = str(Path(sys.executable).with_name("exirc"))
    code = textwrap.dedent(f"""
        import resource, subprocess, sys
        done = subprocess.run({[exirc, *args]!r}, capture_output=True, text=True, timeout=120)
        sys.stdout.write(done.stderr)
        print(done.returncode)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180)
    *err, returncode, peak = done.stdout.splitlines()
    return err, int(returncode), int(peak)


def test_exirc_run_refuses_a_zip_bomb_without_inflating_it(tmp_path: Path) -> None:
    program = tmp_path / "add.pte"
    program.write_bytes(serialize(add_constant_program()))
    good = tmp_path / "good.npz"
    numpy.savez_compressed(good, input_0=numpy.ones((2, 3), dtype=numpy.float32))
    bomb = tmp_path / "bomb.npz"
    inflated = _bomb(bomb, (16384, 4096))

    _, returncode, baseline = _peak_run("run", str(program), "-i", str(good))
    assert returncode == 0
    err, returncode, peak = _peak_run("run", str(program), "-i", str(bomb))
    assert err[0] == "error[E0201]: input_0 has shape [16384, 4096], expected [2, 3] (f32[2, 3])"
    assert returncode == 2
    assert (peak - baseline) * 1024 < inflated // 8  # torch's noise, not the 256 MiB
