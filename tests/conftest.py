import pytest
from hypothesis import HealthCheck, settings

from mig_batch.mig.models import all_models

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

MODEL_NAMES = sorted(all_models())


@pytest.fixture(params=MODEL_NAMES)
def model(request):
    return all_models()[request.param]
