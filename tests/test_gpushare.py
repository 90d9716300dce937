"""The parts of the measurer's GPU clock (``gfsim.live.measure.gpushare``) that need no GPU: how the
clock reads a timed process's description of its outputs, how inputs are laid out in the
shared region, the pool's allocator (compiled and run here on host memory), and how the
measurer chooses its clock. The protocol itself runs on the H200
(docs/concepts/live-measurement.md)."""

import ctypes
import sys

import pytest

from gfsim.core.errors import GfsimError
from gfsim.live.measure import gpushare
from gfsim.live.measure.gpushare import SpecError, check_output_spec

POOL = 1 << 20


def spec(**kw):
    base = {"offset": 4096, "shape": [16, 32], "stride": [32, 1], "dtype": "float16"}
    return {**base, **kw}


def test_an_output_inside_the_pool_is_read_as_described():
    assert check_output_spec(spec(), POOL) == spec()
    # strided and transposed views are fine as long as every element is inside
    assert check_output_spec(spec(shape=[32, 16], stride=[1, 32]), POOL)["shape"] == [32, 16]
    assert check_output_spec(spec(shape=[0, 5], stride=[5, 1], offset=POOL), POOL)


@pytest.mark.parametrize("bad, words", [
    (spec(offset=-2), "not allocated by the call"),
    (spec(offset=POOL - 100), "not allocated by the call"),  # its end is past the pool
    (spec(offset=4097), "not allocated by the call"),  # not aligned to a float16
    (spec(dtype="complex64"), "dtype"),
    (spec(dtype=None), "dtype"),
    (spec(shape=[16, -1]), "malformed"),
    (spec(shape=[16, 2.0]), "malformed"),
    (spec(shape=[16], stride=[1, 1]), "malformed"),
    (spec(shape=[1] * 9, stride=[1] * 9), "malformed"),
    (spec(offset=True), "malformed"),
    (spec(shape=[1 << 41, 1]), "malformed"),
    ("not a dict", "not an object"),
])
def test_an_output_the_clock_will_not_read_is_refused_with_a_reason(bad, words):
    with pytest.raises(SpecError, match=words):
        check_output_spec(bad, POOL)


def test_inputs_are_packed_aligned_and_contiguous_after_the_signal_page():
    torch = pytest.importorskip("torch")
    a = torch.zeros(3, 5, dtype=torch.float16)
    b = torch.zeros(7, dtype=torch.int64)
    specs, end = gpushare.tensor_specs([a, b], start=gpushare.SIGNAL_BYTES)
    assert specs[0] == {"offset": gpushare.SIGNAL_BYTES, "shape": [3, 5], "stride": [5, 1],
                        "dtype": "float16"}
    assert specs[1]["offset"] % 256 == 0 and specs[1]["offset"] >= specs[0]["offset"] + 30
    assert specs[1]["dtype"] == "int64" and end == specs[1]["offset"] + 56


def test_a_host_tensor_is_not_an_output_the_clock_can_read():
    torch = pytest.importorskip("torch")
    with pytest.raises(SpecError, match="not a CUDA tensor"):
        gpushare.output_specs(torch.zeros(3), 0)
    with pytest.raises(SpecError, match="not a CUDA tensor"):
        gpushare.output_specs((torch.zeros(3), "x"), 0)


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    if gpushare._compiler() is None:
        pytest.skip("no C compiler")
    lib = ctypes.CDLL(str(gpushare.build_allocator(tmp_path_factory.mktemp("alloc"))))
    lib.gfsim_arena_alloc.restype = ctypes.c_void_p
    lib.gfsim_arena_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.gfsim_arena_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                     ctypes.c_void_p]
    lib.gfsim_arena_used.restype = ctypes.c_size_t
    buf = ctypes.create_string_buffer(1 << 20)
    base = ctypes.addressof(buf)

    def reset():
        lib.gfsim_arena_set(ctypes.c_void_p(base), ctypes.c_size_t(1 << 20))

    reset()
    return lib, base, reset, buf


def test_the_pool_allocator_hands_out_disjoint_aligned_blocks_inside_its_region(arena):
    lib, base, reset, _buf = arena
    reset()
    ptrs = [lib.gfsim_arena_alloc(100_000, 0, None) for _ in range(10)]
    assert all(p is not None for p in ptrs)
    assert all((p - base) % 4096 == 0 and base <= p and p + 100_000 <= base + (1 << 20)
               for p in ptrs)
    spans = sorted((p, p + 100_000) for p in ptrs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert lib.gfsim_arena_alloc(200_000, 0, None) is None  # 10 x 102,400 used of 1 MiB
    assert lib.gfsim_arena_alloc(-1, 0, None) is None


def test_freed_blocks_coalesce_so_the_whole_region_can_be_had_again(arena):
    lib, base, reset, _buf = arena
    reset()
    ptrs = [lib.gfsim_arena_alloc(100_000, 0, None) for _ in range(10)]
    for p in ptrs[::2] + ptrs[1::2]:  # every other first: neighbours merge both ways
        lib.gfsim_arena_free(p, 0, 0, None)
    assert lib.gfsim_arena_used() == 0
    whole = lib.gfsim_arena_alloc(1 << 20, 0, None)
    assert whole == base
    lib.gfsim_arena_free(whole, 0, 0, None)
    lib.gfsim_arena_free(whole, 0, 0, None)  # a double free changes nothing
    assert lib.gfsim_arena_used() == 0 and lib.gfsim_arena_alloc(1 << 20, 0, None) == base


def test_what_the_gpu_clock_lacks_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    assert "cuda-python" in gpushare.unavailable()
    monkeypatch.delitem(sys.modules, "cuda.bindings")
    monkeypatch.setattr(gpushare, "_compiler", lambda: None)
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return  # the first reason still applies here
    assert "C compiler" in gpushare.unavailable()


def test_without_a_gpu_the_measurer_keeps_its_wall_clock_and_says_why():
    pytest.importorskip("torch")
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    m = TritonMeasurer("softmax", MeasurerConfig(interpret=True))
    assert m.clock_mode() == "wall" and m.clock_note == "no GPU"
    m = TritonMeasurer("softmax", MeasurerConfig(interpret=True, clock="gpu"))
    with pytest.raises(GfsimError, match="clock 'gpu' cannot run here: no GPU"):
        m.clock_mode()
    m = TritonMeasurer("softmax", MeasurerConfig(interpret=True, clock="wall"))
    assert m.clock_mode() == "wall"


def test_closing_a_region_gives_back_its_descriptor_and_never_raises():
    import os

    fd = os.open(os.devnull, os.O_RDONLY)
    region = gpushare.Region(None, 0, 0, fd)
    region.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    region.close()  # twice is fine
    assert region.fd is None and region.handle is None
