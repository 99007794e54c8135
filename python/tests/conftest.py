import pytest

import distribute as ds


@pytest.fixture
def strategy():
    """Two replicas on CPUs, with a collective timeout so that no test can hang."""
    return ds.MirroredStrategy(
        ["CPU:0", "CPU:1"], communication_options=ds.CommunicationOptions(timeout_seconds=30)
    )
