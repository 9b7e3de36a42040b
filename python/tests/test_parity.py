import numpy as np
import pytest

import dyngrad as dg


@pytest.mark.parametrize("name", ["simplecnn", "lenet", "lenet5", "mlp"])
def test_sample_models_match_pytorch(torch, name, rng):
    dg.manual_seed(0)
    model = dg.models.make_model(name)
    twin = dg.parity.torch_twin(model)
    x = dg.tensor(rng.standard_normal((8, 1, 28, 28)).astype(np.float32))
    y = dg.tensor(rng.integers(0, 10, 8))
    report = dg.parity.compare(model, twin, (x, y))
    assert abs(report.loss_dyngrad - report.loss_torch) < 1e-5, str(report)
    assert report.max_grad_rel_err < 1e-4, str(report)
    assert set(report.grads) == {n for n, _ in model.named_parameters()}


@pytest.mark.usefixtures("cuda")
@pytest.mark.parametrize("name", ["simplecnn", "lenet"])
def test_sample_models_match_pytorch_on_gpu(torch, name, rng):
    dg.manual_seed(0)
    model = dg.models.make_model(name).to("cuda")
    twin = dg.parity.torch_twin(model).cuda()
    x = dg.tensor(rng.standard_normal((16, 1, 28, 28)).astype(np.float32), device="cuda")
    y = dg.tensor(rng.integers(0, 10, 16), device="cuda")
    report = dg.parity.compare(model, twin, (x, y))
    assert report.max_grad_rel_err < 1e-3, str(report)  # TF32 / cuDNN algorithm differences
