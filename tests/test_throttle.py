from gputop.analysis import throttle
from gputop.analysis.throttle import (
    decode_throttle,
    is_performance_limiting,
    is_power_limited,
    is_thermal_limited,
    throttle_label,
)


def test_bits_match_nvml_constants():
    pynvml = __import__("pytest").importorskip("pynvml")
    pairs = {
        "GpuIdle": throttle.GPU_IDLE,
        "ApplicationsClocksSetting": throttle.APPLICATIONS_CLOCKS_SETTING,
        "SwPowerCap": throttle.SW_POWER_CAP,
        "HwSlowdown": throttle.HW_SLOWDOWN,
        "SyncBoost": throttle.SYNC_BOOST,
        "SwThermalSlowdown": throttle.SW_THERMAL_SLOWDOWN,
        "HwThermalSlowdown": throttle.HW_THERMAL_SLOWDOWN,
        "HwPowerBrakeSlowdown": throttle.HW_POWER_BRAKE_SLOWDOWN,
        "DisplayClockSetting": throttle.DISPLAY_CLOCK_SETTING,
    }
    for name, bit in pairs.items():
        assert getattr(pynvml, "nvmlClocksThrottleReason" + name) == bit, name
        event = getattr(pynvml, "nvmlClocksEventReason" + name, None)
        if event is not None:
            assert event == bit, name
    for name, bit in {"BoardLimit": throttle.BOARD_LIMIT, "Reliability": throttle.RELIABILITY}.items():
        value = getattr(pynvml, "nvmlClocksThrottleReason" + name, None)
        if value is not None:
            assert value == bit, name


def test_power_cap_as_on_the_h100_run():
    # The measured H100 under a matmul loop reported 0x4 throughout.
    assert decode_throttle(0x4) == ["power cap"]
    assert is_performance_limiting(0x4)
    assert is_power_limited(0x4)
    assert not is_thermal_limited(0x4)
    assert throttle_label(0x4) == "pwr"


def test_idle_left_out_unless_asked():
    assert decode_throttle(0x1) == []
    assert decode_throttle(0x1, include_idle=True) == ["gpu idle"]
    assert throttle_label(0x1) == ""
    assert throttle_label(0x1, include_idle=True) == "idle"
    assert not is_performance_limiting(0x1)


def test_none_and_zero():
    for mask in (None, 0):
        assert decode_throttle(mask) == []
        assert throttle_label(mask) == ""
        assert not is_performance_limiting(mask)


def test_every_known_bit_decodes_and_order_puts_costly_first():
    words = decode_throttle(0x7FF, include_idle=True)
    assert len(words) == 11
    assert words[0] == "power cap"
    assert words[-1] == "gpu idle"
    assert set(words) >= {
        "application clocks setting",
        "hw slowdown",
        "sync boost",
        "sw thermal",
        "hw thermal",
        "hw power brake",
        "display clocks setting",
        "board limit",
        "reliability limit",
    }


def test_thermal_and_hw_slowdown_are_limiting_but_policies_are_not():
    assert is_performance_limiting(throttle.SW_THERMAL_SLOWDOWN)
    assert is_performance_limiting(throttle.HW_THERMAL_SLOWDOWN)
    assert is_performance_limiting(throttle.HW_SLOWDOWN)
    assert is_performance_limiting(throttle.HW_POWER_BRAKE_SLOWDOWN)
    assert is_thermal_limited(throttle.HW_THERMAL_SLOWDOWN)
    for bit in (throttle.SYNC_BOOST, throttle.APPLICATIONS_CLOCKS_SETTING, throttle.DISPLAY_CLOCK_SETTING):
        assert not is_performance_limiting(bit)
    assert is_performance_limiting(throttle.SYNC_BOOST | throttle.SW_POWER_CAP)


def test_limiting_only_filter():
    mask = throttle.SYNC_BOOST | throttle.HW_THERMAL_SLOWDOWN | throttle.GPU_IDLE
    assert decode_throttle(mask, limiting_only=True) == ["hw thermal"]
    assert decode_throttle(mask) == ["hw thermal", "sync boost"]


def test_unknown_bits_are_shown_not_dropped():
    assert decode_throttle(0x1000 | 0x4) == ["power cap", "unknown 0x1000"]
    assert throttle_label(0x1000) == "?"
    assert decode_throttle(0x1000, limiting_only=True) == []


def test_label_separator():
    assert throttle_label(throttle.SW_POWER_CAP | throttle.SW_THERMAL_SLOWDOWN, sep=" ") == "pwr therm"
