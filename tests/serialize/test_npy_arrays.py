"""Tests for exirc.serialize.npy: round trips, and every hostile file we can craft."""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import stat
import struct
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import numpy.lib.format
import pytest

from exirc.errors import InputError, UsageError
from exirc.serialize import npy as arrays
from exirc.serialize.npy import load_array, load_arrays, save_arrays

MAGIC = b"\x93NUMPY"
GIB = 1 << 30


# --------------------------------------------------------------------------- helpers


def header_text(descr: str, shape: Any, fortran: Any = False) -> str:
    return f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, }}\n"


def npy_bytes(header: str, data: bytes = b"", version: tuple[int, int] = (1, 0)) -> bytes:
    """A .npy file with an arbitrary (possibly lying) header."""
    raw = header.encode("utf-8" if version == (3, 0) else "latin-1")
    length = struct.pack("<H" if version == (1, 0) else "<I", len(raw))
    return MAGIC + bytes(version) + length + raw + data


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def write_zip(
    path: Path,
    members: list[tuple[str, bytes]],
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, content in members:
            archive.writestr(name, content)
    return path


def patch_central_sizes(
    path: Path, *, file_size: int | None = None, flag: int | None = None
) -> None:
    """Rewrite the first member's uncompressed size and/or flag bits, as an attacker would."""
    blob = bytearray(path.read_bytes())
    local = 0
    central = blob.index(b"PK\x01\x02")
    if file_size is not None:
        struct.pack_into("<I", blob, local + 22, file_size)
        struct.pack_into("<I", blob, central + 24, file_size)
    if flag is not None:
        struct.pack_into("<H", blob, local + 6, flag)
        struct.pack_into("<H", blob, central + 8, flag)
    path.write_bytes(bytes(blob))


def expect_error(fn: Callable[[], object], *words: str) -> InputError:
    with pytest.raises(InputError) as info:
        fn()
    error = info.value
    for word in words:
        assert word in error.message, f"{word!r} not in {error.message!r}"
    assert error.hint, "every InputError must say what to do"
    assert error.exit_code == 2
    return error


def peak_allocation(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    except InputError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def assert_same(loaded: numpy.ndarray[Any, Any], original: numpy.ndarray[Any, Any]) -> None:
    assert loaded.shape == original.shape
    assert loaded.dtype == original.dtype.newbyteorder("=")
    assert loaded.dtype.isnative
    assert loaded.flags.c_contiguous
    assert loaded.flags.writeable
    numpy.testing.assert_array_equal(loaded, original)


# --------------------------------------------------------------------------- round trips

rng = numpy.random.default_rng(0)

SAMPLES: dict[str, numpy.ndarray[Any, Any]] = {
    "float32_2d": rng.standard_normal((2, 3)).astype(numpy.float32),
    "float64_0d": numpy.array(3.25),
    "int32_0d": numpy.array(-7, dtype=numpy.int32),
    "int64": numpy.arange(-5, 7, dtype=numpy.int64).reshape(3, 4),
    "int64_extremes": numpy.array([numpy.iinfo(numpy.int64).min, numpy.iinfo(numpy.int64).max]),
    "float16_3d": rng.standard_normal((2, 2, 2)).astype(numpy.float16),
    "bool": numpy.array([True, False, True, True]),
    "uint8": numpy.arange(256, dtype=numpy.uint8),
    "int8_empty": numpy.zeros((5, 0, 2), dtype=numpy.int8),
    "uint64": numpy.array([0, 2**64 - 1], dtype=numpy.uint64),
    "fortran_float64": numpy.asfortranarray(rng.standard_normal((3, 4))),
    "fortran_int16_3d": numpy.asfortranarray(numpy.arange(24, dtype=numpy.int16).reshape(2, 3, 4)),
    "big_endian_float32": numpy.arange(6, dtype=">f4").reshape(2, 3),
    "big_endian_int64": numpy.array([1, -2, 2**40], dtype=">i8"),
    "big_endian_0d": numpy.array(1.5, dtype=">f8"),
    "big_endian_fortran": numpy.asfortranarray(numpy.arange(12, dtype=">i4").reshape(3, 4)),
    "big_endian_float16": numpy.array([0.5, -2.0], dtype=">f2"),
}


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_npy_round_trip(tmp_path: Path, key: str) -> None:
    original = SAMPLES[key]
    path = tmp_path / f"{key}.npy"
    numpy.save(path, original)
    if original.ndim > 1 and original.flags.f_contiguous and not original.flags.c_contiguous:
        assert b"'fortran_order': True" in path.read_bytes()[:128]
    assert_same(load_array(path), original)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(tmp_path: Path, version: tuple[int, int]) -> None:
    original = numpy.arange(10, dtype=numpy.float32).reshape(2, 5)
    buffer = io.BytesIO()
    numpy.lib.format.write_array(buffer, original, version=version)
    path = write(tmp_path / "x.npy", buffer.getvalue())
    assert_same(load_array(str(path)), original)


def test_native_c_array_is_read_without_a_second_copy(tmp_path: Path) -> None:
    # A native C-ordered array should cost its own size once, not buffer plus copy.
    original = numpy.ones((1024, 2048), dtype=numpy.float32)  # 8 MiB
    numpy.save(tmp_path / "x.npy", original)
    peak = peak_allocation(lambda: load_array(tmp_path / "x.npy"))
    assert original.nbytes <= peak < original.nbytes * 1.25


def test_npz_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "io.npz"
    save_arrays(path, SAMPLES)
    loaded = load_arrays(path)
    assert list(loaded) == list(SAMPLES)  # archive order kept
    for key, original in SAMPLES.items():
        assert_same(loaded[key], original)
    # The archive is an ordinary .npz that numpy itself reads.
    with numpy.load(path) as theirs:
        assert sorted(theirs.files) == sorted(SAMPLES)
        numpy.testing.assert_array_equal(theirs["bool"], SAMPLES["bool"])


def test_npz_written_by_numpy(tmp_path: Path) -> None:
    a = numpy.arange(6, dtype=numpy.int64).reshape(2, 3)
    b = numpy.asfortranarray(numpy.linspace(0, 1, 12, dtype=numpy.float32).reshape(3, 4))
    numpy.savez(tmp_path / "plain.npz", a=a, b=b)
    numpy.savez_compressed(tmp_path / "small.npz", a=a, b=b)
    for name in ("plain.npz", "small.npz"):
        loaded = load_arrays(tmp_path / name)
        assert list(loaded) == ["a", "b"]
        assert_same(loaded["a"], a)
        assert_same(loaded["b"], b)


def test_empty_npz(tmp_path: Path) -> None:
    save_arrays(tmp_path / "none.npz", {})
    assert load_arrays(tmp_path / "none.npz") == {}


def test_save_keys_that_would_collide_with_savez_parameters(tmp_path: Path) -> None:
    data: dict[str, numpy.ndarray[Any, Any]] = {
        "file": numpy.zeros(2),
        "allow_pickle": numpy.ones(3, dtype=numpy.int8),
    }
    save_arrays(tmp_path / "k.npz", data)
    loaded = load_arrays(tmp_path / "k.npz")
    assert list(loaded) == ["file", "allow_pickle"]
    assert_same(loaded["allow_pickle"], data["allow_pickle"])


def test_save_uses_the_path_as_given_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    save_arrays(path, {"x": numpy.zeros(1)})
    save_arrays(path, {"y": numpy.ones(2)})
    assert list(load_arrays(path)) == ["y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_saved_file_gets_the_usual_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        save_arrays(tmp_path / "out.npz", {"x": numpy.zeros(1)})
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "out.npz").stat().st_mode) == 0o644


# ----------------------------------------------------------------------- missing files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.npy"
    expect_error(lambda: load_array(path), "nope.npy", "no such file")
    expect_error(lambda: load_arrays(tmp_path / "nope.npz"), "nope.npz", "no such file")


def test_directory(tmp_path: Path) -> None:
    (tmp_path / "d.npy").mkdir()
    expect_error(lambda: load_array(tmp_path / "d.npy"), "d.npy", "directory")
    expect_error(lambda: load_arrays(tmp_path / "d.npy"), "d.npy", "directory")


def test_unreadable_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.zeros(2))

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("exirc.serialize.npy.os.open", refuse)
    expect_error(lambda: load_array(path), "x.npy", "permission denied")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.zeros(2))
    path.chmod(0)
    expect_error(lambda: load_array(path), "x.npy", "permission denied")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    path = tmp_path / "pipe.npy"
    os.mkfifo(path)
    expect_error(lambda: load_array(path), "pipe.npy", "not a regular file")


