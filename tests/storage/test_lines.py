"""`whole_lines_end`: where the last whole line ends, for any content and any prefix of it."""

import io

from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.storage import lines
from neuron_batch.storage.lines import whole_lines_end


@given(data=st.binary(max_size=300), size=st.integers(0, 300), back=st.integers(1, 8))
def test_it_is_just_past_the_last_newline_of_the_prefix(data, size, back):
    size = min(size, len(data))
    saved, lines._BACK = lines._BACK, back      # (small steps: lines longer than one read)
    try:
        got = whole_lines_end(io.BytesIO(data), size)
    finally:
        lines._BACK = saved
    assert got == data[:size].rfind(b"\n") + 1
