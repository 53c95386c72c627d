"""A finished probe log keeps its head and its tail, cut at line ends, and says what it dropped."""

from autotune.measuring import logs


def test_a_small_log_is_left_alone(tmp_path):
    log = tmp_path / "rank-0.log"
    log.write_text("one\ntwo\n")
    assert logs.cap(log, head_bytes=100, tail_bytes=100) == 0
    assert log.read_text() == "one\ntwo\n"


def test_a_chatty_log_keeps_whole_lines_at_both_ends(tmp_path):
    log = tmp_path / "rank-0.log"
    lines = [f"line {i:05d} " + "x" * 40 for i in range(5000)]
    log.write_text("\n".join(lines) + "\n")
    size = log.stat().st_size
    dropped = logs.cap(log, head_bytes=1000, tail_bytes=1000)
    kept = log.read_text().splitlines()
    assert kept[0] == lines[0] and kept[-1] == lines[-1]
    note = [k for k in kept if k.startswith("[autotune:")]
    assert len(note) == 1 and f"{dropped} bytes" in note[0]
    body = [k for k in kept if not k.startswith("[autotune:")]
    assert all(k in lines for k in body)  # no torn line
    assert log.stat().st_size < 2200 and dropped == size - sum(len(k) + 1 for k in body)
