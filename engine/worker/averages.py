"""The moving averages of handler time and claim time that size claims ahead (claim_ahead.py)."""

EWMA_WEIGHT = 0.1  # weight of the newest sample in the handler-time and claim-time averages


def ewma(average: float, sample: float) -> float:
    """The moving average with `sample` taken in; the first sample is the average."""
    return sample if not average else average + EWMA_WEIGHT * (sample - average)
