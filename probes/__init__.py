"""What runs inside (or beside) training processes: the boot runner, knob interception, the meter.

Standard library and torch only; nothing here imports `autotune`.
"""
