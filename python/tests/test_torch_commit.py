"""The elastic optimizer's in-memory commit (`ringleader.torch._optimizer._Commit`): what it
holds is a copy (never the live tensors), a restore puts optimizer state where torch's own
`load_state_dict` would, and on a CUDA device the commit lives in pinned host memory (that
test says SKIPPED without a GPU; scripts/gpu-visit.sh measures it on one)."""

import pytest

torch = pytest.importorskip("torch")

from ringleader.torch._optimizer import COMMITS_KEPT, _Commit, _restored  # noqa: E402


class _Sampler:
    def state(self) -> tuple[int, int]:
        return (3, 7)


def _model_and_adam(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, device: str) -> None:
    opt.zero_grad()
    x = torch.randn(16, 4, device=device)
    model(x).square().mean().backward()
    opt.step()


def _fill(commit: _Commit, step: int, model: torch.nn.Module,
          opt: torch.optim.Optimizer) -> None:
    params = list(model.parameters())
    commit.fill(step, params + list(model.buffers()), len(params), opt, params, _Sampler(),
                [0.1], 1, None)


def test_a_commit_holds_copies_of_parameters_buffers_and_optimizer_state() -> None:
    model, opt = _model_and_adam("cpu")
    _step(model, opt, "cpu")
    commit = _Commit()
    _fill(commit, 1, model, opt)
    held = commit.as_dict()
    before = [t.clone() for t in held["tensors"]]
    moments = {i: {k: v.clone() for k, v in st.items()} for i, st in held["opt_state"].items()}
    _step(model, opt, "cpu")  # changes parameters, running statistics and Adam's moments
    assert held["step"] == 1 and held["sampler"] == [3, 7]
    for kept, now in zip(held["tensors"], before):
        assert torch.equal(kept, now)
    assert any(not torch.equal(a, b) for a, b in
               zip(held["tensors"], list(model.parameters()) + list(model.buffers())))
    for i, st in held["opt_state"].items():
        for k, v in st.items():
            assert torch.equal(v, moments[i][k]), (i, k)


def test_a_restored_state_value_is_a_copy_where_torch_would_put_it() -> None:
    param = torch.zeros(3)
    step = torch.tensor(5.0)
    moment = torch.ones(3)
    plain: dict[str, object] = {}
    kept_step = _restored(step, param, "step", plain)
    kept_moment = _restored(moment, param, "exp_avg", plain)
    assert torch.equal(kept_step, step) and kept_step.data_ptr() != step.data_ptr()
    assert torch.equal(kept_moment, moment) and kept_moment.data_ptr() != moment.data_ptr()
    assert kept_moment.device == param.device
    assert _restored(0.9, param, "beta", plain) == 0.9


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the pinned-memory commit runs on a GPU visit "
                           "(scripts/gpu-visit.sh, part torch-commit)")
def test_a_cuda_commit_lives_in_pinned_host_memory_and_is_exact() -> None:
    model, opt = _model_and_adam("cuda")
    _step(model, opt, "cuda")
    commits = [_Commit() for _ in range(COMMITS_KEPT)]
    _fill(commits[0], 1, model, opt)
    expected = [t.detach().cpu() for t in list(model.parameters()) + list(model.buffers())]
    commits[0].hold_writes()
    _step(model, opt, "cuda")
    held = commits[0].as_dict()
    for kept, want in zip(held["tensors"], expected):
        assert not kept.is_cuda and kept.is_pinned()
        assert torch.equal(kept, want)
