"""The CPU device's time line from main-thread samples: a spacing the sampler chose is time
measured; a silence far longer than the usual spacing is lost data."""

from gputop.analysis.breakdown import STACK_MAX_GAP_S, stack_max_gap, stack_slices
from gputop.model import Category, Frame, StackSample

T0 = 1_700_000_000.0
FR = (Frame("train", "/home/u/train.py", 10),)


def _at(ts):
    return [StackSample(t, 1, 1, "MainThread", FR, True, True, True, category=Category.OTHER) for t in ts]


def test_samples_the_sampler_spaced_out_cover_their_time():
    # Held back to one stack every 6 s (a saturated host, a slow py-spy): 30 s, all of it covered.
    slow = _at([T0 + 6 * i for i in range(6)])
    assert stack_max_gap(slow) == 18.0
    covered = sum(s.duration for s in stack_slices(slow, T0, T0 + 30))
    assert covered >= 29.9
    # At the usual spacing a 20 s silence is lost data, left out.
    burst = _at([T0 + 0.5 * i for i in range(20)] + [T0 + 30 + 0.5 * i for i in range(20)])
    assert stack_max_gap(burst) == STACK_MAX_GAP_S
    covered = sum(s.duration for s in stack_slices(burst, T0, T0 + 40))
    assert covered < 25
