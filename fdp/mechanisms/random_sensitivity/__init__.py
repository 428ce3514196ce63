"""Gaussian mechanisms with a random released sensitivity Z, and the JL mechanism's maths.

Paper: Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat, "Fast and Memory Efficient
Differentially Private-SGD via JL Projections", arXiv:2102.03013v2, Section
"Privacy Analysis".

One step, for the worst-case sample, releases (Z, X) with

    without the sample: X ~ N(0, 1),   with it: X ~ N(Z / sigma, 1),             (1)

where for JL with r projections Z = Z_r = 1 / sqrt(chi2_r / r) (Lemma
"subroutine_privacy"; the clipped Z~ = min(|g|/(sigma C), Z_r/sigma) is replaced
by the larger Z_r/sigma via Lemma "Comparing_Gaussian_coupling"). Because Z is
part of the output and has the same law under both hypotheses, the privacy-loss
distribution of (1) -- of either neighbouring relation, with Poisson subsampling
at rate p inside -- is the Z-mixture of subsampled-Gaussian PLDs with mu = Z/sigma:

    PLD_dir = E_Z[ PLD_dir(subsampled Gaussian; mu = Z/sigma, p) ],               (2)
    delta_dir(eps) = E_Z[ delta_dir(eps; mu = Z/sigma, p) ].

The unsubsampled tradeoff curve is the seed's Lemma:

    alpha(t) = E[Phi(-t sigma/Z - Z/(2 sigma))],  beta(t) = E[Phi(t sigma/Z - Z/(2 sigma))].  (3)

Certified cells (``loss_cells``). Partition the range of Z into cells
z_0 < z_1 < ... < z_K with weights w_j = P(z_j < Z <= z_{j+1}). Define
Z+ = z_{j+1} and Z- = z_j on cell j. Then Z- <= Z <= Z+ pointwise (a coupling),
so by Lemma "Comparing_Gaussian_coupling" (post-processing: the map M there
sends (Z+, N(Z+,1)) to (Z, N(Z,1)) and (Z+, N(0,1)) to (Z, N(0,1)), hence any
mixture of the two -- the subsampled pairs of both directions -- to the
corresponding mixture) the Z+ mechanism *dominates* the true one and the Z-
mechanism is *dominated* by it, in both directions and after any composition.
A discrete law of Z (a ``scipy.stats`` discrete distribution with at most
``laws.MAX_ATOMS`` atoms between its 1e-30 quantiles) needs no cells: it is its own
finite mixture, Z+ = Z- = Z on each atom (the mass beyond the listed atoms goes to
Z+ = inf and Z- = 0), and only the grid separates the bounds. Otherwise the bottom
cell is closed, [z_0, z_1], so that an atom at the lowest point of the support
(and any mass the partition leaves below z_1) keeps its weight.
Both are finite mixtures, whose PLDs (2) are sums of exact subsampled-Gaussian
cells. The components actually used are second order in the cell width
(:mod:`.convexity`): every profile is convex in s = Phi(mu/2), so
``pessimistic=True`` puts each cell on its two ends with the chord's weights
(Edmundson-Madansky; the Z+ coupling is the special case pi = 1) and
``pessimistic=False`` uses one point per cell at the conditional mean of s (Jensen;
Z- is the special case at the lower end). The top cell
of an unbounded Z has z_K = inf: its pessimistic component is the singular pair
(mu = inf): remove -> P-mass p*w at L = +inf and (1-p)*w at L = log(1-p);
add -> P-mass w at L = -log(1-p) (+inf at p = 1). Its optimistic component uses
the finite z_{K-1}; the bottom cell's optimistic component (z_0 = 0) is mu = 0,
a point mass at L = 0. The cells are chosen adaptively (:func:`partition`):
relative width <= ``ETA_REL`` at every mu > 0 (delta_mu(eps) moves on a scale
that is a fixed fraction of mu, small or large; finer where mu is large), plus
bisection of the cells that
dominate sum_j w_j [D(mu_hi) - D(mu_lo)], D(mu) = log(1 + p^2 (e^{mu^2} - 1))
(the Renyi-2 divergence of a subsampled Gaussian, a proxy of each cell's share
of the composed loss), until that sum is <= ``ETA_BULK`` * sum_j w_j D(mu_j).

Heavy tail. P(L > ell) ~ P(Z^2/(2 sigma^2) > ell) decays like ell^{-r/2}; all
Renyi moments are infinite, so ``loss_range`` bounds the tails from the law of Z
itself (see :meth:`RandomSensitivityGaussian.loss_range`), with the upper tail's
budget relaxed ``UPPER_TAIL_FACTOR``-fold so that the range follows the tail only
as far as the answer needs (losses of 1e6 at r = 2, 1e14 at r = 1); the accountant
widens h to fit. Mass beyond the grid goes to +inf in the pessimistic cells (never
dropped), so cutting the range only loosens the upper bound. ``MAX_LOSS`` = 1e15 is
a float sanity bound, not a modelling cap.

Notation: sigma = noise_multiplier, r = jl_projections, p = sampling_rate,
mu = Z/sigma; w_j, z_j as above; t is the log-likelihood-ratio threshold of (3).
"""

from fdp.mechanisms.random_sensitivity.laws import ChiLaw, ScipyLaw, ZLaw
from fdp.mechanisms.random_sensitivity.mechanism import RandomSensitivityBase, RandomSensitivityGaussian
from fdp.mechanisms.random_sensitivity.ranges import MAX_LOSS

__all__ = ["MAX_LOSS", "ChiLaw", "RandomSensitivityBase", "RandomSensitivityGaussian", "ScipyLaw", "ZLaw"]
