"""The solvers of the linear probe: a batched L-BFGS in torch and the scikit-learn reference (DESIGN.md section 7).

The linear probe (:mod:`crsrepro.fit.linear`) fits an l2-regularised logistic regression for every C of
its grid (and, for multi-label data, every label). Its objective follows scikit-learn exactly::

    C * sum_i logloss_i + 0.5 * ||W||^2        (the intercept is not penalised)

and the two backends of :data:`SOLVERS` solve that same problem on standardised features:

``"torch"`` (:func:`solve_torch`, :func:`solve_torch_masked`)
    Every (C, label) problem of one probe, or of every label fraction of a cell-seed (a row mask per
    fraction), as a single full-batch :func:`batched_lbfgs` in float64 on a CPU or a GPU.
``"sklearn"`` (:func:`solve_sklearn`)
    One ``sklearn.linear_model.LogisticRegression`` (lbfgs) per (C, label): the reference.

Both return the same arrays (coefficients, intercepts, iteration counts, convergence flags and
whether the time cap was hit), so the probe picks C the same way whichever solved it. Nothing here
knows about probes: the module imports nothing from them.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression


_EPS = float(np.finfo(np.float64).eps)


def batched_lbfgs(objective, theta, *, max_iter, tol, time_cap_s=None, history_size=10, max_line_search=40):
    """Minimise P independent smooth objectives at once with L-BFGS (one history per problem).

    Each problem keeps its own curvature history, initial scaling and step length, and stops on its
    own when the largest absolute gradient entry falls to ``tol`` (scipy's ``pgtol``, the criterion
    scikit-learn's lbfgs uses). Every objective evaluation is batched over the problems still
    running. The step is found by backtracking on the Armijo condition **[ours: simpler than a strong
    Wolfe search and enough for convex problems]**; a pair that breaks the curvature condition
    ``s'y > eps y'y`` (scipy's test, relative, so that the tiny steps of a strongly regularised problem
    still teach the curvature) is left out of the history.

    Parameters
    ----------
    objective : callable
        ``objective(theta_subset, index) -> (f, g)``: the values ``f`` (p,) and gradients ``g``
        (p, d) of the problems ``index`` (a LongTensor of length p) at ``theta_subset`` (p, d).
    theta : Tensor of shape (P, d)
        The starting points; not modified.
    max_iter : int
        The iteration budget per problem.
    tol : float
        Gradient tolerance (max-norm) for convergence.
    time_cap_s : float or None
        Stop every problem once this much wall time has passed.
    history_size : int, default 10
        Number of stored curvature pairs (scipy's default is 10).
    max_line_search : int, default 40
        Halvings of the step before a problem is given up as stalled.

    Returns
    -------
    theta : Tensor of shape (P, d)
    n_iter : ndarray of shape (P,)
        Iterations used per problem.
    converged : ndarray of shape (P,), bool
    hit_time_cap : bool
        True if the time cap stopped problems that had not converged.
    """
    start = time.perf_counter()
    theta = theta.clone()
    n_problems, dim = theta.shape
    m = history_size
    f, g = objective(theta, torch.arange(n_problems, device=theta.device))
    converged = g.abs().amax(dim=1) <= tol
    n_iter = torch.zeros(n_problems, dtype=torch.long, device=theta.device)
    hit_time_cap = False
    # The state of the running problems only, compacted whenever some stop (rarely), so that an iteration
    # reads its history through views instead of gathering it: the same arithmetic, problem by problem.
    active = (~converged).nonzero().squeeze(1)
    theta_a, f_a, g_a = theta[active], f[active], g[active]
    S = theta.new_zeros(m, len(active), dim)
    Y = theta.new_zeros(m, len(active), dim)
    rho = theta.new_zeros(m, len(active))
    gamma = theta.new_ones(len(active))
    has_pair = torch.zeros(len(active), dtype=torch.bool, device=theta.device)
    for it in range(max_iter):
        if active.numel() == 0:
            break
        if time_cap_s is not None and time.perf_counter() - start > time_cap_s:
            hit_time_cap = True
            break
        # two-loop recursion: direction = -H g, newest pair first (each product goes into one buffer, then in place:
        # the arithmetic of `direction - alpha * Y`, without a new (P, d) tensor per operation)
        direction, product = -g_a, torch.empty_like(g_a)
        alphas = []
        for j in range(min(it, m)):
            slot = (it - 1 - j) % m
            alpha = rho[slot] * torch.mul(S[slot], direction, out=product).sum(1)
            direction -= torch.mul(alpha[:, None], Y[slot], out=product)
            alphas.append((slot, alpha))
        direction *= gamma[:, None]
        for slot, alpha in reversed(alphas):
            beta = rho[slot] * torch.mul(Y[slot], direction, out=product).sum(1)
            direction += torch.mul(S[slot], (alpha - beta)[:, None], out=product)
        slope = (g_a * direction).sum(1)
        uphill = slope >= 0
        direction[uphill] = -g_a[uphill]
        slope = torch.where(uphill, -(g_a * g_a).sum(1), slope)
        # first step of a problem without curvature information: scale as torch.optim.LBFGS does
        step = torch.where(has_pair, torch.ones_like(slope), (1.0 / g_a.abs().sum(1)).clamp(max=1.0))
        # backtracking line search on the Armijo condition, batched over the pending problems
        # (the first try, where most problems take the full step, evaluates them all without gathering)
        f_try, g_try = objective(theta_a + step[:, None] * direction, active)
        accepted = f_try <= f_a + 1e-4 * step * slope
        f_new, g_new = torch.where(accepted, f_try, f_a), torch.where(accepted[:, None], g_try, g_a)
        step[~accepted] *= 0.5
        for _ in range(max_line_search - 1):
            pending = (~accepted).nonzero().squeeze(1)
            if pending.numel() == 0:
                break
            f_try, g_try = objective(theta_a[pending] + step[pending, None] * direction[pending], active[pending])
            ok = f_try <= f_a[pending] + 1e-4 * step[pending] * slope[pending]
            f_new[pending[ok]], g_new[pending[ok]] = f_try[ok], g_try[ok]
            accepted[pending[ok]] = True
            step[pending[~ok]] *= 0.5
        # the curvature pair of this iteration goes into slot it % m (zero rho: skipped pair)
        slot = it % m
        s = torch.mul(step[:, None] * direction, accepted[:, None], out=S[slot])
        y = torch.mul(g_new - g_a, accepted[:, None], out=Y[slot])
        sy, yy = torch.mul(s, y, out=product).sum(1), torch.mul(y, y, out=product).sum(1)
        good = accepted & (sy > _EPS * yy) & (yy > 0)  # scipy's relative test: tiny steps still count
        rho[slot] = torch.where(good, 1.0 / torch.where(good, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        gamma = torch.where(good, sy / yy.clamp(min=1e-300), gamma)
        has_pair |= good
        theta_a += s
        f_a, g_a = f_new, g_new
        n_iter[active] += 1
        done = g_new.abs().amax(dim=1) <= tol
        running = ~done & accepted  # a failed line search stalls the problem
        if not bool(running.all()):  # write the stopped problems back, keep the running ones
            stopped = ~running
            theta[active[stopped]], converged[active[stopped]] = theta_a[stopped], done[stopped]
            active, theta_a, f_a, g_a = active[running], theta_a[running], f_a[running], g_a[running]
            S, Y, rho = S[:, running], Y[:, running], rho[:, running]
            gamma, has_pair = gamma[running], has_pair[running]
    theta[active] = theta_a  # those still running at the budget or the time cap (not converged)
    return theta, n_iter.cpu().numpy(), converged.cpu().numpy(), hit_time_cap


class _LogisticObjective:
    """The normalised l2 logistic objectives of many problems: ``mean logloss + ||W||^2 / (2 C n)``.

    Dividing scikit-learn's ``C * sum logloss + ||W||^2 / 2`` by ``C n`` changes no minimiser and
    makes the gradient tolerance mean the same as in scikit-learn's lbfgs. ``link="sigmoid"``: each
    problem is one binary logistic regression on one target column (NaN targets masked).
    ``link="softmax"``: each problem is a multinomial regression on integer targets. A problem's
    parameters are flattened as ``(M, D + 1)`` (weights then intercept), M = 1 or K.

    Every problem also has a row mask, ``rows[fraction[p]]``: its loss and ``n`` run over those rows
    only, so problems on nested label subsets share one feature matrix (the masked solve of
    :func:`crsrepro.fit.linear.fit_linear_probes`). A masked row adds exact zeros to the loss and the gradient.
    """

    def __init__(self, Z, targets, *, link, C, rows, fraction, column=None, n_classes=None):
        self.Z, self.link, self.C = Z, link, C
        self.n_features = Z.shape[1]
        mask = rows.to(Z.dtype)[fraction].T  # (N, P): the problem's row subset
        if link == "sigmoid":
            mask = mask * (~torch.isnan(targets)).to(Z.dtype)[:, column]
            self.targets = torch.nan_to_num(targets)
            self.column = column
            self.n_outputs = 1
        else:
            self.classes, self.onehot = targets, torch.nn.functional.one_hot(targets, n_classes).to(Z.dtype)
            self.n_outputs = n_classes
        self.mask, self.n_obs = mask, mask.sum(0)

    def __call__(self, theta, index):
        n, d = self.Z.shape
        p = theta.shape[0]
        params = theta.view(p, self.n_outputs, d + 1)
        W, b = params[..., :d], params[..., d]
        C, mask, n_obs = self.C[index], self.mask[:, index, None], self.n_obs[index]
        z = (self.Z @ W.reshape(p * self.n_outputs, d).T).view(n, p, self.n_outputs) + b
        if self.link == "sigmoid":
            t = self.targets[:, self.column[index], None]
            loss = torch.nn.functional.softplus(z).sub_(t * z).mul_(mask).sum((0, 2))
            residual = torch.sigmoid(z).sub_(t).mul_(mask).div_(n_obs[None, :, None])
        else:  # the target class's logit is picked by index (the same number as z * onehot summed over classes)
            picked = z.gather(2, self.classes[:, None, None].expand(n, p, 1))[..., 0]
            loss = (mask[..., 0] * (torch.logsumexp(z, 2) - picked)).sum(0)
            residual = torch.softmax(z, 2).sub_(self.onehot[:, None, :]).mul_(mask).div_(n_obs[None, :, None])
        f = loss / n_obs + (W * W).sum((1, 2)) / (2 * C * n_obs)
        grad_W = (residual.reshape(n, -1).T @ self.Z).view(p, self.n_outputs, d) + W / (C * n_obs)[:, None, None]
        grad = torch.cat([grad_W, residual.sum(0)[..., None]], dim=2)
        return f, grad.reshape(p, -1)


def _prior_intercepts(y_t, masks, *, link, n_classes):
    """The intercepts of a model with zero weights at its optimum, the log-odds of each problem's class
    frequencies (smoothed by half a case) over its observed labels: the start of every problem, near the
    optimum of a strongly regularised one. Shape (F, n_cols * M)."""
    masks = masks.to(torch.float64)
    if link == "sigmoid":
        weight = masks[:, :, None] * (~torch.isnan(y_t)).to(torch.float64)[None]  # (F, N, cols)
        p = ((weight * torch.nan_to_num(y_t)[None]).sum(1) + 0.5) / (weight.sum(1) + 1.0)
        return torch.log(p / (1 - p))
    counts = masks @ torch.nn.functional.one_hot(y_t, n_classes).to(masks.dtype) + 0.5   # (F, K)
    log_p = torch.log(counts / counts.sum(1, keepdim=True))
    return log_p - log_p.mean(1, keepdim=True)


def solve_torch_masked(Z, targets, row_masks, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device,
                       init=None):
    """Fit every (row mask, C, column) problem as one :func:`batched_lbfgs`.

    ``row_masks`` is a bool array (F, N): problem (f, c, j) fits column j at C ``c_grid[c]`` on the
    rows of mask f. Every problem starts from zero weights and the intercepts of its class frequencies
    (the optimum as C -> 0, :func:`_prior_intercepts`) **[ours]**, or, with ``init = (coef, intercept)``
    of the returned shapes, from its own entry there (the folds of a cross-validated C choice start
    from the probe's own solution). Returns ``coef (F, nC, M, D)``, ``intercept (F, nC, M)``, ``n_iter
    (F, nC, n_cols)``, ``converged (F, nC, n_cols)`` and whether the time cap was hit.
    """
    device = torch.device(device)
    Z_t = torch.as_tensor(Z, dtype=torch.float64, device=device)
    n_masks, n_c, dim = len(row_masks), len(c_grid), Z.shape[1]
    if link == "sigmoid":
        n_cols = targets.shape[1]
        y_t = torch.as_tensor(targets, dtype=torch.float64, device=device)
    else:
        n_cols = 1
        y_t = torch.as_tensor(targets, dtype=torch.long, device=device)
    masks = torch.as_tensor(row_masks, device=device)
    # problem index = (mask, C index, column), column fastest
    fraction = torch.arange(n_masks, device=device).repeat_interleave(n_c * n_cols)
    column = torch.arange(n_cols, device=device).repeat(n_masks * n_c)
    C = torch.as_tensor(np.tile(np.repeat(c_grid, n_cols), n_masks), dtype=torch.float64, device=device)
    objective = _LogisticObjective(Z_t, y_t, link=link, C=C, rows=masks, fraction=fraction,
                                   column=column if link == "sigmoid" else None, n_classes=n_classes)
    n_out = objective.n_outputs
    if init is not None:
        theta0 = torch.as_tensor(np.concatenate([init[0], init[1][..., None]], axis=-1), dtype=torch.float64,
                                 device=device).reshape(n_masks * n_c * n_cols, n_out * (dim + 1))
    else:
        theta0 = Z_t.new_zeros(n_masks, n_c, n_cols, n_out, dim + 1)
        theta0[..., dim] = _prior_intercepts(y_t, masks, link=link, n_classes=n_classes).view(n_masks, 1, n_cols, n_out)
        theta0 = theta0.view(n_masks * n_c * n_cols, -1)
    theta, n_iter, converged, hit_cap = batched_lbfgs(objective, theta0, max_iter=max_iter, tol=tol,
                                                       time_cap_s=time_cap_s)
    params = theta.view(n_masks, n_c, n_cols * n_out, dim + 1).cpu().numpy()
    return (params[..., :-1], params[..., -1], n_iter.reshape(n_masks, n_c, n_cols),
            converged.reshape(n_masks, n_c, n_cols), hit_cap)


def solve_torch(Z, targets, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device, init=None):
    """Fit every (C, column) problem with :func:`solve_torch_masked` on every row; shapes as in
    :func:`solve_sklearn`, ``init`` as there."""
    init = None if init is None else (init[0][None], init[1][None])
    coef, intercept, n_iter, converged, hit_cap = solve_torch_masked(
        Z, targets, np.ones((1, Z.shape[0]), dtype=bool), link=link, n_classes=n_classes, c_grid=c_grid,
        max_iter=max_iter, tol=tol, time_cap_s=time_cap_s, device=device, init=init)
    return coef[0], intercept[0], n_iter[0], converged[0], hit_cap


def solve_sklearn(Z, targets, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device, init=None):
    """Fit one ``LogisticRegression`` per (C, column); after the first C, start none past the time cap.

    Returns ``coef (nC, M, D)``, ``intercept (nC, M)``, ``n_iter (nC, n_cols)``, ``converged (nC,
    n_cols)`` and whether the cap was hit; C values never reached have NaN coefficients. Each fit starts
    from zero (scikit-learn's own start), so ``init`` is not read.
    """
    del device, init  # the reference backend runs on the CPU, from scikit-learn's own start
    start = time.perf_counter()
    columns = [targets[:, j] for j in range(targets.shape[1])] if link == "sigmoid" else [targets]
    n_out = len(columns) if link == "sigmoid" else n_classes
    coef = np.full((len(c_grid), n_out, Z.shape[1]), np.nan)
    intercept = np.full((len(c_grid), n_out), np.nan)
    n_iter = np.zeros((len(c_grid), len(columns)), dtype=int)
    converged = np.zeros((len(c_grid), len(columns)), dtype=bool)
    for c_index, C in enumerate(c_grid):
        if c_index > 0 and time_cap_s is not None and time.perf_counter() - start > time_cap_s:
            return coef, intercept, n_iter, converged, True
        for j, column in enumerate(columns):
            seen = ~np.isnan(column) if link == "sigmoid" else slice(None)
            model = LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, tol=tol)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model.fit(Z[seen], column[seen].astype(int))
            rows = slice(j, j + 1) if link == "sigmoid" else slice(None)
            coef[c_index, rows], intercept[c_index, rows] = model.coef_, model.intercept_
            n_iter[c_index, j] = int(model.n_iter_.max())
            converged[c_index, j] = n_iter[c_index, j] < max_iter
    return coef, intercept, n_iter, converged, False


#: The solve of each probe backend (:data:`crsrepro.core.vocab.PROBE_BACKENDS`), by name.
SOLVERS = {"torch": solve_torch, "sklearn": solve_sklearn}
