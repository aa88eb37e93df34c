"""Throughput of dpcurator's noise samplers against numpy and OpenDP, all measured in one run.

Run it from the benchmark environment (``scripts/setup-bench`` creates it)::

    .bench-venv/bin/python benchmarks/noise.py [--n 10000000] [--opendp-n 100000]
                                               [--repeats 5] [--json out.json]

Every case is warmed up first (numba compiles the kernels, lookup tables are built), then the
cases are timed round-robin, ``--repeats`` rounds, so that load from other processes falls on all
of them alike; the table reports the median of each case's times. OpenDP is about a hundred
times slower than the rest, so it draws ``--opendp-n`` samples per call instead of ``--n``;
throughputs (samples per second) are what the ratios compare, so the differing n is harmless.

What each row draws, and what the ratios mean, is described in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

import dpcurator
from dpcurator.noise import (
    RandomSource,
    SeededRandom,
    default_source,
    sample_bernoulli,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)

Thunk = Callable[[], Any]
WARM_N = 200_000  # dpcurator and numpy warm-up draws, also used for the sanity check
OPENDP_WARM_N = 1_000


@dataclass
class Case:
    """One timed sampler. ``prepare(n)`` builds inputs outside the timer and returns the call."""

    key: str
    library: str  # dpcurator, numpy, opendp
    sampler: str
    source: str
    n: int
    prepare: Callable[[int], Thunk] | None
    moments: tuple[float, float] | None = None  # expected (mean, variance) for the check
    skipped: str = ""
    check: str = "-"
    times: list[float] = field(default_factory=list)
    thunk: Thunk | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def throughput(self) -> float:
        return self.n / self.median

    @property
    def best_throughput(self) -> float:
        """From the fastest repeat: the least disturbed by other processes."""
        return self.n / min(self.times)

    @property
    def spread(self) -> float:
        """(max - min) / median over the repeats: how much other load disturbed this case."""
        return (max(self.times) - min(self.times)) / self.median


@dataclass(frozen=True)
class Ratio:
    """Throughput of case ``top`` over throughput of case ``bottom``, with an optional target."""

    label: str
    top: str
    bottom: str
    target: float | None = None


# ---------------------------------------------------------------------------------------------
# Expected moments, for a quick check that no case times a broken sampler.


def discrete_laplace_variance(scale: float) -> float:
    """Var of P[Y = y] ∝ exp(-|y| / scale): 2 q / (1 - q)^2 with q = exp(-1 / scale)."""
    q = math.exp(-1.0 / scale)
    return 2.0 * q / (1.0 - q) ** 2


def sanity_check(output: Any, moments: tuple[float, float] | None) -> str:
    """'ok' when the sample mean and variance match; loose enough never to fail by chance.

    The mean may stray 6 standard errors; the variance 5% (about 10 standard errors for
    Laplace tails at ``WARM_N`` draws).
    """
    if moments is None:
        return "-"
    values = np.asarray(output, dtype=np.float64).ravel()
    mean, var = moments
    got_mean, got_var = float(values.mean()), float(values.var())
    ok_mean = abs(got_mean - mean) <= 6.0 * math.sqrt(var / values.size)
    ok_var = abs(got_var / var - 1.0) <= 0.05
    return "ok" if ok_mean and ok_var else f"BAD mean={got_mean:.4g} var={got_var:.4g}"


# ---------------------------------------------------------------------------------------------
# The cases.


def dpcurator_cases(n: int, sources: dict[str, RandomSource], notes: list[str]) -> list[Case]:
    cases: list[Case] = []
    for name, src in sources.items():
        for scale in (1, 100):
            cases.append(Case(
                f"dpc.dlap{scale}.{name}", "dpcurator", f"sample_discrete_laplace(scale={scale})",
                name, n, lambda k, s=scale, r=src: lambda: sample_discrete_laplace(s, k, r),
                (0.0, discrete_laplace_variance(scale))))
        for sigma in (1, 100):
            cases.append(Case(
                f"dpc.dgauss{sigma}.{name}", "dpcurator",
                f"sample_discrete_gaussian(sigma={sigma})", name, n,
                lambda k, s=sigma, r=src: lambda: sample_discrete_gaussian(s, k, r),
                (0.0, float(sigma) ** 2)))
        cases.append(Case(
            f"dpc.bern.{name}", "dpcurator", "sample_bernoulli(0.3)", name, n,
            lambda k, r=src: lambda: sample_bernoulli(0.3, k, r), (0.3, 0.21)))
        cases.append(Case(
            f"dpc.words.{name}", "dpcurator", "source.words (raw 64-bit words)", name, n,
            lambda k, r=src: lambda: r.words(k)))

    # The mechanisms, with the secure default source only (the source costs the same as above).
    from dpcurator.mechanisms.laplace import Laplace

    laplace = Laplace(epsilon=1, sensitivity=1)
    cases.append(Case(
        "dpc.laplace", "dpcurator", "Laplace(epsilon=1, sensitivity=1).release", "secure", n,
        lambda k: _release(laplace, k), (0.0, 2.0)))
    # The discrete Laplace that the mechanism draws, in grid units (scale about 2^40): the
    # difference to the row above is the mechanism's own overhead (checks, rounding, scaling).
    grid_scale = laplace.noise_scale(n) / Fraction(laplace.granularity)
    cases.append(Case(
        "dpc.dlapgrid", "dpcurator",
        f"sample_discrete_laplace(scale=2^{math.log2(grid_scale):.2f}) [Laplace's grid]",
        "secure", n, lambda k: lambda: sample_discrete_laplace(grid_scale, k),
        (0.0, discrete_laplace_variance(float(grid_scale)))))

    gaussian_label = "Gaussian(rho=0.5, sensitivity=1).release"
    try:
        from dpcurator.mechanisms.gaussian import Gaussian

        gaussian = Gaussian(rho=0.5, sensitivity=1)
    except Exception as exc:  # an unfinished module must not stop the benchmark
        note = f"{gaussian_label} skipped: {type(exc).__name__}: {exc}"
        notes.append(note)
        cases.append(Case("dpc.gaussian", "dpcurator", gaussian_label, "secure", n, None,
                          skipped=note))
    else:
        cases.append(Case("dpc.gaussian", "dpcurator", gaussian_label, "secure", n,
                          lambda k: _release(gaussian, k), (0.0, 1.0)))

    # DP-SGD's noise (dpcurator.learn): the exact discrete Gaussian on the gradient grid, sigma
    # = noise multiplier 1 times 2^40 grid steps, drawn as the optimizer does (one sampler
    # object, a gradient-sized vector per call: 10^5 coordinates).
    dpsgd_label = "WideGaussian(sigma=2^40).sample, 10^5 per call [DP-SGD noise]"
    try:
        from dpcurator.learn._noise import WideGaussian

        wide = WideGaussian(Fraction(1 << 40))
    except Exception as exc:  # an unfinished module must not stop the benchmark
        note = f"{dpsgd_label} skipped: {type(exc).__name__}: {exc}"
        notes.append(note)
        cases.append(Case("dpc.dpsgd", "dpcurator", dpsgd_label, "secure", n, None, skipped=note))
    else:
        cases.append(Case("dpc.dpsgd", "dpcurator", dpsgd_label, "secure", n,
                          lambda k: _vectors(wide, k), (0.0, 1.0)))
    return cases


def _vectors(sampler: Any, n: int, size: int = 100_000) -> Thunk:
    """n draws as gradient-sized calls of ``size``, scaled to unit variance (a float64 copy)."""
    calls, rest = divmod(n, size)
    scale = 2.0**-40

    def draw() -> Any:
        parts = [sampler.sample(size) for _ in range(calls)]
        if rest:
            parts.append(sampler.sample(rest))
        return np.concatenate(parts) * scale

    return draw


def _release(mechanism: Any, n: int) -> Thunk:
    zeros = np.zeros(n)
    return lambda: mechanism.release(zeros)


def numpy_cases(n: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    src = "numpy PCG64 (insecure)"

    def two_sided_geometric(k: int, scale: float) -> Thunk:
        # G1 - G2 for i.i.d. geometric G has P[y] ∝ q^|y|: the discrete Laplace, sampled from
        # floating-point logarithms (inexact), the fastest thing numpy offers for it.
        p = -math.expm1(-1.0 / scale)
        return lambda: rng.geometric(p, k) - rng.geometric(p, k)

    return [
        Case("np.laplace", "numpy", "Generator.laplace(scale=1)", src, n,
             lambda k: lambda: rng.laplace(size=k), (0.0, 2.0)),
        Case("np.normal", "numpy", "Generator.normal(sigma=1)", src, n,
             lambda k: lambda: rng.normal(size=k), (0.0, 1.0)),
        Case("np.geom1", "numpy", "geometric - geometric (scale=1)", src, n,
             lambda k: two_sided_geometric(k, 1.0), (0.0, discrete_laplace_variance(1.0))),
        Case("np.geom100", "numpy", "geometric - geometric (scale=100)", src, n,
             lambda k: two_sided_geometric(k, 100.0), (0.0, discrete_laplace_variance(100.0))),
        Case("np.bern", "numpy", "Generator.random() < 0.3", src, n,
             lambda k: lambda: rng.random(k) < 0.3, (0.3, 0.21)),
        Case("np.words", "numpy", "PCG64.random_raw (raw 64-bit words)", src, n,
             lambda k: lambda: rng.bit_generator.random_raw(k)),
    ]


def opendp_cases(n: int, notes: list[str]) -> list[Case]:
    specs = [  # key, sampler, integer domain?, make_laplace?, scale
        ("odp.dlap1", "make_laplace(int vector, scale=1)", True, True, 1.0),
        ("odp.dlap100", "make_laplace(int vector, scale=100)", True, True, 100.0),
        ("odp.dgauss1", "make_gaussian(int vector, scale=1)", True, False, 1.0),
        ("odp.dgauss100", "make_gaussian(int vector, scale=100)", True, False, 100.0),
        ("odp.laplace", "make_laplace(float vector, scale=1)", False, True, 1.0),
        ("odp.gaussian", "make_gaussian(float vector, scale=1)", False, False, 1.0),
    ]
    try:
        import opendp.prelude as odp
    except ImportError as exc:
        note = (f"OpenDP rows skipped ({exc}): run scripts/setup-bench, then use "
                ".bench-venv/bin/python")
        notes.append(note)
        return [Case(key, "opendp", sampler, "opendp", n, None, skipped=note)
                for key, sampler, *_ in specs]
    odp.enable_features("contrib")

    def prepare(integer: bool, laplace: bool, scale: float) -> Callable[[int], Thunk]:
        def build(k: int) -> Thunk:
            atom = odp.atom_domain(T=int) if integer else odp.atom_domain(T=float, nan=False)
            domain = odp.vector_domain(atom)
            if laplace:
                metric = odp.l1_distance(T=int if integer else float)
                measurement = odp.m.make_laplace(domain, metric, scale=scale)
            else:
                metric = odp.l2_distance(T=int if integer else float)
                measurement = odp.m.make_gaussian(domain, metric, scale=scale)
            data = [0] * k if integer else [0.0] * k  # a Python list: OpenDP's input type
            return lambda: measurement(data)
        return build

    cases = []
    for key, sampler, integer, laplace, scale in specs:
        variance = (discrete_laplace_variance(scale) if integer else 2 * scale**2) if laplace \
            else scale**2
        cases.append(Case(key, "opendp", sampler, "opendp (secure RNG)", n,
                          prepare(integer, laplace, scale), (0.0, variance)))
    return cases


RATIOS = [
    Ratio("dpcurator discrete Laplace s=1 / numpy laplace", "dpc.dlap1.secure", "np.laplace",
          1 / 3),
    Ratio("dpcurator discrete Laplace s=100 / numpy laplace", "dpc.dlap100.secure",
          "np.laplace", 1 / 3),
    Ratio("dpcurator discrete Laplace s=1 / OpenDP discrete Laplace s=1", "dpc.dlap1.secure",
          "odp.dlap1", 10),
    Ratio("dpcurator discrete Laplace s=100 / OpenDP discrete Laplace s=100",
          "dpc.dlap100.secure", "odp.dlap100", 10),
    Ratio("dpcurator discrete Gaussian s=1 / OpenDP discrete Gaussian s=1",
          "dpc.dgauss1.secure", "odp.dgauss1", 5),
    Ratio("dpcurator discrete Gaussian s=100 / OpenDP discrete Gaussian s=100",
          "dpc.dgauss100.secure", "odp.dgauss100", 5),
    Ratio("dpcurator Laplace mechanism / OpenDP float Laplace", "dpc.laplace", "odp.laplace"),
    Ratio("dpcurator Gaussian mechanism / OpenDP float Gaussian", "dpc.gaussian",
          "odp.gaussian"),
    Ratio("dpcurator Laplace mechanism / numpy laplace", "dpc.laplace", "np.laplace"),
    Ratio("dpcurator Gaussian mechanism / numpy normal", "dpc.gaussian", "np.normal"),
    Ratio("dpcurator DP-SGD noise (secure, exact) / numpy normal", "dpc.dpsgd", "np.normal",
          1 / 3),
    Ratio("dpcurator discrete Laplace s=1 / numpy geometric difference", "dpc.dlap1.secure",
          "np.geom1"),
    Ratio("dpcurator Bernoulli / numpy random() < p", "dpc.bern.secure", "np.bern"),
    Ratio("SecureRandom words / numpy PCG64 words", "dpc.words.secure", "np.words"),
    Ratio("dpcurator discrete Laplace s=1: secure / seeded source", "dpc.dlap1.secure",
          "dpc.dlap1.seeded"),
]


# ---------------------------------------------------------------------------------------------
# Running and reporting.


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dpcurator": dpcurator.__version__,
        "numpy": np.__version__,
        "numba": version("numba"),
        "opendp": version("opendp"),
        "load_average_start": os.getloadavg(),
    }


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warm_up(cases: list[Case], notes: list[str]) -> None:
    """Compile, build tables and check moments on a small draw; then prepare the timed call."""
    for case in cases:
        if case.prepare is None:
            continue
        warm_n = OPENDP_WARM_N if case.library == "opendp" else WARM_N
        try:
            output = case.prepare(min(warm_n, case.n))()
            case.check = sanity_check(output, case.moments) if warm_n >= WARM_N else "-"
            case.thunk = case.prepare(case.n)
        except Exception as exc:  # report the case as broken instead of losing the whole run
            case.skipped = f"{case.sampler} failed: {type(exc).__name__}: {exc}"
            notes.append(case.skipped)
            progress(f"  {case.skipped}")


def time_rounds(cases: list[Case], repeats: int) -> None:
    for r in range(repeats):
        started = time.perf_counter()
        for case in cases:
            if case.thunk is None:
                continue
            t0 = time.perf_counter()
            case.thunk()
            case.times.append(time.perf_counter() - t0)
        progress(f"  round {r + 1}/{repeats}: {time.perf_counter() - started:.1f} s")


def ratio_rows(cases: dict[str, Case]) -> list[dict[str, Any]]:
    rows = []
    for ratio in RATIOS:
        top, bottom = cases.get(ratio.top), cases.get(ratio.bottom)
        value = best = None
        if top is not None and bottom is not None and top.times and bottom.times:
            value = top.throughput / bottom.throughput
            best = top.best_throughput / bottom.best_throughput
        if ratio.target is None:
            verdict = ""
        elif value is None:
            verdict = "n/a"
        else:
            verdict = "PASS" if value >= ratio.target else "FAIL"
        rows.append({"ratio": ratio.label, "numerator": ratio.top, "denominator": ratio.bottom,
                     "value": value, "value_best": best, "target": ratio.target,
                     "verdict": verdict})
    return rows


def fmt_rate(rate: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= size:
            return f"{rate / size:.2f} {unit}"
    return f"{rate:.0f}"


def render(cases: list[Case], ratios: list[dict[str, Any]], info: dict[str, Any],
           repeats: int, notes: list[str]) -> str:
    lines = [
        f"machine: {info['cpu']}; {info['cpu_count']} CPUs ({info['cpus_usable']} usable); "
        f"load average {info['load_average_start'][0]:.2f} at start, "
        f"{info['load_average_end'][0]:.2f} at end",
        f"versions: python {info['python']}, dpcurator {info['dpcurator']}, numpy "
        f"{info['numpy']}, numba {info['numba']}, opendp {info['opendp']}",
        f"medians over {repeats} repeats (round-robin, after a warm-up); spread = (max - min) / "
        "median; verdicts use the medians, 'best' uses each case's fastest repeat",
        "",
    ]
    header = (f"{'library':<10} {'sampler':<58} {'source':<22} {'n':>10} {'median s':>9} "
              f"{'samples/s':>10} {'best':>10} {'spread':>6}  check")
    lines += [header, "-" * len(header)]
    for case in cases:
        head = f"{case.library:<10} {case.sampler:<58} {case.source:<22} {case.n:>10}"
        if not case.times:
            lines.append(f"{head}  SKIPPED (see the notes)")
            continue
        lines.append(f"{head} {case.median:>9.4f} {fmt_rate(case.throughput):>10} "
                     f"{fmt_rate(case.best_throughput):>10} {case.spread:>6.0%}  {case.check}")
    lines += ["", f"{'ratio of throughputs':<68} {'median':>8} {'best':>8} {'target':>8}  verdict",
              "-" * 105]
    for row in ratios:
        value, best = (("n/a", "n/a") if row["value"] is None
                       else (f"{row['value']:.3g}x", f"{row['value_best']:.3g}x"))
        target = "" if row["target"] is None else f">= {row['target']:.3g}"
        lines.append(f"{row['ratio']:<68} {value:>8} {best:>8} {target:>8}  {row['verdict']}")
    if notes:
        lines += ["", *(f"note: {note}" for note in notes)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000,
                        help="draws per call for dpcurator and numpy (default 10^7)")
    parser.add_argument("--opendp-n", type=int, default=100_000,
                        help="draws per call for OpenDP, which is much slower (default 10^5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the SeededRandom reference rows and of numpy")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.n < 1 or args.opendp_n < 1 or args.repeats < 1:
        parser.error("--n, --opendp-n and --repeats must be positive")

    info = machine()
    notes: list[str] = []
    sources: dict[str, RandomSource] = {"secure": default_source(),
                                        "seeded": SeededRandom(args.seed)}
    cases = (dpcurator_cases(args.n, sources, notes) + numpy_cases(args.n, args.seed)
             + opendp_cases(args.opendp_n, notes))
    progress(f"warming up {len(cases)} cases ...")
    warm_up(cases, notes)
    progress(f"timing {args.repeats} rounds ...")
    time_rounds(cases, args.repeats)
    info["load_average_end"] = os.getloadavg()

    by_key = {case.key: case for case in cases}
    ratios = ratio_rows(by_key)
    print(render(cases, ratios, info, args.repeats, notes))
    if args.json:
        rows = [{"key": c.key, "library": c.library, "sampler": c.sampler, "source": c.source,
                 "n": c.n, "times_s": c.times,
                 "median_s": c.median if c.times else None,
                 "samples_per_s": c.throughput if c.times else None,
                 "best_samples_per_s": c.best_throughput if c.times else None,
                 "check": c.check, "skipped": c.skipped or None} for c in cases]
        with open(args.json, "w") as f:
            json.dump({"machine": info, "repeats": args.repeats, "rows": rows,
                       "ratios": ratios, "notes": notes}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
