"""``trusted_inputs`` turns off only the value-range checks (device->host syncs), only inside the block."""

from __future__ import annotations

import pytest
import torch

from genrec.model.encoders import _check_range
from genrec.validation import checks_on, trusted_inputs


def test_trusted_inputs_skips_range_checks_only_inside() -> None:
    bad = torch.tensor([0, 7])
    with pytest.raises(ValueError, match="values must lie in"):
        _check_range(bad, 5, "codes")
    with trusted_inputs():
        assert not checks_on()
        _check_range(bad, 5, "codes")  # skipped: no sync
        with pytest.raises(TypeError, match="integer"):
            _check_range(bad.float(), 5, "codes")  # dtype checks stay on
    assert checks_on()
    with pytest.raises(ValueError, match="values must lie in"):
        _check_range(bad, 5, "codes")
