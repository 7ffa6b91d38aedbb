"""Two torch.optim.Adam steps against the closed form of Kingma & Ba's Algorithm 1: the check that
the bug build_index.py plants in the later local nightlies (`--planted-from`) breaks, so a bisect by
date over them has a first bad build to find."""

import torch


def test_adam_steps_match_the_closed_form(cell):
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    grad = torch.tensor([0.5, -0.25, 2.0], dtype=torch.float64)
    lr, beta1, beta2, eps = 0.1, 0.9, 0.999, 1e-8
    optimizer = torch.optim.Adam([param], lr=lr, betas=(beta1, beta2), eps=eps, foreach=False)
    expected = param.detach().clone()
    first = second = torch.zeros_like(grad)
    for step in (1, 2):
        param.grad = grad.clone()
        optimizer.step()
        first = beta1 * first + (1 - beta1) * grad
        second = beta2 * second + (1 - beta2) * grad**2
        unbiased_first, unbiased_second = first / (1 - beta1**step), second / (1 - beta2**step)
        expected = expected - lr * unbiased_first / (unbiased_second.sqrt() + eps)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-12)
