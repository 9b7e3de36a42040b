import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from dyngrad import nn


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8, activation="relu")
        self.fc2 = nn.Linear(8, 1)
        self.scale = nn.Parameter(dg.ones(1))
        self.register_buffer("steps", dg.zeros(1))
        self.not_a_param = 3

    def forward(self, x):
        return self.fc2(self.fc1(x)) * self.scale


def test_registration_by_assignment():
    m = TwoLayer()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert list(m.state_dict()) == names + ["steps"]
    assert m.fc1.weight.name == "fc1.weight"
    assert len(m.parameters()) == 5 and m.not_a_param == 3
    m.eval()
    assert not m.fc1.training
    m.train()
    assert m.fc2.training


def test_training_regression_converges(rng):
    dg.manual_seed(3)
    m = TwoLayer()
    x = dg.tensor(rng.standard_normal((64, 4)).astype(np.float32))
    y = dg.tensor((rng.standard_normal((64, 4)) @ np.ones((4, 1))).astype(np.float32) * 0 + 0.5)
    opt = dg.optim.Adam(m.parameters(), lr=1e-2)
    first = None
    for _ in range(200):
        loss = F.mse_loss(m(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first * 0.05


def test_sgd_groups_and_schedules():
    m = TwoLayer()
    opt = dg.optim.SGD([{"params": m.fc1.parameters(), "lr": 0.5}, {"params": m.fc2.parameters()}], lr=0.1,
                       momentum=0.9)
    assert opt.group_count == 2 and opt.group_lr(0) == 0.5 and opt.group_lr(1) == 0.1
    sched = dg.optim.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    assert opt.group_lr(0) == 0.25 and sched.get_last_lr() == [0.25, 0.05]


def test_state_dict_roundtrip_through_safetensors(tmp_path):
    a, b = TwoLayer(), TwoLayer()
    path = tmp_path / "model.safetensors"
    a.save(path)
    b.load(path)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)


def test_load_state_dict_checks_before_writing():
    m = TwoLayer()
    before = m.fc1.weight.numpy().copy()
    bad = dict(m.state_dict())
    bad["fc1.weight"] = dg.zeros(3, 3)
    bad["fc2.bias"] = dg.zeros(1)
    with pytest.raises(dg.ShapeError, match="fc1.weight"):
        m.load_state_dict(bad)
    np.testing.assert_array_equal(m.fc1.weight.numpy(), before)
    del bad["fc1.weight"]
    with pytest.raises(dg.ValueError, match="missing"):
        m.load_state_dict(bad)


def test_checkpoint_restores_optimizer(tmp_path, rng):
    m = TwoLayer()
    opt = dg.optim.Adam(m.parameters(), lr=1e-2)
    x = dg.tensor(rng.standard_normal((8, 4)).astype(np.float32))
    for _ in range(3):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
    dg.save_checkpoint(tmp_path / "ck.safetensors", m, opt)
    m2 = TwoLayer()
    opt2 = dg.optim.Adam(m2.parameters(), lr=1e-2)
    dg.load_checkpoint(tmp_path / "ck.safetensors", m2, opt2)
    assert opt2.step_count(0) == 3
    np.testing.assert_array_equal(m2.fc1.weight.numpy(), m.fc1.weight.numpy())


def test_layers_forward_shapes(rng):
    x = dg.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    seq = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Dropout(0.2), nn.Linear(64, 5), nn.LayerNorm(5), nn.GELU(), nn.SiLU(), nn.Tanh(), nn.Sigmoid())
    assert seq(x).shape == (2, 5)
    assert seq[1].running_mean.numpy().any()  # the forward in training mode updated the running mean
    assert nn.Embedding(10, 3)(dg.tensor([1, 2, 2])).shape == (3, 3)
    assert nn.RMSNorm(5)(dg.tensor(rng.standard_normal((2, 5)).astype(np.float32))).shape == (2, 5)


def test_sample_models_names_and_shapes(rng):
    x = dg.tensor(rng.standard_normal((2, 1, 28, 28)).astype(np.float32))
    for name in ["simplecnn", "lenet", "lenet5", "mlp"]:
        model = dg.models.make_model(name)
        assert model(x).shape == (2, 10), name
    assert [n for n, _ in dg.models.LeNet5().named_parameters()][:3] == ["0.weight", "0.bias", "3.weight"]


def test_data_loader_epochs_cover_the_data():
    x = dg.arange(10, dtype=dg.float32).reshape(10, 1)
    y = dg.arange(10, dtype=dg.int64)
    loader = dg.data.DataLoader(dg.data.TensorDataset(x, y), batch_size=4, shuffle=True, seed=5)
    assert len(loader) == 3
    seen = []
    for xb, yb in loader:
        assert xb.shape[0] == yb.shape[0]
        seen += yb.numpy().tolist()
    assert sorted(seen) == list(range(10)) and seen != list(range(10))
    second = [v for _, yb in loader for v in yb.numpy().tolist()]
    assert sorted(second) == list(range(10)) and second != seen


def test_clip_grad_norm(rng):
    m = TwoLayer()
    m(dg.tensor(rng.standard_normal((8, 4)).astype(np.float32))).sum().backward()
    total = dg.optim.clip_grad_norm_(m.parameters(), 0.1)
    assert total.item() > 0.1
    norm = np.sqrt(sum((p.grad.numpy().astype(np.float64) ** 2).sum() for p in m.parameters()))
    assert norm == pytest.approx(0.1, rel=1e-3)
