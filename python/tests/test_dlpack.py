"""Zero-copy interop: DLPack both ways, NumPy views; the producer kept alive; bad inputs typed."""
import gc

import numpy as np
import pytest

import dyngrad as dg


def test_numpy_to_dyngrad_is_zero_copy(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = dg.from_numpy(a)
    assert t._data_ptr() == a.ctypes.data and dg._core._is_external(t)
    a[1, 2] = 99.0
    assert t[1, 2].item() == 99.0
    t.fill_(1.5)
    assert (a == 1.5).all()


def test_dyngrad_to_numpy_is_zero_copy(rng):
    t = dg.tensor(rng.standard_normal((2, 5)))
    b = np.from_dlpack(t)
    assert b.ctypes.data == t._data_ptr()
    b[0, 0] = -3.0
    assert t[0, 0].item() == -3.0


def test_producer_outlives_a_dropped_dyngrad_tensor(rng):
    t = dg.tensor(rng.standard_normal(1000))
    expected = t.numpy().copy()
    b = np.from_dlpack(t)
    del t
    gc.collect()
    dg.zeros(1000).fill_(7.0)  # reuse memory if it were freed
    np.testing.assert_array_equal(b, expected)


def test_numpy_array_kept_alive_by_dyngrad(rng):
    a = rng.standard_normal(500)
    expected = a.copy()
    t = dg.from_numpy(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), expected)


def test_gradients_flow_through_imported_tensors(rng):
    a = rng.standard_normal(4)
    x = dg.from_numpy(a)
    x.requires_grad = True
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a)


def test_torch_both_ways_zero_copy(torch, rng):
    tt = torch.randn(3, 4)
    t = dg.from_dlpack(tt)
    assert t._data_ptr() == tt.data_ptr()
    tt[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    back = torch.from_dlpack(t)
    assert back.data_ptr() == tt.data_ptr()
    d = dg.tensor(rng.standard_normal((2, 2)))
    td = torch.from_dlpack(d)
    td.mul_(2.0)
    np.testing.assert_allclose(d.numpy(), td.numpy())


def test_torch_keeps_a_dropped_dyngrad_tensor_alive(torch, rng):
    d = dg.tensor(rng.standard_normal(2048).astype(np.float32))
    expected = d.numpy().copy()
    td = torch.from_dlpack(d)
    del d
    gc.collect()
    for _ in range(4):
        dg.ones(2048)  # would reuse the block if it had been freed
    np.testing.assert_array_equal(td.numpy(), expected)


def test_non_contiguous_is_refused(torch):
    with pytest.raises(dg.ValueError, match="non-contiguous"):
        dg.from_dlpack(torch.randn(4, 5).t())
    with pytest.raises(dg.ValueError, match="non-contiguous"):
        dg.from_dlpack(np.zeros((4, 6))[:, ::2])


def test_unsupported_dtype_is_a_dtype_error():
    with pytest.raises(dg.DTypeError):
        dg.from_dlpack(np.zeros(3, dtype=np.int32))
    with pytest.raises(dg.DTypeError):
        dg.from_dlpack(np.zeros(3, dtype=np.float16))
    with pytest.raises(TypeError):  # DTypeError is a TypeError too
        dg.from_dlpack(np.zeros(3, dtype=np.uint8))


def test_non_dlpack_objects_are_type_errors():
    with pytest.raises(TypeError):
        dg.from_dlpack([1, 2, 3])
    with pytest.raises(TypeError):
        dg.from_dlpack("tensor")
    with pytest.raises(TypeError):
        dg.from_numpy([1.0])


def test_consumed_capsule_is_refused():
    capsule = np.zeros(3).__dlpack__()
    dg.from_dlpack(capsule)
    with pytest.raises(dg.ValueError, match="already consumed"):
        dg.from_dlpack(capsule)


def test_dlpack_device_and_stream_arguments(rng):
    t = dg.tensor(rng.standard_normal(3))
    assert t.__dlpack_device__() == (1, 0)
    capsule = t.__dlpack__(stream=None)
    assert type(capsule).__name__ == "PyCapsule"
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))


@pytest.mark.usefixtures("cuda")
def test_cuda_torch_roundtrip_zero_copy_and_streams(torch):
    tt = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        tt.mul_(2.0)  # pending on PyTorch's side stream
        t = dg.from_dlpack(tt)  # dyngrad's stream waits for it (DLPack stream argument)
    assert t._data_ptr() == tt.data_ptr() and str(t.device) == "cuda:0"
    total = (t * 1.0).sum().item()  # dyngrad's stream saw the side stream's multiply
    torch.cuda.synchronize()
    assert total == pytest.approx(float(tt.sum()), rel=1e-4)
    y = t * 3.0  # queued on dyngrad's stream
    ty = torch.from_dlpack(y)  # PyTorch's current stream waits for dyngrad's
    assert ty.data_ptr() == y._data_ptr()
    torch.testing.assert_close(ty, tt * 3.0)


@pytest.mark.usefixtures("cuda")
def test_cuda_tensor_dropped_while_torch_holds_it(torch):
    d = dg.randn(4096, device="cuda")
    expected = d.cpu().numpy().copy()
    td = torch.from_dlpack(d)
    del d
    gc.collect()
    for _ in range(8):
        dg.ones(4096, device="cuda")
    np.testing.assert_array_equal(td.cpu().numpy(), expected)


def test_cuda_on_a_cpu_build_is_a_device_error():
    if dg.cuda_is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(dg.DeviceError):
        dg.zeros(3, device="cuda")
    with pytest.raises(dg.DeviceError):
        dg.tensor([1.0]).to("cuda")
