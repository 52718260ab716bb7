"""mobo's surrogate of f_pred: a Gaussian process, joint and additive Matern-5/2 (docs/method.md §7)."""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import minimize

__all__ = ['FIT_ITERATIONS', 'REFIT_ITERATIONS', 'GaussianProcess', 'Posterior', 'matern52']

# Optimiser steps for the hyperparameters: the first fit, then each refit, warm-started from the
# last (a batch of mobo moves them little).
FIT_ITERATIONS = 60
REFIT_ITERATIONS = 15


def matern52(r2: np.ndarray, derivative: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Matern-5/2 of squared scaled distances, in place where it can (the fit calls it on every pair
    of points).

    Args:
        r2: squared distances, each feature divided by its lengthscale.
        derivative: also return c(r) = 5/3 (1 + sqrt5 r) exp(-sqrt5 r), the factor of the kernel's
            derivative in a log lengthscale: dk/dlog(l_d) = c(r) (diff_d / l_d)^2.

    Returns:
        k(r), or (k(r), c(r)) with `derivative`.
    """
    r2 = np.maximum(r2, 0.0)
    one = np.sqrt(5.0 * r2)
    e = np.exp(-one)
    one += 1.0
    k = (5.0 / 3.0) * r2
    k += one
    k *= e
    if not derivative:
        return k
    e *= one
    e *= 5.0 / 3.0
    return k, e


class GaussianProcess:
    """A Gaussian process over the surrogate's features, fitted by maximum marginal likelihood with
    analytic gradients (numpy and scipy: no second torch, no new package).

    Its kernel is a Matern-5/2 with a lengthscale per feature over all features (joint) plus the
    mean of one such Matern per group of features (additive; a group is a relation's z, flag and
    extras, `ZSpace.feature_group`), with the same lengthscales, a signal variance each, a constant
    mean and noise. The additive part lets the effects of relations add up: a slight zoom-out seen
    alone and turbidity seen alone predict their union, which the joint kernel alone sees as far
    from both; the fit weighs the two parts by how the answers behave.

    As scikit-learn's `GaussianProcessRegressor`: `fit(X, y)`, then `predict(X, return_std=True)` in
    the units of y (the targets are standardised inside); what the fit learned ends in `_`:
    `theta_` (log lengthscales, log joint signal, log additive signal, log noise, in the standardised
    scale; before the first fit, where the first fit starts), `lengthscales_`, `joint_`, `additive_`,
    `noise_`, `n_optimised_` (fits that optimised the hyperparameters) and the conditioning
    (`X_train_`, `y_mean_`, `y_scale_`, `L_`, `alpha_`).
    """

    def __init__(self, groups: np.ndarray):
        """Args:
        groups: the group of each feature (0, 1, ...); one group for all makes the additive part
            a second joint kernel.
        """
        groups = np.asarray(groups, int)
        n_features = len(groups)
        self.membership = np.eye(int(groups.max()) + 1)[groups]  # (features, groups), 0/1
        self.n_groups = self.membership.shape[1]
        self.bounds = [(np.log(0.03), np.log(20.0))] * n_features + [
            (np.log(0.01), np.log(20.0)),
            (np.log(0.01), np.log(20.0)),
            (np.log(1e-6), np.log(1.0)),
        ]
        self.n_optimised_ = 0
        self.theta_ = np.concatenate(
            [np.full(n_features, np.log(0.5)), [np.log(0.5), np.log(0.5), np.log(1e-2)]]
        )
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = a / self.lengthscales_, b / self.lengthscales_
        # Squared distances per relation by matrix products, not an (n, m, d) array of differences.
        a2, b2 = (a**2) @ self.membership, (b**2) @ self.membership
        k_joint = matern52(a2.sum(1)[:, None] + b2.sum(1)[None, :] - 2.0 * a @ b.T)
        k_add = np.zeros_like(k_joint)
        for g in range(self.n_groups):
            cols = self.membership[:, g] > 0
            cross = a[:, cols] @ b[:, cols].T
            k_add += matern52(a2[:, g][:, None] + b2[:, g][None, :] - 2.0 * cross)
        return self.joint_ * k_joint + self.additive_ / self.n_groups * k_add

    def negative_log_likelihood(
        self, theta: np.ndarray, X: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """The negative log marginal likelihood of standardised targets and its gradient (what the fit
        minimises).

        Args:
            theta: log hyperparameters, as `theta_`.
            X: features, one row a point.
            y: targets, standardised (mean 0, standard deviation 1).

        Returns:
            (value, gradient in theta); (1e10, zeros) where the kernel matrix is not positive definite.
        """
        d = X.shape[1]
        lengths = np.exp(theta[:d])
        joint, additive, noise = np.exp(theta[d]), np.exp(theta[d + 1]) / self.n_groups, np.exp(theta[d + 2])
        n = len(y)
        # Squared differences of every pair, scaled, as (pairs, features): the fit calls this some
        # twenty times a batch, so what does not depend on theta is computed once per fit.
        if self._pairs is None or self._pairs[0] is not X:
            self._pairs = (X, ((X[:, None, :] - X[None, :, :]) ** 2).reshape(n * n, d))
        diff2 = self._pairs[1] / lengths**2
        m_joint, c_joint = matern52(diff2.sum(axis=1), derivative=True)
        m_group, c_group = matern52(diff2 @ self.membership, derivative=True)  # (pairs, groups)
        k_joint, k_add = (joint * m_joint).reshape(n, n), (additive * m_group.sum(axis=1)).reshape(n, n)
        kn = k_joint + k_add + (noise + 1e-8) * np.eye(n)
        try:
            factor = cho_factor(kn, lower=True)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        alpha = cho_solve(factor, y)
        nll = 0.5 * y @ alpha + np.sum(np.log(np.diag(factor[0]))) + 0.5 * n * np.log(2 * np.pi)
        inner = np.outer(alpha, alpha) - cho_solve(factor, np.eye(n))
        grad = np.empty_like(theta)
        # dk/dlog(l_d) = (joint c(r) + additive c(r of d's group)) (diff_d / l_d)^2, summed against
        # inner over pairs: two matrix products over the pairs, not an (n, n, d) array.
        flat = inner.reshape(-1)
        per_group = ((flat[:, None] * c_group).T @ diff2) * self.membership.T  # (groups, d)
        grad[:d] = -0.5 * (joint * (flat * c_joint) @ diff2 + additive * per_group.sum(axis=0))
        grad[d] = -0.5 * np.sum(inner * k_joint)
        grad[d + 1] = -0.5 * np.sum(inner * k_add)
        grad[d + 2] = -0.5 * np.trace(inner) * noise
        return float(nll), grad

    def fit(self, X: np.ndarray, y: np.ndarray, optimise: bool = True) -> GaussianProcess:
        """Condition on points and their targets.

        Args:
            X: features, one row a point.
            y: the targets (f_pred), standardised inside.
            optimise: first fit the hyperparameters, warm-started from the last fit (the first fit
                always does).

        Returns:
            self.
        """
        self.X_train_ = X
        self.y_mean_, self.y_scale_ = float(np.mean(y)), float(np.std(y)) or 1.0
        target = (y - self.y_mean_) / self.y_scale_
        if optimise or not self.n_optimised_:
            found = minimize(
                self.negative_log_likelihood,
                self.theta_,
                args=(X, target),
                jac=True,
                method='L-BFGS-B',
                bounds=self.bounds,
                options={'maxiter': REFIT_ITERATIONS if self.n_optimised_ else FIT_ITERATIONS},
            )
            self.n_optimised_ += 1
            if np.isfinite(found.fun):
                self.theta_ = np.clip(found.x, [b[0] for b in self.bounds], [b[1] for b in self.bounds])
        d = X.shape[1]
        self.lengthscales_ = np.exp(self.theta_[:d])
        self.joint_, self.additive_ = float(np.exp(self.theta_[d])), float(np.exp(self.theta_[d + 1]))
        self.noise_ = float(np.exp(self.theta_[d + 2])) + 1e-8
        k = self._kernel(X, X) + self.noise_ * np.eye(len(X))
        self.L_ = np.linalg.cholesky(k + 1e-10 * np.eye(len(X)))
        self.alpha_ = cho_solve((self.L_, True), target)
        return self

    def posterior(self, X: np.ndarray) -> Posterior:
        """The posterior at points X, jointly: means, deviations and what picking some of them does to
        the others (`Posterior`)."""
        kc = self._kernel(self.X_train_, X)
        v = solve_triangular(self.L_, kc, lower=True)
        # The prior variance of f_pred at any point (standardised) is joint_ + additive_.
        variance = np.maximum(self.joint_ + self.additive_ - np.sum(v**2, axis=0), 1e-12)
        return Posterior(self, X, self.y_mean_ + self.y_scale_ * (kc.T @ self.alpha_), variance, v)

    def predict(self, X: np.ndarray, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The posterior mean at points X in the targets' units and, with `return_std`, the standard
        deviation of an answer there (the noise included: a count model's steps look like noise)."""
        posterior = self.posterior(X)
        return (posterior.mean, posterior.std()) if return_std else posterior.mean


class Posterior:
    """A Gaussian process's posterior at fixed points, for picking a batch among them greedily.

    Each pick is believed at its mean (a kriging believer): the means stay, and the variance of
    every point that covaries with the pick shrinks by what observing it would remove. `mean` is in
    the targets' units; the variances stay in the process's standardised scale, and `std` converts.
    """

    def __init__(
        self, gp: GaussianProcess, X: np.ndarray, mean: np.ndarray, variance: np.ndarray, v: np.ndarray
    ):
        """Made by `GaussianProcess.posterior`; v = L^-1 k(X_train, X), for covariances."""
        self.gp = gp
        self.X = X
        self.mean = mean
        self._variance = variance
        self._v = v
        self._reductions: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.X)

    def std(self, widen: float = 1.0) -> np.ndarray:
        """The standard deviation of an answer at each point (the noise included), in the targets'
        units, times `widen` (an exploring pick sees its uncertainty widened)."""
        return widen * self.gp.y_scale_ * np.sqrt(self._variance + self.gp.noise_)

    def take(self, rows: np.ndarray) -> Posterior:
        """The posterior at the points `rows` only (before any pick)."""
        return Posterior(self.gp, self.X[rows], self.mean[rows], self._variance[rows], self._v[:, rows])

    def believe(self, j: int) -> None:
        """Condition on point j observed at its mean: every point's variance loses its covariance
        with j (given the picks before) squared over j's predictive variance."""
        prior = self.gp._kernel(self.X, self.X[j : j + 1])[:, 0]
        cross = prior - self._v.T @ self._v[:, j]
        cov = cross - sum((u * u[j] for u in self._reductions), start=np.zeros(len(self.X)))
        u = cov / np.sqrt(self._variance[j] + self.gp.noise_)
        self._reductions.append(u)
        self._variance = np.maximum(self._variance - u**2, 1e-12)
