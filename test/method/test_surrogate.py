"""mobo's surrogate (method/surrogate.py): likelihood gradient, additive effects, units, batch belief."""

import copy

import numpy as np

from metavlm_ros.method.surrogate import GaussianProcess


def test_gaussian_process_gradient_is_the_derivative_of_its_likelihood():
    # The analytic gradient the fit follows, against central differences, joint and additive parts.
    rng = np.random.default_rng(0)
    groups = np.array([0, 1, 2, 2, 3])
    x = rng.uniform(-1.0, 1.0, (40, 5))
    y = np.sin(3.0 * x[:, 0]) + x[:, 1] ** 2 + 0.1 * rng.standard_normal(40)
    y = (y - y.mean()) / y.std()
    gp = GaussianProcess(groups)
    theta = gp.theta_ + rng.normal(0.0, 0.3, gp.theta_.shape)
    _, grad = gp.negative_log_likelihood(theta, x, y)
    step = 1e-6
    numeric = [
        (
            gp.negative_log_likelihood(theta + step * e, x, y)[0]
            - gp.negative_log_likelihood(theta - step * e, x, y)[0]
        )
        / (2 * step)
        for e in np.eye(len(theta))
    ]
    assert np.allclose(grad, numeric, rtol=1e-5, atol=1e-6)


def test_gaussian_process_adds_the_effects_of_relations():
    # f is a sum of one steep step per relation. Seen on relations alone and a few unions (what a
    # search's first batches hold), the fit weighs the additive part and predicts fresh unions
    # (root mean square error under 0.05, the answers spread 0.79); the joint kernel alone (every
    # feature one group) cannot add them (error over 0.3).
    rng = np.random.default_rng(0)

    def f(x):
        return np.sum(1.0 / (1.0 + np.exp(-20.0 * (x - 0.5))) - 1.0 / (1.0 + np.exp(10.0)), axis=1)

    alone = np.zeros((60, 4))
    alone[np.arange(60), np.arange(60) % 4] = rng.uniform(0.0, 1.0, 60)
    unions = rng.uniform(0.0, 1.0, (20, 4)) * (rng.random((20, 4)) < 0.5)
    x = np.vstack([alone, unions])
    fresh = rng.uniform(0.0, 1.0, (200, 4)) * (rng.random((200, 4)) < 0.6)

    def error(groups):
        gp = GaussianProcess(groups).fit(x, f(x))
        return float(np.sqrt(np.mean((gp.predict(fresh) - f(fresh)) ** 2))), gp

    additive_error, gp = error(np.arange(4))
    joint_error, _ = error(np.zeros(4, int))
    assert additive_error < 0.05 and gp.additive_ > gp.joint_
    assert joint_error > 0.3


def _data(seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (30, 3))
    return x, np.sin(2.0 * x[:, 0]) + x[:, 1], rng.uniform(-1.0, 1.0, (50, 3))


def test_predict_answers_in_the_targets_units():
    # Targets are standardised inside: answers in other units (3 y + 5) give the same fit, and the
    # mean and deviation come back in those units.
    x, y, points = _data()
    mean, std = GaussianProcess(np.array([0, 1, 1])).fit(x, y).predict(points, return_std=True)
    gp = GaussianProcess(np.array([0, 1, 1])).fit(x, 3.0 * y + 5.0)
    scaled_mean, scaled_std = gp.predict(points, return_std=True)
    assert np.allclose(scaled_mean, 3.0 * mean + 5.0) and np.allclose(scaled_std, 3.0 * std)
    assert np.all(std > 0) and np.array_equal(gp.predict(points), scaled_mean)
    # Near a training point the mean is its answer, to the noise.
    assert np.allclose(gp.predict(x[:5]), 3.0 * y[:5] + 5.0, atol=0.05)


def test_the_posterior_is_what_predict_answers_and_widens_on_demand():
    x, y, points = _data()
    gp = GaussianProcess(np.array([0, 1, 1])).fit(x, y)
    posterior = gp.posterior(points)
    mean, std = gp.predict(points, return_std=True)
    assert np.array_equal(posterior.mean, mean) and np.array_equal(posterior.std(), std)
    assert np.allclose(posterior.std(10.0), 10.0 * std)
    some = posterior.take(np.array([2, 7, 9]))
    assert (
        len(some) == 3
        and np.array_equal(some.mean, mean[[2, 7, 9]])
        and np.array_equal(some.std(), std[[2, 7, 9]])
    )


def test_believing_picks_is_conditioning_on_them_with_the_same_hyperparameters():
    # A batch's picks, believed one by one, lower the others' variance exactly as conditioning on
    # them would (the variance does not depend on the answers, only on where they are).
    x, y, points = _data()
    gp = GaussianProcess(np.array([0, 1, 1])).fit(x, y)
    belief = gp.posterior(points)
    before = belief.std()
    for j in (4, 17, 30):
        belief.believe(j)
    assert np.array_equal(belief.mean, gp.predict(points))  # a believed answer moves no mean
    assert np.all(belief.std() <= before) and np.all(belief.std()[[4, 17, 30]] < before[[4, 17, 30]])
    again = copy.deepcopy(gp).fit(
        np.vstack([x, points[[4, 17, 30]]]), np.concatenate([y, belief.mean[[4, 17, 30]]]), optimise=False
    )

    def latent(std, fitted):
        return (std / fitted.y_scale_) ** 2 - fitted.noise_

    assert np.allclose(
        latent(again.predict(points, return_std=True)[1], again), latent(belief.std(), gp), atol=1e-8
    )
