"""startingOffsets / endingOffsets errors lead with what is valid."""
from __future__ import annotations

import pytest
from pulsartx.datasource.offsets import EARLIEST, parse_offsets

from pulsartx.exceptions import InvalidConfiguration


def test_a_misspelled_keyword_leads_with_the_valid_values_and_the_nearest_one():
    """Fails before the fix: 'earlest' was reported as "not valid JSON" first."""
    with pytest.raises(InvalidConfiguration) as err:
        parse_offsets("startingOffsets", "earlest", EARLIEST)
    msg = str(err.value)
    assert msg.startswith("option startingOffsets='earlest' is invalid: did you mean 'earliest'? expected "
                          '"earliest", "latest", or JSON')
    assert "not valid JSON" not in msg


def test_a_word_far_from_any_keyword_gets_the_valid_values_without_a_guess():
    with pytest.raises(InvalidConfiguration) as err:
        parse_offsets("endingOffsets", "tomorrow", EARLIEST)
    assert str(err.value).startswith("option endingOffsets='tomorrow' is invalid: expected \"earliest\"")


def test_broken_json_still_says_where():
    with pytest.raises(InvalidConfiguration, match="not valid JSON"):
        parse_offsets("startingOffsets", '{"v":{"0":1}', EARLIEST)
