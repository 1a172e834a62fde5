import pytest

from handworld import two_client_data


@pytest.fixture
def two_clients():
    """Client 0 holds x=[1,2], y=0; client 1 holds x=[2,0], y=1 (one sample each)."""
    return two_client_data()