# --------------------------------------------------------------------------- hostile .npy files


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path / "e.npy", b"")
    expect_error(lambda: load_array(path), "e.npy", "empty")


def test_bad_magic(tmp_path: Path) -> None:
    path = write(tmp_path / "text.npy", b"1,2,3\n4,5,6\n")
    expect_error(lambda: load_array(path), "text.npy", "not a .npy file", "magic")


def test_npz_given_as_npy(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    save_arrays(path, {"x": numpy.zeros(2)})
    expect_error(lambda: load_array(path), "a.npy", "is a .npz (zip) archive")


def test_truncated_inside_magic(tmp_path: Path) -> None:
    path = write(tmp_path / "t.npy", MAGIC + b"\x01")
    expect_error(lambda: load_array(path), "t.npy", "truncated")


def test_truncated_header(tmp_path: Path) -> None:
    full = npy_bytes(header_text("<f4", (2,)), b"\0" * 8)
    path = write(tmp_path / "t.npy", full[:20])
    expect_error(lambda: load_array(path), "t.npy", "truncated", "header")


def test_truncated_data(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    numpy.save(path, numpy.arange(100, dtype=numpy.float64))
    path.write_bytes(path.read_bytes()[:-8])
    expect_error(lambda: load_array(path), "t.npy", "truncated", "shape (100,)", "792 bytes")


def test_trailing_data(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    numpy.save(path, numpy.arange(4, dtype=numpy.int32))
    path.write_bytes(path.read_bytes() + b"junk")
    expect_error(lambda: load_array(path), "t.npy", "4 bytes of unexpected data", "shape (4,)")


def test_unsupported_version(tmp_path: Path) -> None:
    path = write(tmp_path / "v.npy", npy_bytes(header_text("<f4", (1,)), b"\0" * 4, (4, 0)))
    expect_error(lambda: load_array(path), "v.npy", "version 4.0")


def test_header_too_long(tmp_path: Path) -> None:
    content = MAGIC + bytes((2, 0)) + struct.pack("<I", 2**31) + b"{"
    path = write(tmp_path / "h.npy", content)
    peak = peak_allocation(lambda: load_array(path))
    expect_error(lambda: load_array(path), "h.npy", "header", str(arrays.MAX_HEADER_SIZE))
    assert peak < 1 << 20


@pytest.mark.parametrize(
    "header",
    [
        "not a dict at all",
        "[1, 2, 3]",
        "{'descr': '<f4', 'shape': (1,)}",  # missing key
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), '__import__': os}",
        "__import__('os').system('echo pwned')",
        "(" * 5000 + ")" * 5000,
        "{'shape': " + "9" * 5000 + "}",
    ],
)
def test_malformed_header(tmp_path: Path, header: str) -> None:
    path = write(tmp_path / "m.npy", npy_bytes(header, b"\0" * 4))
    error = expect_error(lambda: load_array(path), "m.npy", "malformed .npy header")
    assert len(error.message) < 300  # header content is clipped, not echoed in full


def test_undecodable_header(tmp_path: Path) -> None:
    raw = MAGIC + bytes((3, 0)) + struct.pack("<I", 4) + b"\xff\xfe\xfd\n"
    path = write(tmp_path / "u.npy", raw)
    expect_error(lambda: load_array(path), "u.npy", "malformed")


class _Canary:
    """Unpickling this records that code ran: the loader must never let that happen."""

    calls: list[str] = []

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return (_Canary.calls.append, ("unpickled!",))


def test_object_dtype_is_never_unpickled(tmp_path: Path) -> None:
    payload = numpy.empty(1, dtype=object)
    payload[0] = _Canary()
    path = tmp_path / "evil.npy"
    numpy.save(path, payload, allow_pickle=True)
    _Canary.calls.clear()
    expect_error(lambda: load_array(path), "evil.npy", "object", "pickle")
    assert _Canary.calls == []


def test_object_dtype_with_lying_shape(tmp_path: Path) -> None:
    data = pickle.dumps([1, 2])
    path = write(tmp_path / "o.npy", npy_bytes(header_text("O", (2,)), data))
    expect_error(lambda: load_array(path), "o.npy", "object")


def test_structured_dtype(tmp_path: Path) -> None:
    path = tmp_path / "s.npy"
    numpy.save(path, numpy.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
    expect_error(lambda: load_array(path), "s.npy", "dtype", "structured")


def test_structured_dtype_with_object_field(tmp_path: Path) -> None:
    header = "{'descr': [('a', '|O')], 'fortran_order': False, 'shape': (1,), }"
    path = write(tmp_path / "s.npy", npy_bytes(header, b"\0" * 8))
    expect_error(lambda: load_array(path), "s.npy", "dtype", "structured")


@pytest.mark.parametrize(
    ("descr", "data"),
    [
        ("<U3", b"\0" * 12),  # str
        ("|S4", b"\0" * 4),  # bytes
        ("<M8[s]", b"\0" * 8),  # datetime
        ("<m8[s]", b"\0" * 8),  # timedelta
        ("|V4", b"\0" * 4),  # raw void
        ("<c8", b"\0" * 8),  # complex: no program tensor has it
        ("(2,)<i4", b"\0" * 8),  # subarray dtype
        ("i4,i4", b"\0" * 8),  # structured, spelled as a string
    ],
)
def test_unsupported_dtypes(tmp_path: Path, descr: str, data: bytes) -> None:
    path = write(tmp_path / "d.npy", npy_bytes(header_text(descr, (1,)), data))
    expect_error(lambda: load_array(path), "d.npy", "dtype", "not supported")


@pytest.mark.parametrize("descr", ["zz", "<f3", "", "(99999999999999999999,)i4", "<f4" * 100])
def test_unknown_dtypes(tmp_path: Path, descr: str) -> None:
    path = write(tmp_path / "d.npy", npy_bytes(header_text(descr, (1,)), b"\0" * 4))
    expect_error(lambda: load_array(path), "d.npy", "unknown dtype")


def test_dtype_not_a_string(tmp_path: Path) -> None:
    header = "{'descr': 4, 'fortran_order': False, 'shape': (1,), }"
    path = write(tmp_path / "d.npy", npy_bytes(header, b"\0" * 4))
    expect_error(lambda: load_array(path), "d.npy", "bad dtype")


@pytest.mark.parametrize(
    "shape", [(-1,), (2, -3), [2, 3], (2.0,), (True,), ("2",), 4, None, ((2,),)]
)
def test_bad_shapes(tmp_path: Path, shape: Any) -> None:
    path = write(tmp_path / "b.npy", npy_bytes(header_text("<i4", shape), b"\0" * 24))
    expect_error(lambda: load_array(path), "b.npy", "shape", "non-negative integers")


@pytest.mark.parametrize("shape", [(0,) * 100, (1,) * 100, (0, 2**62, 2**62)])
def test_unbuildable_shapes(tmp_path: Path, shape: tuple[int, ...]) -> None:
    # The byte count matches the data (none, or one element), so the shape
    # itself must be refused.
    data = b"\0" * 4 * math.prod(shape)
    path = write(tmp_path / "z.npy", npy_bytes(header_text("<f4", shape), data))
    expect_error(lambda: load_array(path), "z.npy", "shape", "cannot be built")


@pytest.mark.parametrize(
    "shape",
    [
        (2**40, 2**40, 2**40),  # the element count overflows int64; Python ints do not
        (0, 2**70),  # empty, but no dimension can be that long
        (10**4000, 10**4000),  # too many digits even to print the byte count
    ],
)
def test_impossibly_large_shapes(tmp_path: Path, shape: tuple[int, ...]) -> None:
    path = write(tmp_path / "o.npy", npy_bytes(header_text("<f8", shape), b"\0" * 8))
    peak = peak_allocation(lambda: load_array(path))
    assert peak < 2 << 20
    error = expect_error(lambda: load_array(path), "o.npy", "shape", "too large")
    assert len(error.message) < 300


def test_bad_fortran_order(tmp_path: Path) -> None:
    path = write(tmp_path / "f.npy", npy_bytes(header_text("<f4", (1,), fortran=1), b"\0" * 4))
    expect_error(lambda: load_array(path), "f.npy", "fortran_order")


@pytest.mark.parametrize("version", [(1, 0), (3, 0)])
def test_huge_header_on_small_file_fails_fast_without_allocating(
    tmp_path: Path, version: tuple[int, int]
) -> None:
    # 100000 x 100000 float32 = 40 GB claimed; 16 bytes present.
    path = write(
        tmp_path / "huge.npy",
        npy_bytes(header_text("<f4", (100_000, 100_000)), b"\0" * 16, version),
    )
    peak = peak_allocation(lambda: load_array(path))
    assert peak < 2 << 20, f"peak allocation {peak} bytes"
    expect_error(lambda: load_array(path), "huge.npy", "truncated", "shape (100000, 100000)", "GiB")


# --------------------------------------------------------------------------- hostile .npz files


def member(array: numpy.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    numpy.lib.format.write_array(buffer, array)
    return buffer.getvalue()


def test_npz_not_a_zip(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.npz", b"this is not a zip file at all" * 3)
    expect_error(lambda: load_arrays(path), "bad.npz", "not a valid .npz")


def test_npz_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path / "e.npz", b"")
    expect_error(lambda: load_arrays(path), "e.npz", "empty")


def test_npz_given_a_npy(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.zeros(3))
    expect_error(lambda: load_arrays(path), "x.npy", ".npy file, not a .npz")


def test_npz_truncated_archive(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    save_arrays(path, {"x": numpy.arange(1000, dtype=numpy.float64)})
    path.write_bytes(path.read_bytes()[:-30])
    expect_error(lambda: load_arrays(path), "t.npz", "not a valid .npz")


def test_npz_corrupt_compressed_data(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    numpy.savez_compressed(path, x=numpy.arange(10_000, dtype=numpy.int64))
    blob = bytearray(path.read_bytes())
    start = blob.index(b"x.npy") + len("x.npy") + 200  # well inside the deflate stream
    for i in range(start, start + 64):
        blob[i] ^= 0x5A
    path.write_bytes(bytes(blob))
    expect_error(lambda: load_arrays(path), "c.npz", "'x.npy'", "key 'x'")


def test_npz_bad_crc(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    save_arrays(path, {"x": numpy.zeros(64, dtype=numpy.uint8)})
    blob = bytearray(path.read_bytes())
    data_at = blob.rindex(b"\0" * 64)  # the stored member's data
    blob[data_at] = 1
    path.write_bytes(bytes(blob))
    expect_error(lambda: load_arrays(path), "c.npz", "corrupt", "CRC")


def test_npz_member_header_disagrees_with_zip_size(tmp_path: Path) -> None:
    # The member's .npy header claims 40 GB; the zip directory says the entry is tiny.
    lying = npy_bytes(header_text("<f4", (100_000, 100_000)), b"\0" * 16)
    path = write_zip(tmp_path / "lie.npz", [("ok.npy", member(numpy.zeros(2))), ("x.npy", lying)])
    peak = peak_allocation(lambda: load_arrays(path))
    assert peak < 2 << 20, f"peak allocation {peak} bytes"
    expect_error(
        lambda: load_arrays(path), "lie.npz", "'x.npy'", "key 'x'", "declares", "shape", "GiB"
    )


def test_npz_member_header_smaller_than_zip_size(tmp_path: Path) -> None:
    content = npy_bytes(header_text("<f4", (2,)), b"\0" * 8 + b"extra bytes")
    path = write_zip(tmp_path / "lie.npz", [("x.npy", content)])
    expect_error(lambda: load_arrays(path), "lie.npz", "declares", "shape (2,)")


def test_npz_declared_size_agrees_but_data_is_not_there(tmp_path: Path) -> None:
    # A bomb-shaped claim: header and zip directory both say 1 GB, the deflate
    # stream holds a few bytes. Reading must stop at the real end of data.
    content = npy_bytes(header_text("|u1", (1000, 1000, 1000)), b"\0" * 32)
    path = write_zip(tmp_path / "bomb.npz", [("x.npy", content)], zipfile.ZIP_DEFLATED)
    header_size = len(content) - 32
    patch_central_sizes(path, file_size=header_size + 1000**3)
    peak = peak_allocation(lambda: load_arrays(path))
    assert peak < 4 << 20, f"peak allocation {peak} bytes"
    expect_error(lambda: load_arrays(path), "bomb.npz", "'x.npy'", "truncated", "shape")


def test_npz_stored_member_with_inconsistent_sizes(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "s.npz", [("x.npy", member(numpy.zeros(4)))])
    patch_central_sizes(path, file_size=10**9)
    expect_error(lambda: load_arrays(path), "s.npz", "'x.npy'", "sizes disagree")


def test_npz_encrypted_member(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "e.npz", [("x.npy", member(numpy.zeros(4)))])
    patch_central_sizes(path, flag=0x1)
    expect_error(lambda: load_arrays(path), "e.npz", "'x.npy'", "encrypted")


def test_npz_unsupported_compression(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "b.npz", [("x.npy", member(numpy.zeros(4)))], zipfile.ZIP_BZIP2)
    expect_error(lambda: load_arrays(path), "b.npz", "'x.npy'", "compression method")


def test_npz_from_a_future_zip_version(tmp_path: Path) -> None:
    # zipfile raises NotImplementedError here; it must still become an InputError.
    path = write_zip(tmp_path / "v.npz", [("x.npy", member(numpy.zeros(4)))])
    blob = bytearray(path.read_bytes())
    struct.pack_into("<H", blob, blob.index(b"PK\x01\x02") + 6, 0xFF)  # "needs version 25.5"
    path.write_bytes(bytes(blob))
    expect_error(lambda: load_arrays(path), "v.npz", "not a valid .npz", "version")


@pytest.mark.parametrize("base", ["stored.npz", "deflated.npz", "big_endian.npy"])
def test_mutated_files_raise_only_input_error(tmp_path: Path, base: str) -> None:
    """Random corruption may load or be refused, but must never escape as another error."""
    a = numpy.arange(50, dtype=numpy.float32)
    if base == "stored.npz":
        save_arrays(tmp_path / base, {"a": a, "b": numpy.ones((3, 3), dtype=bool)})
    elif base == "deflated.npz":
        numpy.savez_compressed(tmp_path / base, a=a)
    else:
        numpy.save(tmp_path / base, numpy.arange(20, dtype=">f8").reshape(4, 5))
    load = load_arrays if base.endswith(".npz") else load_array
    blob = (tmp_path / base).read_bytes()
    rng = numpy.random.default_rng(1234)
    target = tmp_path / ("mutant" + Path(base).suffix)
    for _ in range(400):
        mutant = bytearray(blob)
        if rng.random() < 0.7:
            for at in rng.integers(0, len(mutant), size=int(rng.integers(1, 5))):
                mutant[at] = int(rng.integers(0, 256))
        else:
            del mutant[int(rng.integers(0, len(mutant))) :]
        target.write_bytes(bytes(mutant))
        with contextlib.suppress(InputError):
            load(target)


def test_npz_member_with_object_dtype(tmp_path: Path) -> None:
    payload = numpy.empty(1, dtype=object)
    payload[0] = _Canary()
    buffer = io.BytesIO()
    numpy.lib.format.write_array(buffer, payload, allow_pickle=True)
    path = write_zip(tmp_path / "evil.npz", [("x.npy", buffer.getvalue())])
    _Canary.calls.clear()
    expect_error(lambda: load_arrays(path), "evil.npz", "'x.npy'", "object", "pickle")
    assert _Canary.calls == []


def test_npz_member_bad_magic(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "m.npz", [("x.npy", b"hello world")])
    expect_error(lambda: load_arrays(path), "m.npz", "'x.npy'", "magic")


def test_npz_member_not_npy(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "r.npz", [("README.txt", b"hello")])
    expect_error(lambda: load_arrays(path), "r.npz", "'README.txt'", "not a .npy")


def test_npz_directory_member(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "r.npz", [("dir.npy/", b"")])
    expect_error(lambda: load_arrays(path), "r.npz", "'dir.npy/'", "not a .npy")


def test_npz_duplicate_key(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="Duplicate name"):
        path = write_zip(
            tmp_path / "d.npz",
            [("x.npy", member(numpy.zeros(1))), ("x.npy", member(numpy.ones(1)))],
        )
    expect_error(lambda: load_arrays(path), "d.npz", "'x'", "twice")


def test_npz_too_many_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "MAX_MEMBERS", 3)
    path = write_zip(tmp_path / "m.npz", [(f"a{i}.npy", member(numpy.zeros(1))) for i in range(4)])
    expect_error(lambda: load_arrays(path), "m.npz", "4 members", "3 allowed")


def test_default_member_limit_is_enforced(tmp_path: Path) -> None:
    count = arrays.MAX_MEMBERS + 1
    path = write_zip(tmp_path / "m.npz", [(f"a{i}.npy", b"") for i in range(count)])
    expect_error(lambda: load_arrays(path), "m.npz", f"{count} members")


# --------------------------------------------------------------------------- atomic save


def _fail_on_second_member(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[str]:
    real = numpy.lib.format.write_array
    calls: list[str] = []

    def flaky(fp: Any, array: Any, *args: Any, **kwargs: Any) -> None:
        calls.append("write")
        if len(calls) == 2:
            raise error
        real(fp, array, *args, **kwargs)

    monkeypatch.setattr(numpy.lib.format, "write_array", flaky)
    return calls


def test_failed_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fail_on_second_member(monkeypatch, OSError(28, "No space left on device"))
    path = tmp_path / "out.npz"
    with pytest.raises(UsageError) as info:
        save_arrays(path, {"a": numpy.zeros(1000), "b": numpy.ones(1000)})
    assert len(calls) == 2  # the failure really happened mid-write
    assert "out.npz" in info.value.message and "No space left" in info.value.message
    assert info.value.hint
    assert list(tmp_path.iterdir()) == []  # no output, no temporary left behind


def test_interrupted_save_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.npz"
    save_arrays(path, {"old": numpy.arange(3)})
    before = path.read_bytes()
    _fail_on_second_member(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save_arrays(path, {"a": numpy.zeros(10), "b": numpy.ones(10)})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_failed_replace_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied", dst)

    monkeypatch.setattr("exirc.serialize.npy.os.replace", refuse)
    with pytest.raises(UsageError, match="permission|Permission"):
        save_arrays(tmp_path / "out.npz", {"a": numpy.zeros(1)})
    assert list(tmp_path.iterdir()) == []


def test_save_into_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "out.npz"
    with pytest.raises(UsageError) as info:
        save_arrays(path, {"a": numpy.zeros(1)})
    assert "out.npz" in info.value.message and "cannot write" in info.value.message


def test_save_refuses_what_load_would_refuse(tmp_path: Path) -> None:
    path = tmp_path / "out.npz"
    with pytest.raises(ValueError, match="object"):
        save_arrays(path, {"ok": numpy.zeros(1), "bad": numpy.array([None], dtype=object)})
    with pytest.raises(ValueError, match="<U1|str"):
        save_arrays(path, {"s": numpy.array(["a"])})
    with pytest.raises(TypeError, match="ndarray"):
        save_arrays(path, {"x": [1, 2, 3]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="str"):
        save_arrays(path, {1: numpy.zeros(1)})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []
